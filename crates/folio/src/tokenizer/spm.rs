//! SentencePiece-style BPE (GGUF `llama` tokenizers): symbols are characters, adjacent
//! pairs whose concatenation is a token merge highest score first (leftmost among equal
//! scores), and characters with no token fall back to `<0xXX>` byte tokens.
//!
//! Merging is O(n log n) in the text's length: the symbols are byte ranges of the text in
//! a doubly linked list, and a max-heap holds every adjacent pair whose concatenation is
//! a token, keyed by (score, leftmost position first). A popped entry is used only if its
//! pair is still adjacent and its concatenation still scores the same, so the merges are
//! exactly those of the naive loop (rescan every pair after every merge), which was
//! quadratic in a long run of one character. Scores compare as floats, except that a NaN
//! score (never in a real vocabulary) ranks as -inf: the naive loop's NaN handling
//! depended on where the pair stood.

use std::collections::{BinaryHeap, HashMap};

/// No symbol: the end of the linked list.
const NONE: u32 = u32::MAX;

/// `score` as an integer with the same order (NaN as -inf, -0 as +0).
fn score_key(score: f32) -> u32 {
    let s = if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score + 0.0
    };
    let b = s.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 1 << 31
    }
}

/// What a byte becomes when its character has no token: `<0xXX>`, else `<unk>`, else
/// nothing.
pub fn byte_fallback(ids: &HashMap<String, u32>) -> Box<[Option<u32>; 256]> {
    let unk = ids.get("<unk>").copied();
    let mut t = Box::new([None; 256]);
    for (b, slot) in t.iter_mut().enumerate() {
        *slot = ids.get(&format!("<0x{b:02X}>")).copied().or(unk);
    }
    t
}

/// Appends the tokens of `text` (spaces already replaced by U+2581) to `out`.
pub fn encode(
    text: &str,
    ids: &HashMap<String, u32>,
    scores: &[f32],
    types: &[i32],
    fallback: &[Option<u32>; 256],
    out: &mut Vec<u32>,
) {
    let mut emit = |piece: &str| match ids.get(piece) {
        Some(&id) if types.get(id as usize) != Some(&super::TYPE_UNKNOWN) => out.push(id),
        _ => out.extend(piece.bytes().filter_map(|b| fallback[b as usize])),
    };
    if text.len() >= NONE as usize {
        // Offsets are 32-bit; only the uncapped `Tokenizer::encode` gets here (4 GiB).
        tracing::warn!(
            bytes = text.len(),
            "text too long to merge; left as characters"
        );
        let mut buf = [0u8; 4];
        text.chars().for_each(|c| emit(c.encode_utf8(&mut buf)));
        return;
    }
    // Symbol i covers text[start[i]..end[i]]; merged-away symbols have next == NONE and
    // are never reached from symbol 0.
    let start: Vec<u32> = text.char_indices().map(|(i, _)| i as u32).collect();
    let n = start.len();
    if n == 0 {
        return;
    }
    let mut end: Vec<u32> = start[1..].to_vec();
    end.push(text.len() as u32);
    let mut prev: Vec<u32> = (0..n as u32).map(|i| i.wrapping_sub(1)).collect();
    let mut next: Vec<u32> = (1..=n as u32).collect();
    next[n - 1] = NONE;
    // The score key of the pair (l, r) if their concatenation is a token.
    let pair = |start: &[u32], end: &[u32], l: u32, r: u32| {
        let s = &text[start[l as usize] as usize..end[r as usize] as usize];
        ids.get(s)
            .map(|&id| score_key(scores.get(id as usize).copied().unwrap_or(0.0)))
    };
    // (score key << 32 | !left): the best score first, then the leftmost.
    let key = |score: u32, left: u32| u64::from(score) << 32 | u64::from(!left);
    let mut heap: BinaryHeap<u64> = (0..n as u32 - 1)
        .filter_map(|l| pair(&start, &end, l, l + 1).map(|s| key(s, l)))
        .collect::<Vec<_>>()
        .into();
    while let Some(k) = heap.pop() {
        let (score, left) = ((k >> 32) as u32, !(k as u32));
        let right = next[left as usize];
        if right == NONE || pair(&start, &end, left, right) != Some(score) {
            continue; // stale: the pair is gone or has changed
        }
        let (l, r) = (left as usize, right as usize);
        end[l] = end[r];
        let after = next[r];
        next[l] = after;
        if after != NONE {
            prev[after as usize] = left;
        }
        next[r] = NONE;
        let before = prev[l];
        if before != NONE {
            if let Some(s) = pair(&start, &end, before, left) {
                heap.push(key(s, before));
            }
        }
        if after != NONE {
            if let Some(s) = pair(&start, &end, left, after) {
                heap.push(key(s, left));
            }
        }
    }
    let mut i = 0u32;
    while i != NONE {
        emit(&text[start[i as usize] as usize..end[i as usize] as usize]);
        i = next[i as usize];
    }
}

/// The naive merge loop [`encode`] replaced (every merge rescans every pair): the
/// reference the differential tests hold it to.
#[cfg(test)]
pub fn encode_naive(
    text: &str,
    ids: &HashMap<String, u32>,
    scores: &[f32],
    types: &[i32],
    out: &mut Vec<u32>,
) {
    let mut syms: Vec<String> = text.chars().map(String::from).collect();
    loop {
        let mut best: Option<(f32, usize, u32)> = None;
        for i in 0..syms.len().saturating_sub(1) {
            let joined = format!("{}{}", syms[i], syms[i + 1]);
            if let Some(&id) = ids.get(&joined) {
                let score = scores.get(id as usize).copied().unwrap_or(0.0);
                if best.is_none_or(|(s, _, _)| score > s) {
                    best = Some((score, i, id));
                }
            }
        }
        let Some((_, i, _)) = best else { break };
        let right = syms.remove(i + 1);
        syms[i].push_str(&right);
    }
    for s in syms {
        match ids.get(&s) {
            Some(&id) if types.get(id as usize) != Some(&super::TYPE_UNKNOWN) => out.push(id),
            _ => {
                for b in s.bytes() {
                    if let Some(&id) = ids.get(&format!("<0x{b:02X}>")) {
                        out.push(id);
                    } else if let Some(&unk) = ids.get("<unk>") {
                        out.push(unk);
                    }
                }
            }
        }
    }
}

/// The byte a `<0xXX>` token stands for.
pub fn byte_token_value(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::score_key;

    #[test]
    fn score_key_orders_like_the_floats() {
        let xs = [
            f32::NEG_INFINITY,
            -1e30,
            -2.5,
            -1e-40,
            0.0,
            1e-40,
            0.5,
            3.0,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(score_key(w[0]) < score_key(w[1]), "{} < {}", w[0], w[1]);
        }
        assert_eq!(score_key(-0.0), score_key(0.0));
        assert_eq!(score_key(f32::NAN), score_key(f32::NEG_INFINITY));
    }
}
