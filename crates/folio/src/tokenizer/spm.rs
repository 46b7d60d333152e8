//! SentencePiece-style BPE (GGUF `llama` tokenizers): symbols are characters, adjacent
//! pairs whose concatenation is a token merge highest score first, and characters with
//! no token fall back to `<0xXX>` byte tokens.

use std::collections::HashMap;

/// Appends the tokens of `text` (spaces already replaced by U+2581) to `out`.
pub fn encode(
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
