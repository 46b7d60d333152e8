//! The server's recent outputs, per cache salt: a bounded n-gram index from which a
//! sample whose own tokens offer no guess drafts what earlier answers said after the
//! same n-gram (templated replies, repeated tool calls, answers asked again). Only
//! samples under the same salt learn from each other, as they share cache pages.

use super::lookup::IdMap;
use super::ngram_key;
use std::collections::VecDeque;

/// Shortest n-gram matched across samples (a sample's own tokens use shorter ones:
/// across samples a short match says less).
const MIN_N: usize = 3;
const MAX_N: usize = 5;
/// Most output tokens kept, all salts together; the oldest outputs go first (about
/// 3 index entries of 25 bytes per token: some 10 MB when full).
pub const HISTORY_TOKENS: usize = 1 << 17;
/// The longest output kept whole; a longer one keeps its last part.
const MAX_DOC: usize = 1 << 13;

struct Doc {
    id: u64,
    salt: u64,
    tokens: Vec<u32>,
}

/// Recent outputs and, for each (salt, n-gram), where its latest continuation is.
pub(crate) struct History {
    docs: VecDeque<Doc>,
    /// (salt, n-gram) key → (document id, position after the n-gram).
    next: IdMap<(u64, u32)>,
    tokens: usize,
    next_id: u64,
}

impl History {
    pub fn new() -> Self {
        Self {
            docs: VecDeque::new(),
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
        self.docs.push_back(Doc {
            id,
            salt,
            tokens: output.to_vec(),
        });
        while self.tokens > HISTORY_TOKENS {
            let Some(old) = self.docs.pop_front() else {
                break;
            };
            self.tokens -= old.tokens.len();
            self.forget(&old);
        }
    }

    /// Drops the entries that still point into `doc`.
    fn forget(&mut self, doc: &Doc) {
        let t = &doc.tokens;
        for i in MIN_N..t.len() {
            for n in MIN_N..=MAX_N.min(i) {
                let k = Self::key(doc.salt, &t[i - n..i]);
                if self.next.get(&k).is_some_and(|&(d, _)| d == doc.id) {
                    self.next.remove(&k);
                }
            }
        }
    }

    fn doc(&self, id: u64) -> Option<&Doc> {
        let first = self.docs.front()?.id;
        let d = self.docs.get(id.checked_sub(first)? as usize)?;
        (d.id == id).then_some(d)
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
            let Some(d) = self.doc(id) else { continue };
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
            h.record(2, &other);
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
