//! Prompt lookup: the draft is what followed the latest earlier occurrence of the
//! n-gram that ends the sequence (its prompt and its output so far), the longest such
//! n-gram first. Code edits, quotes, reformatting and retrieval answers repeat their
//! input in long runs, which this finds in O(1) per token.
//!
//! A predicted output (given by the caller) comes first: while the output so far is
//! its beginning, the draft is its next tokens; once they part, its n-grams are looked
//! up like the sequence's own.

use super::adapt::Source;
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

/// The n-grams of a token list: for each n-gram of `MIN_N..=MAX_N` tokens, the
/// position after its latest occurrence that has a continuation.
fn index(text: &[u32], from: usize, next: &mut IdMap<u32>) {
    for i in from.max(1)..text.len() {
        for n in MIN_N..=MAX_N.min(i) {
            next.insert(ngram_key(n as u64, &text[i - n..i]), i as u32);
        }
    }
}

/// What followed, in `text`, the longest n-gram ending `tokens` (`next` indexes
/// `text`'s n-grams), and the n-gram's length.
fn find(next: &IdMap<u32>, text: &[u32], tokens: &[u32], k: usize) -> Option<(Vec<u32>, usize)> {
    let len = tokens.len();
    for n in (MIN_N..=MAX_N.min(len)).rev() {
        let tail = &tokens[len - n..];
        let Some(&p) = next.get(&ngram_key(n as u64, tail)) else {
            continue;
        };
        let p = p as usize;
        // A hash collision proposes nothing rather than a wrong guess.
        if p >= n && p < text.len() && &text[p - n..p] == tail {
            return Some((text[p..(p + k).min(text.len())].to_vec(), n));
        }
    }
    None
}

/// The most recent tokens of a sequence that its own index covers: a sample drafting
/// from a 100k-token context indexes its last 8k on its first draft (about 1 ms),
/// not the whole context every turn.
pub const SPAN: usize = 8192;

/// A request's predicted output and its n-gram index, built on first use and shared
/// by the request's samples (`n > 1`).
#[derive(Default)]
pub(crate) struct Prediction {
    pub tokens: Vec<u32>,
    next: std::sync::OnceLock<IdMap<u32>>,
}

impl Prediction {
    pub fn new(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            next: std::sync::OnceLock::new(),
        }
    }

    fn next(&self) -> &IdMap<u32> {
        self.next.get_or_init(|| {
            let mut next = IdMap::default();
            index(&self.tokens, 1, &mut next);
            next
        })
    }
}

/// One sample's drafting sources: its own recent tokens' n-grams, and the request's
/// predicted output.
pub(crate) struct Lookup {
    next: IdMap<u32>,
    /// Positions whose preceding n-grams are indexed: up to `indexed`.
    indexed: usize,
    prediction: std::sync::Arc<Prediction>,
}

impl Lookup {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::with_prediction(Default::default())
    }

    pub fn with_prediction(prediction: std::sync::Arc<Prediction>) -> Self {
        Self {
            next: IdMap::default(),
            indexed: 1,
            prediction,
        }
    }

    pub fn prediction(&self) -> &std::sync::Arc<Prediction> {
        &self.prediction
    }

    /// From the predicted output: its next tokens while the output (`tokens[out_start..]`)
    /// is its beginning, else what followed the longest n-gram ending `tokens` in it.
    fn predicted(&self, tokens: &[u32], out_start: usize, k: usize) -> Option<(Vec<u32>, Source)> {
        let p = &self.prediction.tokens;
        if p.is_empty() {
            return None;
        }
        let out = &tokens[out_start.min(tokens.len())..];
        if out.len() < p.len() && p.starts_with(out) {
            let d = p[out.len()..(out.len() + k).min(p.len())].to_vec();
            return Some((d, Source::Predicted));
        }
        let (d, n) = find(self.prediction.next(), p, tokens, k)?;
        Some((d, Source::PredictedNgram(n)))
    }

    /// Indexes the n-grams that end before each token not yet seen (every position
    /// `i < tokens.len()` continues the n-grams ending at `i - 1`), within the last
    /// [`SPAN`] tokens.
    fn update(&mut self, tokens: &[u32]) {
        if tokens.len() < self.indexed {
            // The sequence was cut back (it never is today): start again.
            self.next.clear();
            self.indexed = 1;
        }
        let from = self.indexed.max(tokens.len().saturating_sub(SPAN));
        index(tokens, from, &mut self.next);
        self.indexed = tokens.len().max(1);
    }

    /// Up to `k` tokens and where they came from: the predicted output, else what
    /// followed the latest earlier occurrence of the longest n-gram ending `tokens`.
    pub fn propose(
        &mut self,
        tokens: &[u32],
        out_start: usize,
        k: usize,
    ) -> Option<(Vec<u32>, Source)> {
        if let Some(d) = self.predicted(tokens, out_start, k) {
            return Some(d);
        }
        self.update(tokens);
        let (d, n) = find(&self.next, tokens, tokens, k)?;
        Some((d, Source::Own(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drafted(l: &mut Lookup, tokens: &[u32], out_start: usize, k: usize) -> Vec<u32> {
        l.propose(tokens, out_start, k)
            .map(|d| d.0)
            .unwrap_or_default()
    }

    #[test]
    fn follows_the_prediction_then_finds_it_again() {
        let mut l = Lookup::with_prediction(std::sync::Arc::new(Prediction::new(vec![
            7, 8, 9, 10, 11, 12, 13,
        ])));
        // Prompt [1, 2], output [7, 8] so far: the prediction's next tokens.
        assert_eq!(drafted(&mut l, &[1, 2, 7, 8], 2, 3), vec![9, 10, 11]);
        assert_eq!(l.propose(&[1, 2, 7, 8], 2, 3).unwrap().1, Source::Predicted);
        // The output left it (5 instead of 10), then came back to "11 12".
        assert_eq!(drafted(&mut l, &[1, 2, 7, 8, 9, 5, 11, 12], 2, 3), vec![13]);
        // Nothing in the prediction fits: the sequence's own n-grams.
        assert_eq!(drafted(&mut l, &[1, 2, 3, 1, 2], 2, 1), vec![3]);
    }

    #[test]
    fn proposes_what_followed_the_longest_latest_match() {
        let mut l = Lookup::new();
        // "1 2 3 4 5 ... 1 2 3" → "4 5 6".
        let t = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3];
        assert_eq!(drafted(&mut l, &t, 0, 3), vec![4, 5, 6]);
        // The longest n-gram wins over a later shorter one: "7 2 3 8" occurs later,
        // but "1 2 3" matches three tokens.
        let t = [1, 2, 3, 4, 7, 2, 3, 8, 1, 2, 3];
        let mut l = Lookup::new();
        assert_eq!(drafted(&mut l, &t, 0, 2), vec![4, 7]);
        assert_eq!(l.propose(&t, 0, 2).unwrap().1, Source::Own(3));
        // Nothing repeats: nothing proposed.
        let mut l = Lookup::new();
        assert!(drafted(&mut l, &[1, 2, 3, 4], 0, 4).is_empty());
        // The draft stops at the end of what is known.
        let mut l = Lookup::new();
        assert_eq!(drafted(&mut l, &[5, 6, 7, 5, 6], 0, 8), vec![7, 5, 6]);
    }

    #[test]
    fn indexes_only_the_last_span_of_a_long_sequence() {
        let mut t: Vec<u32> = (0..3 * SPAN as u32).map(|i| i % 5000 + 10).collect();
        let mut l = Lookup::new();
        t.extend([10, 11]);
        // "10 11" began the sequence and recurs every 5000 tokens; the index keeps
        // the last span's occurrences only.
        assert_eq!(drafted(&mut l, &t, 0, 1), vec![12]);
        assert!(l.next.len() <= 4 * (SPAN + 2), "{} entries", l.next.len());
    }

    #[test]
    fn grows_with_the_sequence_and_takes_the_latest_occurrence() {
        let mut l = Lookup::new();
        let mut t = vec![1, 2, 3, 10, 4, 1, 2, 3, 20];
        assert!(drafted(&mut l, &t, 0, 1).is_empty());
        t.extend([4, 1, 2, 3]);
        // "4 1 2 3" last continued with 20.
        assert_eq!(drafted(&mut l, &t, 0, 1), vec![20]);
    }
}
