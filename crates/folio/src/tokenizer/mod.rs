//! The tokenizer, built entirely from GGUF metadata (`tokenizer.ggml.*`): byte-level BPE
//! (`gpt2`) and SentencePiece (`llama`), special tokens, the add-BOS rule, streaming
//! detokenization, and the chat template.
//!
//! Special-token text in the input (such as `<|im_start|>`) becomes the special token,
//! longest match first, as llama.cpp does with `parse_special`.

mod bpe;
mod pretok;
mod spm;
mod template;

pub use bpe::byte_to_char;
pub use template::{ChatTemplate, Message, CHATML};

use crate::error::TokenizerError;
use crate::gguf::{Gguf, Value};
use std::collections::HashMap;

/// GGUF token types.
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_BYTE: i32 = 6;

enum Kind {
    Bpe {
        pre: pretok::PreTokenizer,
        merges: bpe::Merges,
        byte_char: Box<[char; 256]>,
        char_byte: HashMap<char, u8>,
    },
    Spm {
        scores: Vec<f32>,
        add_space_prefix: bool,
    },
}

/// A tokenizer and its vocabulary.
pub struct Tokenizer {
    kind: Kind,
    tokens: Vec<String>,
    types: Vec<i32>,
    ids: HashMap<String, u32>,
    /// Special tokens matched in raw text, longest text first.
    specials: Vec<(String, u32)>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
}

fn strings(v: Option<&Value>, key: &str) -> Result<Vec<String>, TokenizerError> {
    v.and_then(Value::as_array)
        .ok_or_else(|| TokenizerError::BadVocab(format!("{key} is missing or not an array")))?
        .iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| TokenizerError::BadVocab(format!("{key} holds a non-string")))
        })
        .collect()
}

impl Tokenizer {
    /// Builds the tokenizer described by the file's metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self, TokenizerError> {
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let tokens = strings(g.get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(TokenizerError::BadVocab(format!("{n} tokens")));
        }
        let types: Vec<i32> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|v| match *v {
                    Value::I32(t) => t,
                    _ => v.as_u64().map(|t| t as i32).unwrap_or(1),
                })
                .collect(),
            None => vec![1; n],
        };
        if types.len() != n {
            return Err(TokenizerError::BadVocab(format!(
                "{} token types for {n} tokens",
                types.len()
            )));
        }
        let id_key = |k: &str| -> Result<Option<u32>, TokenizerError> {
            match g.get(k).and_then(Value::as_u64) {
                Some(id) if (id as usize) < n => Ok(Some(id as u32)),
                Some(id) => Err(TokenizerError::BadVocab(format!(
                    "{k} = {id} is not a token"
                ))),
                None => Ok(None),
            }
        };
        let bos = id_key("tokenizer.ggml.bos_token_id")?;
        let eos = id_key("tokenizer.ggml.eos_token_id")?;
        let eot = id_key("tokenizer.ggml.eot_token_id")?;
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            ids.entry(t.clone()).or_insert(i as u32);
        }
        let kind = match model.as_str() {
            "gpt2" => {
                let merges = strings(g.get("tokenizer.ggml.merges"), "tokenizer.ggml.merges")?;
                let mut table = HashMap::with_capacity(merges.len());
                for (rank, m) in merges.iter().enumerate() {
                    let (a, b) = m.split_once(' ').ok_or_else(|| {
                        TokenizerError::BadVocab(format!("merge {m:?} has no space"))
                    })?;
                    if let (Some(&ia), Some(&ib), Some(&ic)) =
                        (ids.get(a), ids.get(b), ids.get(&format!("{a}{b}")))
                    {
                        table.entry((ia, ib)).or_insert((rank as u32, ic));
                    }
                }
                let pre_name = g
                    .get("tokenizer.ggml.pre")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let byte_char = Box::new(bpe::byte_to_char());
                let char_byte = byte_char
                    .iter()
                    .enumerate()
                    .map(|(b, &c)| (c, b as u8))
                    .collect();
                Kind::Bpe {
                    pre: pretok::PreTokenizer::for_name(pre_name)?,
                    merges: bpe::Merges::new(table),
                    byte_char,
                    char_byte,
                }
            }
            "llama" => {
                let scores = match g.get("tokenizer.ggml.scores").and_then(Value::as_array) {
                    Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
                    None => vec![0.0; n],
                };
                Kind::Spm {
                    scores,
                    add_space_prefix: g
                        .get("tokenizer.ggml.add_space_prefix")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                }
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let default_bos = matches!(kind, Kind::Spm { .. });
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(default_bos);
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (t, &ty))| {
                !t.is_empty() && matches!(ty, TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN)
            })
            .map(|(i, (t, _))| (t.clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        const EOG_TEXTS: [&str; 6] = [
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
        ];
        let mut eog: Vec<u32> = eos.into_iter().chain(eot).collect();
        for (t, id) in &specials {
            if EOG_TEXTS.contains(&t.as_str()) && !eog.contains(id) {
                eog.push(*id);
            }
        }
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Self {
            kind,
            tokens,
            types,
            ids,
            specials,
            bos,
            eos,
            eog,
            add_bos,
            chat_template,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The token's text as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token text, if it is in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Whether generating `id` ends the generation (EOS, EOT and their kin).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether the file asks for a BOS token in front of every prompt.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// The model's chat template, or ChatML when the file has none.
    pub fn chat_template(&self) -> Result<ChatTemplate, TokenizerError> {
        let text = |id: Option<u32>| {
            id.and_then(|i| self.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        ChatTemplate::new(
            self.chat_template.as_deref().unwrap_or(CHATML),
            &text(self.bos),
            &text(self.eos),
        )
    }

    /// Tokenizes `text`. With `add_special`, a BOS goes first when the file says so.
    /// Special-token text is always parsed as the special token.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special && self.adds_bos() {
            out.extend(self.bos);
        }
        let mut prev_special = true;
        for frag in self.partition(text) {
            match frag {
                Fragment::Special(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Raw(s) => {
                    self.encode_raw(s, prev_special, &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    fn partition<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        let mut frags = vec![Fragment::Raw(text)];
        for (sp, id) in &self.specials {
            if !text.contains(sp.as_str()) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Fragment::Raw(mut s) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = s.find(sp.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Raw(&s[..at]));
                    }
                    next.push(Fragment::Special(*id));
                    s = &s[at + sp.len()..];
                }
                if !s.is_empty() {
                    next.push(Fragment::Raw(s));
                }
            }
            frags = next;
        }
        frags
    }

    fn encode_raw(&self, text: &str, prev_special: bool, out: &mut Vec<u32>) {
        match &self.kind {
            Kind::Bpe {
                pre,
                merges,
                byte_char,
                ..
            } => {
                for word in pre.split(text) {
                    let mut syms: Vec<u32> = Vec::with_capacity(word.len());
                    for &b in word.as_bytes() {
                        let c = byte_char[b as usize];
                        let mut buf = [0u8; 4];
                        match self.ids.get(&*c.encode_utf8(&mut buf)) {
                            Some(&id) => syms.push(id),
                            None => tracing::warn!(byte = b, "byte missing from the vocabulary"),
                        }
                    }
                    merges.apply(&mut syms);
                    out.extend(syms);
                }
            }
            Kind::Spm {
                scores,
                add_space_prefix,
            } => {
                let mut s = String::with_capacity(text.len() + 3);
                if *add_space_prefix && prev_special {
                    s.push(' ');
                }
                s.push_str(text);
                let s = s.replace(' ', "\u{2581}");
                spm::encode(&s, &self.ids, scores, &self.types, out);
            }
        }
    }

    /// The bytes a token stands for in output text. Control tokens render as nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id, false)
    }

    fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let ty = self.types[id as usize];
        if ty == TYPE_CONTROL {
            return if special {
                t.as_bytes().to_vec()
            } else {
                Vec::new()
            };
        }
        if ty == TYPE_USER_DEFINED {
            return t.as_bytes().to_vec();
        }
        match &self.kind {
            Kind::Bpe { char_byte, .. } => t
                .chars()
                .map(|c| char_byte.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| t.as_bytes().to_vec()),
            Kind::Spm { .. } => {
                if ty == TYPE_BYTE {
                    if let Some(b) = spm::byte_token_value(t) {
                        return vec![b];
                    }
                }
                t.replace('\u{2581}', " ").into_bytes()
            }
        }
    }

    /// Detokenizes `ids` (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.token_bytes(i)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Like [`Tokenizer::decode`], but control tokens render as their text (what a
    /// chat template wrote), so `encode(decode_special(ids))` gives `ids` back.
    pub fn decode_special(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.piece(i, true)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

enum Fragment<'t> {
    Raw(&'t str),
    Special(u32),
}

/// Turns a stream of token ids into text pieces, holding back bytes until they form
/// whole UTF-8 characters.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// The text that `id` completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id));
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) if e.error_len().is_none() => {
                // An incomplete character at the end: emit what is whole, keep the rest.
                let valid = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
                self.pending.drain(..valid);
                s
            }
            Err(_) => {
                let s = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                s
            }
        }
    }

    /// Whatever is still held back (an unfinished character), lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;

    /// A small SentencePiece vocabulary: specials, 256 byte tokens, a few pieces.
    fn spm() -> Tokenizer {
        let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0f32; 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for (piece, score) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("e", -2.0),
            ("l", -2.0),
            ("o", -2.0),
            ("▁h", -3.0),
            ("he", -1.5),
            ("ll", -1.2),
            ("llo", -1.1),
            ("hello", -0.5),
            ("▁hello", -0.1),
        ] {
            tokens.push(piece.into());
            types.push(1);
            scores.push(score);
        }
        let s = |v: &str| Value::String(v.into());
        let mut w = GgufWriter::new();
        w.meta("tokenizer.ggml.model", s("llama"))
            .meta(
                "tokenizer.ggml.tokens",
                Value::Array(tokens.iter().map(|t| s(t)).collect()),
            )
            .meta(
                "tokenizer.ggml.token_type",
                Value::Array(types.into_iter().map(Value::I32).collect()),
            )
            .meta(
                "tokenizer.ggml.scores",
                Value::Array(scores.into_iter().map(Value::F32).collect()),
            )
            .meta("tokenizer.ggml.bos_token_id", Value::U32(1))
            .meta("tokenizer.ggml.eos_token_id", Value::U32(2));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("spm.gguf");
        std::fs::write(&p, w.to_bytes()).unwrap();
        Tokenizer::from_gguf(&Gguf::open(&p).unwrap()).unwrap()
    }

    #[test]
    fn sentencepiece_merges_by_score_and_falls_back_to_bytes() {
        let t = spm();
        let id = |s: &str| t.token_id(s).unwrap();
        // BOS by default for SentencePiece, a space prefix, the best-scoring merges.
        assert_eq!(t.encode("hello", true), vec![1, id("▁hello")]);
        assert_eq!(
            t.encode("hello hello", false),
            vec![id("▁hello"), id("▁hello")]
        );
        // No piece for "é": its UTF-8 bytes.
        assert_eq!(
            t.encode("é", false),
            vec![id("▁"), id("<0xC3>"), id("<0xA9>")]
        );
        assert_eq!(t.decode(&t.encode("hello é", false)), " hello é");
        // Special text is the special token; no space prefix right after it... but the
        // text after a special starts a new fragment.
        assert_eq!(t.encode("<s>hello", false), vec![1, id("▁hello")]);
    }

    #[test]
    fn stream_decoder_holds_back_partial_characters() {
        let t = spm();
        let mut d = StreamDecoder::default();
        assert_eq!(d.push(&t, t.token_id("<0xC3>").unwrap()), "");
        assert_eq!(d.push(&t, t.token_id("<0xA9>").unwrap()), "é");
        assert_eq!(d.push(&t, t.token_id("<0xC3>").unwrap()), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
