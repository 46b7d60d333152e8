//! Constrained decoding: a [`Grammar`] says which tokens may come next, and the
//! sampled token advances it. The grammar engine is `llguidance` (the library behind
//! llama.cpp's, vLLM's and mistral.rs's fastest structured output); this module
//! gives it folio's vocabulary as its token table ([`Grammars`], built once per
//! model) and compiles the sources users send ([`GrammarSpec`]: a JSON schema, any
//! JSON object, a regex, a choice among strings, a Lark grammar). A source that
//! does not compile is a [`GrammarError`] before any work.
//!
//! A grammar answers two questions: whether it takes one token next
//! ([`Grammar::accepts`], a walk of that token's bytes) and which tokens it allows
//! ([`Grammar::allowed`], the whole vocabulary, some 300 times dearer). The sampler
//! asks the first where that decides the sample and masks with the second otherwise.
//!
//! It sits beside the tokenizer: it reads token bytes, and the engine's sampler uses
//! it. Nothing here touches pages or the model.

use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::fmt;
use std::sync::Arc;
use thiserror::Error;
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};

/// Why a grammar could not be built or used.
#[derive(Debug, Clone, Error)]
pub enum GrammarError {
    #[error("the grammar does not compile: {0}")]
    Compile(String),
    #[error("the model's vocabulary cannot be used for grammars: {0}")]
    Vocabulary(String),
}

impl GrammarError {
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            GrammarError::Compile(_) => crate::ErrorKind::Invalid,
            GrammarError::Vocabulary(_) => crate::ErrorKind::Internal,
        }
    }
}

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression (whole).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

/// The token table every grammar of one model shares.
pub struct Grammars {
    factory: ParserFactory,
}

impl fmt::Debug for Grammars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammars")
    }
}

impl Grammars {
    /// The table for `tok`'s vocabulary, padded to `vocab` (the logits' width).
    /// Control tokens are marked special, so grammar text never matches them.
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<Self, GrammarError> {
        let mut words = Vec::with_capacity(vocab);
        for id in 0..vocab as u32 {
            let bytes = tok.token_bytes(id);
            if bytes.is_empty() {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                match tok.token_text(id) {
                    Some(t) if !t.is_empty() => w.extend_from_slice(t.as_bytes()),
                    _ => w.extend_from_slice(format!("<[{id}]>").as_bytes()),
                }
                words.push(w);
            } else {
                words.push(bytes);
            }
        }
        let eos = tok
            .eos
            .or_else(|| (0..vocab as u32).find(|&i| tok.is_eog(i)))
            .ok_or_else(|| GrammarError::Vocabulary("no end-of-sequence token".into()))?;
        let info = TokRxInfo {
            vocab_size: vocab as u32,
            tok_eos: eos,
            tok_bos: None,
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let trie = TokTrie::from(&info, &words);
        let env: toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.set_stderr_log_level(0);
        Ok(Self { factory })
    }

    /// Compiles `spec`; the error says what is wrong with it.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let top = match spec {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            GrammarSpec::Choice(c) => {
                if c.is_empty() {
                    return Err(GrammarError::Compile("the choice list is empty".into()));
                }
                let alts: Vec<String> = c
                    .iter()
                    .map(|s| serde_json::Value::String(s.clone()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(GrammarError::Compile(e));
        }
        Ok(Grammar(Box::new(m)))
    }
}

/// The set of tokens a grammar allows at one point.
pub struct Allowed(toktrie::SimpleVob);

impl Allowed {
    /// Whether `token` is allowed.
    pub fn contains(&self, token: u32) -> bool {
        let t = token as usize;
        self.0
            .as_slice()
            .get(t / 32)
            .is_some_and(|w| w >> (t % 32) & 1 == 1)
    }

    /// Sets every other token's logit to -inf; false when no allowed token has a
    /// finite logit.
    pub fn apply(&self, logits: &mut [f32]) -> bool {
        // A word of the bitset at a time: most words are all-forbidden or
        // all-allowed, so most of the vocabulary costs one comparison per 32 tokens.
        let words = self.0.as_slice();
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            match bits {
                0 => chunk.fill(f32::NEG_INFINITY),
                u32::MAX => {
                    any = any || chunk.iter().any(|l| !l.is_nan() && *l != f32::NEG_INFINITY);
                }
                _ => {
                    for (b, l) in chunk.iter_mut().enumerate() {
                        if bits >> b & 1 == 1 {
                            any |= !l.is_nan() && *l != f32::NEG_INFINITY;
                        } else {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        any
    }
}

/// JSON laid out as `json.dumps` does (`", "` and `": "`, no other whitespace)
/// unless the schema sets its own layout under `x-guidance`: small models otherwise
/// wander into runs of newlines that still parse but waste tokens.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        });
    }
    schema
}

/// A compiled grammar and how far the output has come through it. Cloning gives an
/// independent copy at the same point (an `n > 1` sample's own).
pub struct Grammar(Box<Matcher>);

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Grammar(Box::new(self.0.deep_clone()))
    }
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// The tokens allowed next (once the grammar is complete, only end-of-sequence),
    /// or `None` when it cannot say (an error state: the output then ends). It
    /// depends only on the tokens already consumed, so it can be computed while the
    /// forward pass that gives the next logits runs.
    pub fn allowed(&mut self) -> Option<Allowed> {
        self.0.compute_mask_or_eos().ok().map(Allowed)
    }

    /// Whether the grammar takes `token` next, without advancing: a walk of the
    /// token's bytes, far cheaper than [`Grammar::allowed`]'s whole vocabulary. It
    /// agrees with the mask (the tests check it token by token); end-of-sequence is
    /// taken once the output may end.
    pub fn accepts(&mut self, token: u32) -> bool {
        self.0.validate_tokens(&[token]).is_ok_and(|n| n == 1)
    }

    /// Advances past the sampled `token`; false when the grammar refuses it.
    pub fn advance(&mut self, token: u32) -> bool {
        self.0.consume_token(token).is_ok()
    }

    /// Whether the output is complete: nothing but end-of-sequence may follow.
    pub fn is_done(&self) -> bool {
        self.0.is_stopped()
    }
}
