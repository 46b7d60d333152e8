//! Byte-level BPE (GPT-2 style): words become bytes, bytes become printable characters,
//! and the merges from the GGUF file join adjacent symbols lowest rank first.
//!
//! Merging is O(n log n) in the word's length: the symbols form a doubly linked list and
//! a min-heap holds every adjacent pair that has a rank, keyed by (rank, position of the
//! left symbol). Entries go stale when a neighbour merges; a popped entry is used only if
//! its pair is still adjacent and still has that rank, so the merge order is exactly the
//! naive one (lowest rank first, leftmost among equals) without rescanning the word after
//! every merge, which made a long run of one character quadratic.
//!
//! Symbols are texts, as in llama.cpp, whose merges join two texts whatever the
//! vocabulary holds: a symbol is a token id, or an extra id (from the vocabulary's size
//! up) for a text the vocabulary lacks: a byte's character with no token, or a merge's
//! part or result that is no token. A byte with no token is such a symbol, not a gap:
//! no merge names it, so it keeps its neighbours apart (`}` `\x14` `$` stays `}` `$`,
//! never `}$`). A word's final symbol with no token becomes the tokens of its single
//! bytes, those that are tokens (the byte character of a missing byte is not ASCII, so
//! the byte disappears).

use super::TokenizerError;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A byte-level BPE vocabulary: the merges over symbols and what symbols emit.
pub struct Bpe {
    merges: Merges,
    /// Each byte's symbol (the token of its character, or an extra symbol).
    byte_syms: Box<[u32; 256]>,
    /// The vocabulary's size: symbols from here on are extra.
    n_tokens: u32,
    /// What extra symbol `n_tokens + i` emits: the tokens of its text's single bytes.
    extra_out: Vec<Vec<u32>>,
}

impl Bpe {
    /// The vocabulary of `n_tokens` tokens (`ids`: each text's id) and `merges`
    /// ("left right", best first; of two equal pairs the first counts).
    pub fn new(
        ids: &HashMap<String, u32>,
        n_tokens: u32,
        merges: &[String],
    ) -> Result<Self, TokenizerError> {
        let mut extra: HashMap<String, u32> = HashMap::new();
        let mut extra_texts: Vec<String> = Vec::new();
        let mut sym = |t: &str| -> Result<u32, TokenizerError> {
            if let Some(&id) = ids.get(t) {
                return Ok(id);
            }
            if let Some(&id) = extra.get(t) {
                return Ok(id);
            }
            // Symbol ids stay below `NONE`, the merge loop's end marker.
            let id = u32::try_from(extra_texts.len())
                .ok()
                .and_then(|k| n_tokens.checked_add(k))
                .filter(|&id| id < NONE)
                .ok_or_else(|| TokenizerError::BadVocab("too many merge symbols".into()))?;
            extra.insert(t.to_string(), id);
            extra_texts.push(t.to_string());
            Ok(id)
        };
        let mut table = HashMap::with_capacity(merges.len());
        // The merged text, built in one buffer (an allocation per merge was most of a
        // large vocabulary's load).
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // The separator is the first space after the first character (a part is
            // never empty).
            let at = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i)
                .ok_or_else(|| TokenizerError::BadVocab(format!("merge {m:?} has no space")))?;
            let (a, b) = (&m[..at], &m[at + 1..]);
            let key = (sym(a)?, sym(b)?);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let merged = sym(&joined)?;
            table.entry(key).or_insert((rank as u32, merged));
        }
        let mut byte_syms = Box::new([0u32; 256]);
        for (slot, c) in byte_syms.iter_mut().zip(byte_to_char()) {
            *slot = sym(c.encode_utf8(&mut [0u8; 4]))?;
        }
        let extra_out = extra_texts
            .iter()
            .map(|t| {
                t.bytes()
                    .filter(u8::is_ascii)
                    .filter_map(|b| ids.get(char::from(b).encode_utf8(&mut [0u8; 4])).copied())
                    .collect()
            })
            .collect();
        Ok(Self {
            merges: Merges::new(table),
            byte_syms,
            n_tokens,
            extra_out,
        })
    }

    /// Appends the tokens of one pre-tokenized `word` to `out`.
    pub fn encode_word(
        &self,
        word: &str,
        syms: &mut Vec<u32>,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        syms.clear();
        syms.extend(word.bytes().map(|b| self.byte_syms[b as usize]));
        self.merges.apply(syms, scratch);
        self.emit(syms, out);
    }

    /// [`Bpe::encode_word`] with the naive merge loop: the tests' reference.
    #[cfg(test)]
    pub fn encode_word_naive(&self, word: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<u32> = word.bytes().map(|b| self.byte_syms[b as usize]).collect();
        self.merges.apply_naive(&mut syms);
        self.emit(&syms, out);
    }

    fn emit(&self, syms: &[u32], out: &mut Vec<u32>) {
        for &s in syms {
            match s.checked_sub(self.n_tokens) {
                None => out.push(s),
                Some(i) => {
                    let toks = &self.extra_out[i as usize];
                    if toks.is_empty() {
                        tracing::debug!(symbol = i, "a symbol with no token is dropped");
                    }
                    out.extend_from_slice(toks);
                }
            }
        }
    }
}

/// GPT-2's reversible map from bytes to printable characters.
pub fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            b as char
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid code point")
        };
    }
    map
}

/// The merge table: (left id, right id) -> (rank, merged id).
pub struct Merges {
    table: HashMap<(u32, u32), (u32, u32)>,
}

/// No symbol: the end of the linked list.
const NONE: u32 = u32::MAX;

/// Buffers reused across the words of one text.
#[derive(Default)]
pub struct Scratch {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// (rank << 32 | left symbol's index), smallest first.
    heap: BinaryHeap<Reverse<u64>>,
}

impl Merges {
    pub fn new(table: HashMap<(u32, u32), (u32, u32)>) -> Self {
        Self { table }
    }

    fn rank(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.table.get(&(a, b)).copied()
    }

    /// Merges `symbols` in place until no adjacent pair has a rank: the lowest rank
    /// first, the leftmost pair among equal ranks.
    ///
    /// Positions are 32-bit: a word of 4 GiB or more (only reachable through
    /// [`super::Tokenizer::encode`], which has no input cap) is left unmerged rather
    /// than panicking.
    pub fn apply(&self, symbols: &mut Vec<u32>, scratch: &mut Scratch) {
        let n = symbols.len();
        if n < 2 {
            return;
        }
        if n >= NONE as usize {
            tracing::warn!(symbols = n, "word too long to merge; left as bytes");
            return;
        }
        let Scratch { prev, next, heap } = scratch;
        prev.clear();
        next.clear();
        prev.extend((0..n as u32).map(|i| i.wrapping_sub(1)));
        next.extend(1..=n as u32);
        next[n - 1] = NONE;
        let key = |rank: u32, left: u32| Reverse(u64::from(rank) << 32 | u64::from(left));
        let mut initial = std::mem::take(heap).into_vec();
        initial.clear();
        initial.extend(
            symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.rank(w[0], w[1]).map(|(r, _)| key(r, i as u32))),
        );
        *heap = BinaryHeap::from(initial);
        while let Some(Reverse(k)) = heap.pop() {
            let (rank, left) = ((k >> 32) as u32, k as u32 as usize);
            // Stale entries are skipped: the pair at `left` must still exist (a symbol
            // merged away has no `next`) and still have this rank. Then it is exactly
            // the pair the naive loop would pick: every current pair is in the heap
            // under its own (rank, position) key, and this key is the smallest.
            let right = next[left];
            if right == NONE {
                continue;
            }
            let merged = match self.rank(symbols[left], symbols[right as usize]) {
                Some((r, merged)) if r == rank => merged,
                _ => continue,
            };
            // Merge: `left` becomes the merged symbol, `right` leaves the list.
            let right = right as usize;
            symbols[left] = merged;
            let after = next[right];
            next[left] = after;
            if after != NONE {
                prev[after as usize] = left as u32;
            }
            next[right] = NONE;
            let before = prev[left];
            if before != NONE {
                if let Some((r, _)) = self.rank(symbols[before as usize], merged) {
                    heap.push(key(r, before));
                }
            }
            if after != NONE {
                if let Some((r, _)) = self.rank(merged, symbols[after as usize]) {
                    heap.push(key(r, left as u32));
                }
            }
        }
        // Compact the survivors, in order.
        let mut out = 0;
        let mut i = 0u32;
        while i != NONE {
            symbols[out] = symbols[i as usize];
            out += 1;
            i = next[i as usize];
        }
        symbols.truncate(out);
    }

    /// The naive merge loop the heap replaced (every merge rescans every pair): the
    /// reference the differential tests hold [`Merges::apply`] to.
    #[cfg(test)]
    pub fn apply_naive(&self, symbols: &mut Vec<u32>) {
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| {
                    self.table
                        .get(&(w[0], w[1]))
                        .map(|&(rank, id)| (rank, i, id))
                })
                .min();
            let Some((_, i, id)) = best else { return };
            symbols[i] = id;
            symbols.remove(i + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_char();
        let mut seen: Vec<char> = m.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 256);
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
    }

    /// A random merge table over `alphabet` base symbols: each merge joins two existing
    /// symbols into a new one, ranks shuffled (so later symbols may merge first).
    fn random_merges(rng: &mut SplitMix64, alphabet: u32, merges: u32) -> Merges {
        let mut ranks: Vec<u32> = (0..merges).collect();
        for i in (1..ranks.len()).rev() {
            ranks.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut table = HashMap::new();
        for (k, &rank) in ranks.iter().enumerate() {
            let n = alphabet + k as u32;
            let pair = (rng.below(n.into()) as u32, rng.below(n.into()) as u32);
            table.entry(pair).or_insert((rank, n));
        }
        Merges::new(table)
    }

    #[test]
    fn heap_merges_equal_the_naive_loop_on_random_tables() {
        let mut rng = SplitMix64(0xb9e);
        let mut scratch = Scratch::default();
        for case in 0..400 {
            let alphabet = 2 + rng.below(4) as u32;
            let merges = 5 + rng.below(60) as u32;
            let m = random_merges(&mut rng, alphabet, merges);
            for _ in 0..10 {
                let len = rng.below(if case % 10 == 0 { 2000 } else { 120 }) as usize;
                let run = rng.below(3) == 0; // one repeated symbol, the quadratic case
                let first = rng.below(alphabet.into()) as u32;
                let word: Vec<u32> = (0..len)
                    .map(|_| {
                        if run {
                            first
                        } else {
                            rng.below(alphabet.into()) as u32
                        }
                    })
                    .collect();
                let (mut fast, mut naive) = (word.clone(), word.clone());
                m.apply(&mut fast, &mut scratch);
                m.apply_naive(&mut naive);
                assert_eq!(fast, naive, "case {case}: {word:?}");
            }
        }
    }
}
