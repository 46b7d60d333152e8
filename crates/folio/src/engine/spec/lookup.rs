//! Prompt lookup: the draft is what followed the latest earlier occurrence of the
//! n-gram that ends the sequence (its prompt and its output so far), the longest such
//! n-gram first. Code edits, quotes, reformatting and retrieval answers repeat their
//! input in long runs, which this finds in O(1) per token.

use super::ngram_key;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The shortest and longest n-grams matched.
pub const MIN_N: usize = 2;
pub const MAX_N: usize = 5;

/// Keys are already hashes: the map uses them as they are.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// One sequence's n-grams: for each n-gram of `MIN_N..=MAX_N` tokens, the position
/// after its latest occurrence that has a continuation.
pub(crate) struct Lookup {
    next: IdMap<u32>,
    /// Positions whose preceding n-grams are indexed: `1..indexed`.
    indexed: usize,
}

impl Lookup {
    pub fn new() -> Self {
        Self {
            next: IdMap::default(),
            indexed: 1,
        }
    }

    /// Indexes the n-grams that end before each token not yet seen (every position
    /// `i < tokens.len()` continues the n-grams ending at `i - 1`).
    fn update(&mut self, tokens: &[u32]) {
        if tokens.len() < self.indexed {
            // The sequence was cut back (it never is today): start again.
            *self = Self::new();
        }
        for i in self.indexed..tokens.len() {
            for n in MIN_N..=MAX_N.min(i) {
                self.next
                    .insert(ngram_key(n as u64, &tokens[i - n..i]), i as u32);
            }
        }
        self.indexed = tokens.len().max(1);
    }

    /// Up to `k` tokens that followed the latest earlier occurrence of the longest
    /// n-gram ending `tokens`; empty when none occurred.
    pub fn propose(&mut self, tokens: &[u32], k: usize) -> Vec<u32> {
        self.update(tokens);
        let len = tokens.len();
        for n in (MIN_N..=MAX_N.min(len)).rev() {
            let tail = &tokens[len - n..];
            let Some(&p) = self.next.get(&ngram_key(n as u64, tail)) else {
                continue;
            };
            let p = p as usize;
            // A hash collision proposes nothing rather than a wrong guess.
            if p >= n && p < len && &tokens[p - n..p] == tail {
                return tokens[p..(p + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_longest_latest_match() {
        let mut l = Lookup::new();
        // "1 2 3 4 5 ... 1 2 3" → "4 5 6".
        let t = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3];
        assert_eq!(l.propose(&t, 3), vec![4, 5, 6]);
        // The longest n-gram wins over a later shorter one: "7 2 3 8" occurs later,
        // but "1 2 3" matches three tokens.
        let t = [1, 2, 3, 4, 7, 2, 3, 8, 1, 2, 3];
        let mut l = Lookup::new();
        assert_eq!(l.propose(&t, 2), vec![4, 7]);
        // Nothing repeats: nothing proposed.
        let mut l = Lookup::new();
        assert!(l.propose(&[1, 2, 3, 4], 4).is_empty());
        // The draft stops at the end of what is known.
        let mut l = Lookup::new();
        assert_eq!(l.propose(&[5, 6, 7, 5, 6], 8), vec![7, 5, 6]);
    }

    #[test]
    fn grows_with_the_sequence_and_takes_the_latest_occurrence() {
        let mut l = Lookup::new();
        let mut t = vec![1, 2, 3, 10, 4, 1, 2, 3, 20];
        assert!(l.propose(&t, 1).is_empty());
        t.extend([4, 1, 2, 3]);
        // "4 1 2 3" last continued with 20.
        assert_eq!(l.propose(&t, 1), vec![20]);
    }
}
