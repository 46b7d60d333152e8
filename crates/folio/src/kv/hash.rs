//! Chained content hashes of full pages: `h = H(parent, tokens)`, 128 bits (xxh3-128).
//! The root is a fingerprint of the model and page size (and an optional tenant salt),
//! so equal token prefixes reach equal hashes whatever produced them. A hit is always
//! verified against the page's stored tokens as well, so a collision cannot corrupt
//! output.

/// A page's chained hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub u128);

/// Builds chained page hashes.
pub struct Hasher128;

impl Hasher128 {
    /// The chain root for a model fingerprint, page size and tenant salt.
    pub fn root(model_fingerprint: &[u8], page_size: usize, salt: &[u8]) -> PageHash {
        let mut buf = Vec::with_capacity(model_fingerprint.len() + salt.len() + 16);
        buf.extend_from_slice(b"folio-root");
        buf.extend_from_slice(&(model_fingerprint.len() as u64).to_le_bytes());
        buf.extend_from_slice(model_fingerprint);
        buf.extend_from_slice(&(page_size as u64).to_le_bytes());
        buf.extend_from_slice(salt);
        PageHash(xxhash_rust::xxh3::xxh3_128(&buf))
    }

    /// The hash of a full page of `tokens` following `parent`.
    pub fn page(parent: PageHash, tokens: &[u32]) -> PageHash {
        let mut buf = Vec::with_capacity(16 + 4 * tokens.len());
        buf.extend_from_slice(&parent.0.to_le_bytes());
        for t in tokens {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        PageHash(xxhash_rust::xxh3::xxh3_128(&buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_depend_on_parent_salt_and_tokens() {
        let r = Hasher128::root(b"model", 16, b"");
        let s = Hasher128::root(b"model", 16, b"tenant-a");
        assert_ne!(r, s);
        assert_ne!(Hasher128::root(b"model", 32, b""), r);
        let a = Hasher128::page(r, &[1, 2, 3]);
        assert_eq!(a, Hasher128::page(r, &[1, 2, 3]));
        assert_ne!(a, Hasher128::page(s, &[1, 2, 3]));
        assert_ne!(a, Hasher128::page(r, &[1, 2, 4]));
        assert_ne!(Hasher128::page(a, &[1, 2, 3]), a);
    }
}
