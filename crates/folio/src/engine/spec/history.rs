//! The server's recent outputs, per cache salt: a bounded n-gram index from which a
//! sample whose own tokens offer no guess drafts what earlier answers said after the
//! same n-gram (templated replies, repeated tool calls, answers asked again). Only
//! samples under the same salt learn from each other, as they share cache pages.

use super::lookup::IdMap;
use super::ngram_key;
use std::collections::{HashMap, VecDeque};

/// Shortest n-gram matched across samples (a sample's own tokens use shorter ones:
/// across samples a short match says less).
const MIN_N: usize = 3;
const MAX_N: usize = 5;
/// Most output tokens kept, all salts together (about 3 index entries of 25 bytes per
/// token: some 10 MB when full). Past it, the salt holding the most loses its oldest
/// output: one tenant's traffic never flushes another's history.
pub const HISTORY_TOKENS: usize = 1 << 17;
/// The longest output kept whole; a longer one keeps its last part.
const MAX_DOC: usize = 1 << 13;

struct Doc {
    salt: u64,
    tokens: Vec<u32>,
}

/// Recent outputs and, for each (salt, n-gram), where its latest continuation is.
pub(crate) struct History {
    docs: HashMap<u64, Doc>,
    /// Each salt's documents, oldest first, and its tokens.
    salts: HashMap<u64, (VecDeque<u64>, usize)>,
    /// (salt, n-gram) key → (document id, position after the n-gram).
    next: IdMap<(u64, u32)>,
    tokens: usize,
    next_id: u64,
}

impl History {
    pub fn new() -> Self {
        Self {
            docs: HashMap::new(),
            salts: HashMap::new(),
            next: IdMap::default(),
            tokens: 0,
            next_id: 0,
        }
    }

    fn key(salt: u64, gram: &[u32]) -> u64 {
        ngram_key(salt ^ ((gram.len() as u64) << 56), gram)
    }

    /// Keeps a finished sample's output under its salt.
    pub fn record(&mut self, salt: u64, output: &[u32]) {
        let output = &output[output.len().saturating_sub(MAX_DOC)..];
        if output.len() <= MIN_N {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        for i in MIN_N..output.len() {
            for n in MIN_N..=MAX_N.min(i) {
                let k = Self::key(salt, &output[i - n..i]);
                self.next.insert(k, (id, i as u32));
            }
        }
        self.tokens += output.len();
        let (ids, held) = self.salts.entry(salt).or_default();
        ids.push_back(id);
        *held += output.len();
        self.docs.insert(
            id,
            Doc {
                salt,
                tokens: output.to_vec(),
            },
        );
        while self.tokens > HISTORY_TOKENS {
            // The salt holding the most gives up its oldest output.
            let Some((&biggest, _)) = self.salts.iter().max_by_key(|(_, (_, held))| *held) else {
                break;
            };
            let (ids, held) = self.salts.get_mut(&biggest).expect("just found");
            let Some(old) = ids
                .pop_front()
                .and_then(|id| self.docs.remove(&id).map(|d| (id, d)))
            else {
                break;
            };
            *held -= old.1.tokens.len();
            if ids.is_empty() {
                self.salts.remove(&biggest);
            }
            self.tokens -= old.1.tokens.len();
            self.forget(old.0, &old.1);
        }
    }

    /// Drops the entries that still point into document `id`.
    fn forget(&mut self, id: u64, doc: &Doc) {
        let t = &doc.tokens;
        for i in MIN_N..t.len() {
            for n in MIN_N..=MAX_N.min(i) {
                let k = Self::key(doc.salt, &t[i - n..i]);
                if self.next.get(&k).is_some_and(|&(d, _)| d == id) {
                    self.next.remove(&k);
                }
            }
        }
    }

    /// Up to `k` tokens that followed the longest n-gram ending `tokens` in a recent
    /// output under `salt`, and the n-gram's length.
    pub fn propose(&self, salt: u64, tokens: &[u32], k: usize) -> Option<(Vec<u32>, usize)> {
        let len = tokens.len();
        for n in (MIN_N..=MAX_N.min(len)).rev() {
            let tail = &tokens[len - n..];
            let Some(&(id, p)) = self.next.get(&Self::key(salt, tail)) else {
                continue;
            };
            let Some(d) = self.docs.get(&id) else {
                continue;
            };
            let p = p as usize;
            if d.salt == salt && p >= n && d.tokens.get(p - n..p) == Some(tail) {
                return Some((d.tokens[p..(p + k).min(d.tokens.len())].to_vec(), n));
            }
        }
        None
    }

    /// Output tokens held.
    #[cfg(test)]
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafted(h: &History, salt: u64, tokens: &[u32], k: usize) -> Vec<u32> {
        h.propose(salt, tokens, k).map(|d| d.0).unwrap_or_default()
    }

    #[test]
    fn drafts_from_earlier_outputs_of_the_same_salt_only() {
        let mut h = History::new();
        h.record(7, &[10, 11, 12, 13, 14, 15]);
        assert_eq!(drafted(&h, 7, &[1, 2, 10, 11, 12], 2), vec![13, 14]);
        // Another tenant learns nothing from salt 7's outputs.
        assert!(drafted(&h, 8, &[1, 2, 10, 11, 12], 2).is_empty());
        // Two tokens are too short a match across samples.
        assert!(drafted(&h, 7, &[1, 11, 12], 2).is_empty());
    }

    #[test]
    fn one_salt_flooding_the_history_evicts_its_own_outputs_first() {
        let mut h = History::new();
        h.record(1, &[1, 2, 3, 4, 5]);
        for i in 0..(2 * HISTORY_TOKENS / MAX_DOC) as u32 {
            let flood: Vec<u32> = (0..MAX_DOC as u32).map(|t| t + 100 + i).collect();
            h.record(2, &flood);
        }
        assert!(h.tokens() <= HISTORY_TOKENS);
        assert_eq!(
            drafted(&h, 1, &[1, 2, 3], 2),
            vec![4, 5],
            "salt 1 kept its output"
        );
    }

    #[test]
    fn stays_within_its_token_bound_and_forgets_the_oldest() {
        let mut h = History::new();
        let doc: Vec<u32> = (0..MAX_DOC as u32).collect();
        for _ in 0..(HISTORY_TOKENS / MAX_DOC + 3) {
            h.record(1, &doc);
        }
        assert!(h.tokens() <= HISTORY_TOKENS);
        // The latest copy still drafts.
        assert_eq!(drafted(&h, 1, &[5, 6, 7], 3), vec![8, 9, 10]);
        let mut h = History::new();
        h.record(1, &[1, 2, 3, 4, 5]);
        for i in 0..(HISTORY_TOKENS / MAX_DOC + 1) as u32 {
            let other: Vec<u32> = (0..MAX_DOC as u32).map(|t| t + 100 + i).collect();
            h.record(1, &other);
        }
        assert!(
            drafted(&h, 1, &[1, 2, 3], 2).is_empty(),
            "the oldest output is gone"
        );
        assert!(
            h.next.len() <= 3 * HISTORY_TOKENS,
            "stale entries are removed"
        );
    }
}
