//! The tokenizer, built entirely from GGUF metadata (`tokenizer.ggml.*`): byte-level BPE
//! (`gpt2`) and SentencePiece (`llama`), special tokens, the add-BOS rule, streaming
//! detokenization, and the chat template.
//!
//! Faithful to llama.cpp for the families folio runs: Llama 3 (the llama3 pre-tokenizer:
//! a word that is a token is taken whole, BOS by default), Qwen2/2.5/3 (qwen2), Mistral
//! (SentencePiece with byte fallback; tekken for Nemo and Small 3), Gemma 2/3 and Phi-3
//! (SentencePiece; Phi-3's special tokens swallow the whitespace after them), SmolLM2.
//! Token attributes follow llama.cpp's: texts that end a generation (`</s>`, `<|end|>`,
//! ...) are control tokens whatever their stored type; control and unknown tokens
//! render as nothing, unused ones too. Decoding joins the tokens' pieces as llama.cpp's
//! server streams them (`llama_detokenize`'s space clean-up is not applied).
//! `scripts/parity/` holds the differential harness and the fixtures' generators.
//!
//! Special-token text in the input (such as `<|im_start|>`) becomes the special token,
//! longest match first, as llama.cpp does with `parse_special`.
//!
//! Cost: encoding is O(n log n) in the input's length whatever the text (the special
//! partition is O(n) per special token present, the pre-tokenizer regexes scan once,
//! the merges use a heap: see `bpe.rs` and `spm.rs`), and memory is linear in it.
//! [`Tokenizer::try_encode`] refuses input above [`MAX_INPUT_BYTES`] before
//! any work; [`Tokenizer::encode`] has no cap, for callers that trust their text.

mod bpe;
mod pretok;
mod pyjson;
mod spm;
mod strftime;
mod template;
mod unicode_classes;

pub use bpe::byte_to_char;
pub use template::{ChatTemplate, Message, CHATML};

use crate::error::TokenizerError;
use crate::gguf::{Gguf, Value};
use std::collections::HashMap;

/// GGUF token types.
const TYPE_NORMAL: i32 = 1;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;
const TYPE_BYTE: i32 = 6;

/// Token attributes, as llama.cpp derives them from the GGUF types and then adjusts
/// them by token text and model name (a token may be both user-defined and control).
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    /// Whitespace before the token's text in the input belongs to the token.
    pub const LSTRIP: u16 = 1 << 6;
    /// Whitespace after the token's text in the input belongs to the token.
    pub const RSTRIP: u16 = 1 << 7;
}

/// The attributes of a GGUF token type (an undefined type has none).
fn type_attr(ty: i32) -> u16 {
    match ty {
        TYPE_NORMAL => attr::NORMAL,
        TYPE_UNKNOWN => attr::UNKNOWN,
        TYPE_CONTROL => attr::CONTROL,
        TYPE_USER_DEFINED => attr::USER_DEFINED,
        TYPE_UNUSED => attr::UNUSED,
        TYPE_BYTE => attr::BYTE,
        _ => 0,
    }
}

/// Texts that end a generation whatever their stored type: llama.cpp makes each such
/// token a control token (so it renders as nothing and, with special-token parsing
/// off, stays text) and stops on it.
const EOG_TEXTS: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// The fill-in-the-middle tokens, by kind: the GGUF keys that name them (the current
/// one, then a deprecated one), the texts llama.cpp recognizes them by when no key does,
/// and whether the kind ends a generation (pad, repo and file separator do). A token
/// found by its text becomes a control token.
const FIM: [(&[&str], &[&str], bool); 6] = [
    (
        &[
            "tokenizer.ggml.fim_pre_token_id",
            "tokenizer.ggml.prefix_token_id",
        ],
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
            "<PRE>",
            "\u{2581}<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
        false,
    ),
    (
        &[
            "tokenizer.ggml.fim_suf_token_id",
            "tokenizer.ggml.suffix_token_id",
        ],
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
            "<SUF>",
            "\u{2581}<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
        false,
    ),
    (
        &[
            "tokenizer.ggml.fim_mid_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
            "<MID>",
            "\u{2581}<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
        false,
    ),
    (
        &["tokenizer.ggml.fim_pad_token_id"],
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
        true,
    ),
    (
        &["tokenizer.ggml.fim_rep_token_id"],
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
        true,
    ),
    (
        &["tokenizer.ggml.fim_sep_token_id"],
        &["<|file_sep|>"],
        true,
    ),
];

/// Byte-level BPE pre-tokenizers (by `tokenizer.ggml.pre`) under which a word that is
/// itself a token is that token, without merges, and a BOS is added unless the file
/// says otherwise (llama.cpp's `ignore_merges` and `add_bos`).
fn bpe_whole_words(pre: &str) -> bool {
    matches!(
        pre,
        "llama3"
            | "llama-v3"
            | "llama-bpe"
            | "falcon3"
            | "falcon-h1"
            | "pixtral"
            | "midm-2.0"
            | "lfm2"
            | "jina-v5-nano"
            | "tekken"
    )
}

/// C's `isspace`: what llama.cpp strips beside an lstrip/rstrip special token.
fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The most input bytes [`Tokenizer::try_encode`] accepts: 16 MiB. A prompt that fits a
/// context window is far smaller (128k tokens of prose is about 0.5 MiB), so the cap
/// refuses only text that could never run, and it bounds what one request can cost
/// before it is found too long: at the cap, the worst texts (one unbroken run of a
/// character) take seconds and a few hundred MiB (docs/BENCHMARKS.md).
pub const MAX_INPUT_BYTES: usize = 16 << 20;

enum Kind {
    Bpe {
        pre: pretok::PreTokenizer,
        bpe: bpe::Bpe,
        char_byte: HashMap<char, u8>,
        /// A word that is a token is that token, unmerged (llama3, tekken).
        whole_words: Option<Box<[char; 256]>>,
    },
    Spm {
        scores: Vec<f32>,
        add_space_prefix: bool,
        /// The token(s) of a byte with no piece: `<0xXX>`, else `<unk>`.
        fallback: Box<[Option<u32>; 256]>,
    },
}

/// A tokenizer and its vocabulary.
pub struct Tokenizer {
    kind: Kind,
    tokens: Vec<String>,
    types: Vec<i32>,
    /// Each token's `attr` flags.
    attrs: Vec<u16>,
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
        let eom = id_key("tokenizer.ggml.eom_token_id")?;
        // A text twice in the vocabulary means its last id, as in llama.cpp.
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let default_bos;
        let kind = match model.as_str() {
            "gpt2" => {
                let merges = strings(g.get("tokenizer.ggml.merges"), "tokenizer.ggml.merges")?;
                let pre_name = g
                    .get("tokenizer.ggml.pre")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let byte_char = bpe::byte_to_char();
                let char_byte = byte_char
                    .iter()
                    .enumerate()
                    .map(|(b, &c)| (c, b as u8))
                    .collect();
                default_bos = bpe_whole_words(pre_name);
                Kind::Bpe {
                    pre: pretok::PreTokenizer::for_name(pre_name)?,
                    bpe: bpe::Bpe::new(&ids, n as u32, &merges)?,
                    char_byte,
                    whole_words: bpe_whole_words(pre_name).then(|| Box::new(byte_char)),
                }
            }
            "llama" => {
                default_bos = true;
                let scores = match g.get("tokenizer.ggml.scores").and_then(Value::as_array) {
                    Some(a) => a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
                    None => vec![0.0; n],
                };
                Kind::Spm {
                    scores,
                    fallback: spm::byte_fallback(&ids),
                    add_space_prefix: g
                        .get("tokenizer.ggml.add_space_prefix")
                        .and_then(Value::as_bool)
                        .unwrap_or(true),
                }
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(default_bos);
        let mut attrs: Vec<u16> = types.iter().map(|&t| type_attr(t)).collect();
        let mut eog: Vec<u32> = eos.into_iter().chain(eot).chain(eom).collect();
        // Fill-in-the-middle tokens: by key, else by text (then made control tokens).
        for (keys, texts, ends) in FIM {
            let mut id = None;
            for k in keys {
                id = id.or(id_key(k)?);
            }
            if id.is_none() {
                // llama.cpp takes the first it meets in a hash map's order; real
                // vocabularies have one text of each kind, so the lowest id here.
                id = texts.iter().filter_map(|t| ids.get(*t).copied()).min();
                if let Some(i) = id {
                    attrs[i as usize] |= attr::CONTROL;
                }
            }
            if let Some(i) = id.filter(|_| ends) {
                if !eog.contains(&i) {
                    eog.push(i);
                }
            }
        }
        for (i, t) in tokens.iter().enumerate() {
            if EOG_TEXTS.contains(&t.as_str()) {
                attrs[i] |= attr::CONTROL;
                if !eog.contains(&(i as u32)) {
                    eog.push(i as u32);
                }
            }
        }
        let is_special = |a: u16| a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0;
        // Phi-3's special tokens swallow the whitespace after them (llama.cpp sets this
        // by the model's name: its tokenizer.json says so, the GGUF does not).
        let name = g
            .get("general.name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for (a, t) in attrs.iter_mut().zip(&tokens) {
                let keep = matches!(t.as_str(), "<unk>" | "<s>" | "<|endoftext|>");
                if (is_special(*a) || t == "</s>") && !keep {
                    *a |= attr::RSTRIP;
                }
            }
        }
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(&attrs)
            .enumerate()
            .filter(|(_, (t, &a))| !t.is_empty() && is_special(a))
            .map(|(i, (t, _))| (t.clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Self {
            kind,
            tokens,
            types,
            attrs,
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

    /// Every token that ends a generation.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Whether the file asks for a BOS token in front of every prompt.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// The model's chat template, or ChatML when the file has none. When the tokenizer
    /// adds a BOS token, a leading BOS text in a render is removed (see
    /// [`ChatTemplate::dropping_leading_bos`]).
    pub fn chat_template(&self) -> Result<ChatTemplate, TokenizerError> {
        let text = |id: Option<u32>| {
            id.and_then(|i| self.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        Ok(ChatTemplate::new(
            self.chat_template.as_deref().unwrap_or(CHATML),
            &text(self.bos),
            &text(self.eos),
        )?
        .dropping_leading_bos(self.adds_bos()))
    }

    /// Tokenizes `text` if it is at most [`MAX_INPUT_BYTES`] long, checked before any
    /// work: the entry point for text from outside (a served prompt). Otherwise the same
    /// as [`Tokenizer::encode`].
    pub fn try_encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        if text.len() > MAX_INPUT_BYTES {
            return Err(TokenizerError::InputTooLarge {
                bytes: text.len(),
                limit: MAX_INPUT_BYTES,
            });
        }
        Ok(self.encode(text, add_special))
    }

    /// Tokenizes `text`. With `add_special`, a BOS goes first when the file says so.
    /// Special-token text is always parsed as the special token.
    ///
    /// No size cap: time is O(n log n) and memory linear in the text's length, so this
    /// is for text the caller already bounds; [`Tokenizer::try_encode`] is the
    /// capped entry point, with identical output for the text it accepts.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(text, add_special, true, |s, prev_special, out| {
            self.encode_raw(s, prev_special, out)
        })
    }

    /// Like [`Tokenizer::encode`], but the text of control and unknown-typed tokens
    /// (`<|im_start|>`) stays text, as llama.cpp tokenizes with `parse_special` off;
    /// user-defined tokens are still matched whole. For text that must never become
    /// control tokens.
    pub fn encode_literal(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(text, add_special, false, |s, prev_special, out| {
            self.encode_raw(s, prev_special, out)
        })
    }

    /// BOS (when asked and wanted), then each fragment of `text`: a special token as
    /// itself, raw text through `raw(text, after_a_special, out)`. Without
    /// `parse_control`, only user-defined tokens are special.
    fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_control: bool,
        raw: impl Fn(&str, bool, &mut Vec<u32>),
    ) -> Vec<u32> {
        let mut out = Vec::new();
        if add_special && self.adds_bos() {
            out.extend(self.bos);
        }
        let mut prev_special = true;
        for frag in self.partition(text, parse_control) {
            match frag {
                Fragment::Special(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Raw(s) => {
                    raw(s, prev_special, &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    /// Splits `text` at special-token text: each special in turn, longest first, within
    /// the raw fragments the longer ones left. O(n) per special token that occurs (a
    /// substring search each), so O(n · specials) at worst. A token with `LSTRIP` or
    /// `RSTRIP` takes the whitespace (C's `isspace`) before or after it in its fragment.
    fn partition<'t>(&self, text: &'t str, parse_control: bool) -> Vec<Fragment<'t>> {
        // No text, no fragment (so no SentencePiece space prefix either).
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Raw(text)];
        for (sp, id) in &self.specials {
            let a = self.attrs[*id as usize];
            if !parse_control && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
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
                    let mut left = &s[..at];
                    if a & attr::LSTRIP != 0 {
                        left = left.trim_end_matches(|c: char| c.is_ascii() && c_space(c as u8));
                    }
                    if !left.is_empty() {
                        next.push(Fragment::Raw(left));
                    }
                    next.push(Fragment::Special(*id));
                    s = &s[at + sp.len()..];
                    if a & attr::RSTRIP != 0 {
                        s = s.trim_start_matches(|c: char| c.is_ascii() && c_space(c as u8));
                    }
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
                bpe,
                whole_words,
                ..
            } => {
                let mut syms: Vec<u32> = Vec::new();
                let mut scratch = bpe::Scratch::default();
                for word in pre.split(text) {
                    if let Some(id) = self.whole_word(whole_words, word) {
                        out.push(id);
                    } else {
                        bpe.encode_word(word, &mut syms, &mut scratch, out);
                    }
                }
            }
            Kind::Spm {
                scores,
                add_space_prefix,
                fallback,
            } => {
                let s = self.spm_text(text, *add_space_prefix && prev_special);
                spm::encode(&s, &self.ids, scores, &self.types, fallback, out);
            }
        }
    }

    /// The token that `word` is as a whole, when the pre-tokenizer takes whole words
    /// (`byte_char` given) and the vocabulary has one (of any type, as in llama.cpp).
    fn whole_word(&self, byte_char: &Option<Box<[char; 256]>>, word: &str) -> Option<u32> {
        let chars = byte_char.as_deref()?;
        let text: String = word.bytes().map(|b| chars[b as usize]).collect();
        self.ids.get(&text).copied()
    }

    /// SentencePiece's view of a raw fragment: an optional leading space, and every
    /// space as U+2581.
    fn spm_text(&self, text: &str, space_prefix: bool) -> String {
        let mut s = String::with_capacity(text.len() + 3);
        if space_prefix {
            s.push(' ');
        }
        s.push_str(text);
        s.replace(' ', "\u{2581}")
    }

    /// [`Tokenizer::encode`] with the merge loops it had before they became heaps
    /// (quadratic): the reference of the differential tests.
    #[cfg(test)]
    fn encode_naive(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(
            text,
            add_special,
            true,
            |s, prev_special, out| match &self.kind {
                Kind::Bpe {
                    pre,
                    bpe,
                    whole_words,
                    ..
                } => {
                    for word in pre.split(s) {
                        match self.whole_word(whole_words, word) {
                            Some(id) => out.push(id),
                            None => bpe.encode_word_naive(word, out),
                        }
                    }
                }
                Kind::Spm {
                    scores,
                    add_space_prefix,
                    ..
                } => {
                    let s = self.spm_text(s, *add_space_prefix && prev_special);
                    spm::encode_naive(&s, &self.ids, scores, &self.types, out);
                }
            },
        )
    }

    /// The bytes a token stands for in output text. Control tokens render as nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id, false)
    }

    /// A token's bytes as llama.cpp's `llama_token_to_piece` gives them: control and
    /// unknown tokens only with `special`, user-defined ones as their text, normal ones
    /// decoded (byte-level characters, or U+2581 as a space), byte tokens as their
    /// byte, and anything else (unused, undefined) as nothing.
    fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        let Some(t) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let a = self.attrs[id as usize];
        if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return if special {
                t.as_bytes().to_vec()
            } else {
                Vec::new()
            };
        }
        if a & attr::USER_DEFINED != 0 {
            return t.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match &self.kind {
                Kind::Bpe { char_byte, .. } => t
                    .chars()
                    .map(|c| char_byte.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| t.as_bytes().to_vec()),
                Kind::Spm { .. } => t.replace('\u{2581}', " ").into_bytes(),
            };
        }
        if a & attr::BYTE != 0 {
            if let Some(b) = spm::byte_token_value(t) {
                return vec![b];
            }
        }
        Vec::new()
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

/// How many bytes at the end of `bytes` are the start of a character that more bytes
/// could still complete (0 to 3). Invalid sequences before it do not matter: they are
/// U+FFFD whatever follows.
fn unfinished_tail(bytes: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match std::str::from_utf8(&bytes[at..]) {
            Ok(_) => return 0,
            Err(e) => match e.error_len() {
                None => return bytes.len() - at - e.valid_up_to(),
                Some(bad) => at += e.valid_up_to() + bad,
            },
        }
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
    /// The text that `id` completes (possibly empty): every byte so far, invalid UTF-8
    /// as U+FFFD, except an unfinished character at the end, which waits for the bytes
    /// that may complete it. So the pieces always add up to [`Tokenizer::decode`] of
    /// the same ids, and a piece never changes once given.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend(tok.token_bytes(id));
        let keep = unfinished_tail(&self.pending);
        let cut = self.pending.len() - keep;
        let s = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        s
    }

    /// Whatever is still held back (an unfinished character), lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// For the crate's own tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::Tokenizer;
    use crate::gguf::Gguf;

    /// The default model's tokenizer (SmolLM2: byte-level BPE, 49k tokens, the smollm
    /// pre-tokenizer), read once. Like the integration tests, a missing model is a
    /// failure with instructions, never a skip.
    pub fn smollm() -> &'static Tokenizer {
        static T: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
        T.get_or_init(|| {
            let p = std::env::var_os("FOLIO_MODEL")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
                });
            assert!(
                p.exists(),
                "{} is missing: run `scripts/setup.sh` (it fetches the default model)",
                p.display()
            );
            Tokenizer::from_gguf(&Gguf::open(&p).unwrap()).unwrap()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;
    use crate::rng::SplitMix64;

    /// A small SentencePiece vocabulary: specials, 256 byte tokens, a few pieces.
    fn spm() -> Tokenizer {
        let pieces = [
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
        ];
        spm_with(&pieces.map(|(p, s)| (p.to_string(), s, 1)))
    }

    /// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then
    /// `pieces` as (text, score, token type).
    fn spm_with(pieces: &[(String, f32, i32)]) -> Tokenizer {
        spm_named(pieces, "", TYPE_CONTROL)
    }

    /// [`spm_with`] for a model called `name` whose `</s>` has type `eos_type`.
    fn spm_named(pieces: &[(String, f32, i32)], name: &str, eos_type: i32) -> Tokenizer {
        let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, eos_type];
        let mut scores = vec![0.0f32; 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for (piece, score, ty) in pieces {
            tokens.push(piece.clone());
            types.push(*ty);
            scores.push(*score);
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
        if !name.is_empty() {
            w.meta("general.name", s(name));
        }
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
    fn end_of_generation_text_is_a_control_token_and_phi3_specials_take_the_space_after() {
        let pieces = [("▁".to_string(), -1.0, 1), ("a".to_string(), -2.0, 1)];
        for (name, rstrip) in [("Phi3", true), ("phi-3-mini", true), ("Llama", false)] {
            // `</s>` stored as user-defined: llama.cpp makes it control (it ends turns).
            let t = spm_named(&pieces, name, TYPE_USER_DEFINED);
            let (sp, a) = (t.token_id("▁").unwrap(), t.token_id("a").unwrap());
            assert!(t.is_eog(2));
            assert!(t.token_bytes(2).is_empty(), "control: no text");
            assert_eq!(t.decode_special(&[2]), "</s>");
            // The space prefix after a special token, then the spaces left.
            let after = if rstrip {
                vec![sp, a]
            } else {
                vec![sp, sp, sp, a]
            };
            assert_eq!(t.encode("</s> \n a", false)[..1], [2], "{name}");
            assert_eq!(
                t.encode("</s>  a", false),
                [&[2][..], &after[..]].concat(),
                "{name}"
            );
            // <s> never strips; as control text without parsing, </s> stays text.
            assert_eq!(t.encode("<s>  a", false), vec![1, sp, sp, sp, a], "{name}");
            assert!(!t.encode_literal("</s>", false).contains(&2));
        }
        // An empty text is no fragment: not even the space prefix.
        assert_eq!(spm().encode("", false), Vec::<u32>::new());
        assert_eq!(spm().encode("", true), vec![1]);
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

    #[test]
    fn stream_decoder_holds_back_a_partial_character_after_invalid_bytes() {
        let t = spm();
        let id = |b: u8| t.token_id(&format!("<0x{b:02X}>")).unwrap();
        // E4 then 20 C3 in one step: E4 is invalid at once (a space follows), C3 may
        // still become é: only the U+FFFD and the space are final.
        let mut d = StreamDecoder::default();
        assert_eq!(d.push(&t, id(0xE4)), "");
        assert_eq!(d.push(&t, id(0x20)), "\u{FFFD} ");
        let mut d = StreamDecoder::default();
        let ids = [0xE4, 0xFF, 0xC3, 0xA9, 0x80, 0xF0, 0x9F, 0x98, 0x80, 0xE4];
        let pieces: String = ids.iter().map(|&b| d.push(&t, id(b))).collect();
        assert_eq!(
            pieces + &d.finish(),
            t.decode(&ids.map(id)),
            "the pieces add up to the decode"
        );
        assert_eq!(
            t.decode(&ids.map(id)),
            "\u{FFFD}\u{FFFD}é\u{FFFD}😀\u{FFFD}"
        );
    }

    /// A byte-level BPE vocabulary (the `gpt2` pre-tokenizer): every byte's character
    /// but those of `missing`, then `extra` tokens, and `merges` ("left right").
    fn gpt2_with(missing: &[u8], extra: &[&str], merges: &[&str]) -> Tokenizer {
        let chars = bpe::byte_to_char();
        let mut tokens: Vec<String> = (0..=255u8)
            .filter(|b| !missing.contains(b))
            .map(|b| chars[b as usize].to_string())
            .collect();
        tokens.extend(extra.iter().map(|t| t.to_string()));
        let s = |v: &str| Value::String(v.into());
        let mut w = GgufWriter::new();
        w.meta("tokenizer.ggml.model", s("gpt2"))
            .meta("tokenizer.ggml.pre", s("gpt2"))
            .meta(
                "tokenizer.ggml.tokens",
                Value::Array(tokens.iter().map(|t| s(t)).collect()),
            )
            .meta(
                "tokenizer.ggml.merges",
                Value::Array(merges.iter().map(|m| s(m)).collect()),
            );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gpt2.gguf");
        std::fs::write(&p, w.to_bytes()).unwrap();
        Tokenizer::from_gguf(&Gguf::open(&p).unwrap()).unwrap()
    }

    #[test]
    fn a_byte_with_no_token_keeps_its_neighbours_apart() {
        // "}$" is a token, 0x14 is none: "}\x14$" is one pre-tokenizer word, and the
        // byte between them is dropped without letting them merge.
        let t = gpt2_with(&[0x14], &["}$"], &["} $"]);
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(t.encode("}$", false), vec![id("}$")]);
        assert_eq!(t.encode("}\x14$", false), vec![id("}"), id("$")]);
        assert_eq!(
            t.encode("}\x14\x14$}$", false),
            vec![id("}"), id("$"), id("}$")]
        );
        assert_eq!(t.encode("\x14", false), Vec::<u32>::new());
        // A merge may name the missing byte's character: it merges like any other.
        let c14 = bpe::byte_to_char()[0x14];
        let t = gpt2_with(&[0x14], &[&format!("}}{c14}")], &[&format!("}} {c14}")]);
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(
            t.encode("}\x14$", false),
            vec![id(&format!("}}{c14}")), id("$")]
        );
    }

    #[test]
    fn merges_join_texts_even_through_a_text_that_is_no_token() {
        // "ab" is no token, but "a b" merges and "ab c" then makes "abc": llama.cpp ranks
        // pairs of texts. A word left on "ab" falls back to the tokens of its bytes.
        let t = gpt2_with(&[], &["abc"], &["a b", "ab c"]);
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(t.encode("abc", false), vec![id("abc")]);
        assert_eq!(t.encode("abd", false), vec![id("a"), id("b"), id("d")]);
        assert_eq!(t.decode(&t.encode("abd abc", false)), "abd abc");
    }

    use super::test_support::smollm;

    /// Random text from `atoms`, each repeated 1 to 5 times (runs of one kind).
    fn random_text(rng: &mut SplitMix64, atoms: &[&str], len: usize) -> String {
        let mut s = String::new();
        for _ in 0..len {
            let atom = atoms[rng.below(atoms.len() as u64) as usize];
            for _ in 0..1 + rng.below(3) * rng.below(3) {
                s.push_str(atom);
            }
        }
        s
    }

    /// ASCII, whitespace runs, digits, CJK, emoji, Cyrillic, Arabic, control bytes,
    /// contractions, marks and special-token text (whole and broken).
    const MIXED: &[&str] = &[
        "a",
        "the",
        "Z",
        "Hello",
        " ",
        " ",
        "  ",
        "    ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "0",
        "7",
        "1234",
        "٣",
        "中",
        "文字",
        "日本語",
        "😀",
        "👍🏽",
        "🎉",
        "\u{200d}",
        "ж",
        "Привет",
        "ع",
        "مرحبا",
        "\0",
        "\u{1}",
        "\u{1b}",
        "\u{7f}",
        "\u{85}",
        "'s",
        "'LL",
        "'",
        "!",
        "...",
        "é",
        "e\u{301}",
        "ſ",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_",
        "|>",
    ];

    #[test]
    fn gpt2_encoding_equals_the_naive_merges_on_random_text() {
        let t = smollm();
        let mut rng = SplitMix64(0x70c);
        for i in 0..1500 {
            let text = random_text(&mut rng, MIXED, 1 + i % 120);
            assert_eq!(
                t.encode(&text, true),
                t.encode_naive(&text, true),
                "{text:?}"
            );
        }
        // Long runs of one character: the merges the naive loop made quadratic.
        for unit in [
            "a", "中", "ж", "ع", "😀", "7", " ", "\n", " \n", "ab", "\u{0}",
        ] {
            let text = unit.repeat(1500);
            assert_eq!(
                t.encode(&text, false),
                t.encode_naive(&text, false),
                "{unit:?}"
            );
        }
    }

    /// A random SentencePiece vocabulary over a few characters: every string of 1 to 4 of
    /// them is a piece with some probability, scores drawn from a few values (so ties
    /// occur) or at random, a few pieces unknown-typed or user-defined.
    fn random_spm(rng: &mut SplitMix64) -> Tokenizer {
        let alphabet = ['▁', 'a', 'b', 'c', 'é', '中', '😀'];
        let mut strings: Vec<String> = vec![String::new()];
        let mut pieces = Vec::new();
        for _ in 0..4 {
            let mut longer = Vec::new();
            for s in &strings {
                for c in alphabet {
                    let t = format!("{s}{c}");
                    // Single characters: all but CJK and emoji (those fall back to bytes).
                    let keep = if t.chars().count() == 1 {
                        !matches!(c, '中' | '😀')
                    } else {
                        rng.below(3) == 0
                    };
                    if keep {
                        let score = if rng.below(2) == 0 {
                            -(rng.below(3) as f32) - 1.0
                        } else {
                            -10.0 * rng.unit_f32()
                        };
                        let ty = match rng.below(40) {
                            0 => TYPE_UNKNOWN,
                            1 => TYPE_USER_DEFINED,
                            _ => 1,
                        };
                        pieces.push((t.clone(), score, ty));
                    }
                    longer.push(t);
                }
            }
            strings = longer;
        }
        spm_with(&pieces)
    }

    #[test]
    fn sentencepiece_encoding_equals_the_naive_merges_on_random_vocabularies() {
        let mut rng = SplitMix64(0x5b3);
        let atoms = [
            "a", "b", "c", " ", "  ", "é", "中", "😀", "z", "\n", "ж", "<s>", "abc",
        ];
        for v in 0..12 {
            let t = if v == 0 { spm() } else { random_spm(&mut rng) };
            for i in 0..150 {
                let text = random_text(&mut rng, &atoms, 1 + i % 100);
                assert_eq!(
                    t.encode(&text, true),
                    t.encode_naive(&text, true),
                    "{text:?}"
                );
            }
            for unit in ["a", "ab", " ", " a", "中", "😀", "é"] {
                let text = unit.repeat(800);
                assert_eq!(
                    t.encode(&text, false),
                    t.encode_naive(&text, false),
                    "{unit:?}"
                );
            }
        }
    }

    /// `unit` repeated to 1 MiB.
    fn one_mib_of(unit: &str) -> String {
        unit.repeat((1usize << 20).div_ceil(unit.len()))
    }

    /// CPU seconds this thread has run (user + system, from `/proc/thread-self/stat`):
    /// unlike wall time, it does not grow when other processes load the machine.
    fn thread_cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        ticks / 100.0 // USER_HZ is 100 on Linux
    }

    /// Encodes `text` through the capped entry point, prints the time and checks the CPU
    /// time it took: a guard against a blow-up (quadratic merging or a backtracking
    /// regex), whose 1 MiB would take minutes, not a speed target.
    fn assert_fast(t: &Tokenizer, what: &str, text: &str) {
        let (start, cpu) = (std::time::Instant::now(), thread_cpu_seconds());
        let ids = t.try_encode(text, true).unwrap();
        let (took, cpu) = (start.elapsed(), thread_cpu_seconds() - cpu);
        println!(
            "{what}: {} bytes -> {} tokens in {took:.2?} ({cpu:.2} s of CPU)",
            text.len(),
            ids.len()
        );
        assert!(!ids.is_empty());
        assert!(cpu < 2.0, "{what} took {cpu:.2} s of CPU");
    }

    #[test]
    fn one_mib_runs_of_every_script_encode_in_under_two_cpu_seconds() {
        let t = smollm();
        for (what, unit) in [
            ("'a'", "a"),
            ("CJK", "中"),
            ("Cyrillic", "ж"),
            ("Arabic", "ع"),
            ("emoji", "😀"),
            ("digits", "7"),
            ("spaces", " "),
            ("newlines", "\n"),
            ("spaces and newlines", " \n"),
        ] {
            assert_fast(t, what, &one_mib_of(unit));
        }
        let mut rng = SplitMix64(1);
        let mut mix = String::new();
        while mix.len() < 1 << 20 {
            mix.push_str(&random_text(&mut rng, MIXED, 64));
        }
        assert_fast(t, "random mix", &mix);
    }

    #[test]
    fn one_mib_sentencepiece_runs_encode_in_under_two_cpu_seconds() {
        // Pieces "a", "aa", "aaa", ... so a run of 'a' merges all the way up.
        let pieces: Vec<(String, f32, i32)> = (1..=16)
            .map(|k| ("a".repeat(k), k as f32, 1))
            .chain([("▁".to_string(), 0.0, 1)])
            .collect();
        let t = spm_with(&pieces);
        assert_fast(&t, "SentencePiece 'a'", &one_mib_of("a"));
        assert_fast(&t, "SentencePiece spaces", &one_mib_of(" "));
        let t = random_spm(&mut SplitMix64(2));
        assert_fast(&t, "SentencePiece 'ab'", &one_mib_of("ab"));
        assert_fast(&t, "SentencePiece CJK", &one_mib_of("中"));
        let mut rng = SplitMix64(3);
        let atoms = ["a", "b", "c", " ", "é", "中", "😀", "z"];
        let mut mix = String::new();
        while mix.len() < 1 << 20 {
            mix.push_str(&random_text(&mut rng, &atoms, 64));
        }
        assert_fast(&t, "SentencePiece random mix", &mix);
    }

    /// Text above the cap is refused, as the caller's mistake (an inferlet's guest saw
    /// it as `internal`: the 2026-12-08 probe); shorter text is encoded.
    #[test]
    fn try_encode_refuses_text_above_the_cap_and_encodes_the_rest() {
        let t = spm();
        let big = "a".repeat(MAX_INPUT_BYTES + 1);
        match t.try_encode(&big, true) {
            Err(e @ TokenizerError::InputTooLarge { bytes, limit }) => {
                assert_eq!((bytes, limit), (MAX_INPUT_BYTES + 1, MAX_INPUT_BYTES));
                assert_eq!(e.kind(), crate::error::ErrorKind::Invalid);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            t.try_encode("hello", true).unwrap(),
            t.encode("hello", true)
        );
    }
}
