//! One page on disk: a self-describing file, checked whole before any of it is used.
//!
//! ```text
//! "FOLIOKV1"                               8 bytes
//! pool root, page hash, parent hash        3 × 16 bytes (u128, little-endian)
//! page size (tokens), dtype code           2 × u32
//! K/V bytes                                u64
//! tokens                                   page size × u32
//! K/V                                      the page's slots, each as KvArena::read_slot gives it
//! checksum                                 u64: xxh3-64 of everything before it
//! ```
//!
//! The pool root names the model, page size and K/V type (`PagedKv`'s chain root), so a
//! file from another model, page size or dtype never matches, even when copied into the
//! wrong directory. The page hash must be the chained hash of the parent and tokens the
//! file holds, and the reader checks both against the prompt it serves: a file can only
//! give a page the prefix index itself would have given.

use super::super::arena::rows_finite;
use super::super::buf::KvDtype;
use super::super::hash::{Hasher128, PageHash};

const MAGIC: &[u8; 8] = b"FOLIOKV1";
/// Bytes before the tokens.
pub(super) const HEADER: usize = 8 + 3 * 16 + 2 * 4 + 8;

/// What every file of one pool must say about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Expect {
    pub root: PageHash,
    pub page_size: usize,
    pub dtype: KvDtype,
    pub page_bytes: usize,
    /// A slot's K (and V) row width in one layer and the head size: where an 8-bit
    /// row's scales lie (`arena::rows_finite`).
    pub row_shape: (usize, usize),
}

impl Expect {
    /// The exact length of every page file of this pool.
    pub fn file_len(&self) -> u64 {
        (HEADER + 4 * self.page_size + self.page_bytes + 8) as u64
    }
}

/// A page to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PageFile {
    pub hash: PageHash,
    pub parent: PageHash,
    pub tokens: Vec<u32>,
    pub bytes: Vec<u8>,
}

/// A page read back and checked: the file's bytes, kept whole (no copy of the K/V).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PageRead {
    pub hash: PageHash,
    pub parent: PageHash,
    pub tokens: Vec<u32>,
    data: Vec<u8>,
    kv: std::ops::Range<usize>,
}

impl PageRead {
    /// The page's K/V, slot after slot.
    pub fn bytes(&self) -> &[u8] {
        &self.data[self.kv.clone()]
    }
}

/// Why a file was not used (logged with its name; the file is removed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Bad {
    #[error("{got} bytes where a page file of this pool has {want} (cut short or not a page)")]
    Length { got: u64, want: u64 },
    #[error("not a folio page file")]
    Magic,
    #[error("written by another model, page size or K/V type")]
    OtherPool,
    #[error("its checksum does not match: the file is corrupt")]
    Checksum,
    #[error("its hash is not its parent's and tokens' hash")]
    Hash,
    #[error("its K/V holds a value that is not finite")]
    NonFinite,
}

fn u128_at(b: &[u8], at: usize) -> u128 {
    u128::from_le_bytes(b[at..at + 16].try_into().expect("16 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The whole file for one page.
pub(super) fn encode(e: &Expect, page: &PageFile) -> Vec<u8> {
    debug_assert_eq!(page.tokens.len(), e.page_size);
    debug_assert_eq!(page.bytes.len(), e.page_bytes);
    let mut out = Vec::with_capacity(e.file_len() as usize);
    out.extend_from_slice(MAGIC);
    for h in [e.root, page.hash, page.parent] {
        out.extend_from_slice(&h.0.to_le_bytes());
    }
    out.extend_from_slice(&(e.page_size as u32).to_le_bytes());
    out.extend_from_slice(&e.dtype.code().to_le_bytes());
    out.extend_from_slice(&(e.page_bytes as u64).to_le_bytes());
    for t in &page.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&page.bytes);
    let sum = xxhash_rust::xxh3::xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Checks a file's header (its first [`HEADER`] bytes) and length against the pool:
/// the page hash it claims, for the index built at start. The rest is checked on read.
pub(super) fn check_header(e: &Expect, head: &[u8], len: u64) -> Result<PageHash, Bad> {
    if len != e.file_len() || head.len() < HEADER {
        return Err(Bad::Length {
            got: len,
            want: e.file_len(),
        });
    }
    if &head[..8] != MAGIC {
        return Err(Bad::Magic);
    }
    let same_pool = u128_at(head, 8) == e.root.0
        && u32_at(head, 56) as usize == e.page_size
        && u32_at(head, 60) == e.dtype.code()
        && u64_at(head, 64) == e.page_bytes as u64;
    if !same_pool {
        return Err(Bad::OtherPool);
    }
    Ok(PageHash(u128_at(head, 24)))
}

/// A whole file, checked: length, header, checksum, and that its hash chains from its
/// parent and tokens.
pub(super) fn decode(e: &Expect, data: Vec<u8>) -> Result<PageRead, Bad> {
    let hash = check_header(e, &data, data.len() as u64)?;
    let body = data.len() - 8;
    if xxhash_rust::xxh3::xxh3_64(&data[..body]) != u64_at(&data, body) {
        return Err(Bad::Checksum);
    }
    let parent = PageHash(u128_at(&data, 40));
    let tokens: Vec<u32> = data[HEADER..HEADER + 4 * e.page_size]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if Hasher128::page(parent, &tokens) != hash {
        return Err(Bad::Hash);
    }
    let kv = HEADER + 4 * e.page_size..body;
    if !rows_finite(e.dtype, e.row_shape, &data[kv.clone()]) {
        return Err(Bad::NonFinite);
    }
    Ok(PageRead {
        hash,
        parent,
        tokens,
        kv,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Expect {
        Expect {
            root: Hasher128::root(b"model", 4, b""),
            page_size: 4,
            dtype: KvDtype::F32,
            page_bytes: 24,
            row_shape: (4, 2),
        }
    }

    fn page(e: &Expect) -> PageFile {
        let tokens = vec![5, 6, 7, 8];
        PageFile {
            hash: Hasher128::page(e.root, &tokens),
            parent: e.root,
            tokens,
            bytes: (0..e.page_bytes as u8).collect(),
        }
    }

    #[test]
    fn a_page_round_trips_and_every_damage_is_caught() {
        let e = pool();
        let p = page(&e);
        let file = encode(&e, &p);
        assert_eq!(file.len() as u64, e.file_len());
        let back = decode(&e, file.clone()).unwrap();
        assert_eq!(
            (back.hash, back.parent, &back.tokens, back.bytes()),
            (p.hash, p.parent, &p.tokens, &p.bytes[..])
        );
        // Every single flipped byte is caught (header, tokens, K/V or checksum).
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x10;
            assert!(decode(&e, bad).is_err(), "byte {i} flipped");
        }
        // Every truncation, and a byte too many.
        for n in 0..file.len() {
            assert!(matches!(
                decode(&e, file[..n].to_vec()),
                Err(Bad::Length { .. })
            ));
        }
        let mut long = file.clone();
        long.push(0);
        assert!(matches!(decode(&e, long), Err(Bad::Length { .. })));
        // Another model's, page size's or dtype's pool.
        for other in [
            Expect {
                root: Hasher128::root(b"other", 4, b""),
                ..e
            },
            Expect {
                dtype: KvDtype::Q8,
                ..e
            },
        ] {
            assert_eq!(decode(&other, file.clone()), Err(Bad::OtherPool));
        }
        // A consistent file whose hash is not its content's.
        let lie = PageFile {
            hash: PageHash(7),
            ..p
        };
        assert_eq!(decode(&e, encode(&e, &lie)), Err(Bad::Hash));
    }

    /// A file written by another hand passes the checksum (the hostile probe of
    /// 2026-12-08 forged NaN pages): a value that is not finite is refused all the
    /// same, in f32, f16 and 8-bit pages (there in a scale; any byte is a value).
    #[test]
    fn a_page_whose_checksum_holds_but_whose_values_are_not_finite_is_refused() {
        let f32s = pool();
        let f16s = Expect {
            dtype: KvDtype::F16,
            ..f32s
        };
        // 8-bit rows of 4 values and 2 scales: 8 bytes, three to a page.
        let q8s = Expect {
            dtype: KvDtype::Q8,
            ..f32s
        };
        let cases: [(Expect, usize, &[u8]); 5] = [
            (f32s, 4, &f32::NAN.to_le_bytes()),
            (f32s, 20, &f32::INFINITY.to_le_bytes()),
            (f16s, 6, &0x7C00u16.to_le_bytes()),
            (q8s, 8 + 6, &0x7E00u16.to_le_bytes()),
            (q8s, 16 + 4, &0xFC00u16.to_le_bytes()),
        ];
        for (e, at, value) in cases {
            let mut p = page(&e);
            assert!(decode(&e, encode(&e, &p)).is_ok());
            p.bytes[at..at + value.len()].copy_from_slice(value);
            assert_eq!(
                decode(&e, encode(&e, &p)),
                Err(Bad::NonFinite),
                "{e:?} at {at}"
            );
        }
        // 8-bit values are bytes, never refused: only the scales are floats.
        let mut p = page(&q8s);
        p.bytes[0..4].copy_from_slice(&[0x7C, 0xFF, 0x00, 0x7E]);
        assert!(decode(&q8s, encode(&q8s, &p)).is_ok());
    }
}
