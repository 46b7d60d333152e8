//! Pre-tokenizers: how text is split into words before BPE, keyed by the GGUF
//! `tokenizer.ggml.pre` name. Each is a list of regexes applied in turn, as llama.cpp
//! does: every regex splits each piece left by the previous one into its matches and the
//! text between them, so a later regex never sees across an earlier split.

use crate::error::TokenizerError;
use fancy_regex::Regex;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A compiled pre-tokenizer.
pub struct PreTokenizer {
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `name` (`tokenizer.ggml.pre`).
    pub fn for_name(name: &str) -> Result<Self, TokenizerError> {
        let exprs: Vec<&str> = match name {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva" => vec![r"\p{N}", GPT2],
            "llama3" | "llama-bpe" | "llama-v3" | "falcon3" | "pixtral" => vec![LLAMA3],
            "qwen2" | "deepseek-r1-qwen" => vec![QWEN2],
            "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" | "default" | "" => vec![GPT2],
            other => {
                tracing::warn!(pre = other, "unknown pre-tokenizer; using gpt2's");
                vec![GPT2]
            }
        };
        let regexes = exprs
            .into_iter()
            .map(|e| Regex::new(e).map_err(|err| TokenizerError::BadVocab(err.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Self { regexes })
    }

    /// Splits `text` into words.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece).flatten() {
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        next.push(m.as_str());
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm_splits_digits_first() {
        let p = PreTokenizer::for_name("smollm").unwrap();
        assert_eq!(p.split("abc123 def"), vec!["abc", "1", "2", "3", " def"]);
        assert_eq!(p.split("I can't  go"), vec!["I", " can", "'t", " ", " go"]);
        assert_eq!(p.split("a  1"), vec!["a", "  ", "1"]);
    }
}
