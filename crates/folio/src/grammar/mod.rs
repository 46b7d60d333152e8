//! Constrained decoding: a [`Grammar`] says which tokens may come next, and the
//! sampled token advances it. The grammar engine is `llguidance` (the library behind
//! llama.cpp's, vLLM's and mistral.rs's fastest structured output); this module
//! gives it folio's vocabulary as its token table ([`Grammars`], built once per
//! model) and compiles the sources users send ([`GrammarSpec`]: a JSON schema, any
//! JSON object, a regex, a choice among strings, a Lark grammar). A source that
//! does not compile, is over a cap, or matches no output at all is a
//! [`GrammarError`] before any work.
//!
//! A grammar answers two questions: whether it takes one token next
//! ([`Grammar::accepts`], a walk of that token's bytes) and which tokens it allows
//! ([`Grammar::allowed`], the whole vocabulary, some 300 times dearer). The sampler
//! asks the first where that decides the sample and masks with the second otherwise.
//! A grammar that llguidance cannot follow any further (one of its limits, or the
//! time budget of [`limits`]) fails: it then takes no token, and
//! [`Grammar::failure`] says why, for the engine to end that request with an error.
//!
//! Submodules: [`limits`] owns the caps, the per-token budget and how choices are
//! compiled; [`error`] owns [`GrammarError`] and what of llguidance's messages a
//! client may see; [`lazy`] builds the token table on first use ([`LazyGrammars`]).
//!
//! It sits beside the tokenizer: it reads token bytes, and the engine's sampler uses
//! it. Nothing here touches pages or the model.

pub mod error;
pub mod lazy;
pub mod limits;

use crate::tokenizer::Tokenizer;
pub use error::GrammarError;
use error::Phase;
pub use lazy::{GrammarTable, LazyGrammars};
use limits::Budget;
use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::{CancellationHandle, Matcher, ParserFactory};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};

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
        *factory.limits_mut() = limits::parser_limits();
        Ok(Self { factory })
    }

    /// Compiles `spec`; the error says what is wrong with it.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        self.compile_with(spec, &CompileCancel::default())
    }

    /// Compiles `spec` unless `cancel` is cancelled first. llguidance's compile
    /// itself cannot be interrupted (the caps of [`limits`] keep it short); `cancel`
    /// is checked before it, and interrupts the first mask, which finds a grammar
    /// that matches nothing.
    pub fn compile_with(
        &self,
        spec: &GrammarSpec,
        cancel: &CompileCancel,
    ) -> Result<Grammar, GrammarError> {
        limits::check_size(spec)?;
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
                TopLevelGrammar::from_regex(&limits::choice_regex(c))
            }
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        cancel.check()?;
        // llguidance catches its own panics into its errors; one that escapes it is
        // caught here (its message goes to the log only).
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.factory.create_parser(top)
        }))
        .map_err(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = msg, "compiling a grammar panicked");
            GrammarError::Engine
        })?
        .map_err(|e| GrammarError::from_llguidance(&e.to_string(), Phase::Compile))?;
        let mut m = Matcher::new(Ok(parser)).into_cancellable();
        if let Some(e) = m.get_error() {
            return Err(GrammarError::from_llguidance(&e, Phase::Compile));
        }
        let _registered = cancel.register(m.cancellation_handle());
        // The first mask: a grammar whose language is empty allows nothing, not
        // even the end (llguidance fails it with `NoExtensionBias`). llguidance
        // keeps the mask, so the first sample reuses it.
        match m.compute_mask_or_eos() {
            Ok(mask) if mask.is_zero() => return Err(GrammarError::Unsatisfiable),
            Ok(_) => {}
            Err(e) => {
                let e = e.to_string();
                let stop = format!("{:?}", StopReason::NoExtensionBias);
                if e.lines().next().is_some_and(|l| l.trim() == stop) {
                    return Err(GrammarError::Unsatisfiable);
                }
                return Err(GrammarError::from_llguidance(&e, Phase::Compile));
            }
        }
        Ok(Grammar(Box::new(Following {
            m,
            budget: Budget::default(),
            checks: 0,
            failed: None,
        })))
    }
}

/// Abandons a grammar's compile whose request went away: the compile checks it
/// before llguidance's (uninterruptible) work and stops the first mask when it is
/// cancelled during it. A grammar the compile has returned is no longer affected.
#[derive(Debug, Default)]
pub struct CompileCancel {
    cancelled: AtomicBool,
    /// The handle of the matcher being checked, while it is.
    running: Mutex<Option<CancellationHandle>>,
}

impl CompileCancel {
    /// Stops the compile (now, or as soon as it checks).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        if let Some(h) = self.lock().as_ref() {
            h.cancel();
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    fn check(&self) -> Result<(), GrammarError> {
        if self.is_cancelled() {
            return Err(GrammarError::Cancelled);
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<CancellationHandle>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets `cancel` reach `handle` until the guard is dropped.
    fn register(&self, handle: Option<CancellationHandle>) -> Registered<'_> {
        if let Some(h) = &handle {
            if self.is_cancelled() {
                h.cancel();
            }
        }
        *self.lock() = handle;
        Registered(self)
    }
}

/// While it lives, [`CompileCancel::cancel`] reaches the matcher being checked.
struct Registered<'a>(&'a CompileCancel);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        *self.0.lock() = None;
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

/// A compiled grammar and how far the output has come through it, with the time it
/// may still spend in llguidance ([`limits::Budget`]). Cloning gives an independent
/// copy at the same point (an `n > 1` sample's own).
pub struct Grammar(Box<Following>);

/// A grammar's state (boxed: a request carries its grammar by value).
struct Following {
    m: Matcher,
    budget: Budget,
    /// Single-token questions asked since the last token.
    checks: usize,
    /// Why it can go no further, once it cannot: it then takes no token.
    failed: Option<GrammarError>,
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Grammar(Box::new(Following {
            m: self.0.m.deep_clone(),
            budget: self.0.budget.clone(),
            checks: self.0.checks,
            failed: self.0.failed.clone(),
        }))
    }
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// The tokens allowed next (once the grammar is complete, only end-of-sequence),
    /// or `None` when it has failed ([`Grammar::failure`] says why). It depends only
    /// on the tokens already consumed, so it can be computed while the forward pass
    /// that gives the next logits runs.
    pub fn allowed(&mut self) -> Option<Allowed> {
        self.run(true, |m| m.compute_mask_or_eos()).map(Allowed)
    }

    /// Whether the grammar takes `token` next, without advancing: a walk of the
    /// token's bytes, far cheaper than [`Grammar::allowed`]'s whole vocabulary. It
    /// agrees with the mask (the tests check it token by token); end-of-sequence is
    /// taken once the output may end. A failed grammar takes nothing. The first
    /// [`limits::CHARGED_CHECKS`] questions of a token are charged to its budget.
    pub fn accepts(&mut self, token: u32) -> bool {
        self.0.checks += 1;
        let charged = self.0.checks <= limits::CHARGED_CHECKS;
        self.run(charged, |m| m.validate_tokens(&[token]))
            .is_some_and(|n| n == 1)
    }

    /// Advances past the sampled `token`; false when the grammar refuses it or has
    /// failed ([`Grammar::failure`] says why). Each token adds
    /// [`limits::STEP_BUDGET`] to the time the grammar may spend.
    pub fn advance(&mut self, token: u32) -> bool {
        self.0.budget.refill();
        self.0.checks = 0;
        if self.run(true, |m| m.consume_token(token)).is_some() {
            return true;
        }
        if self.0.failed.is_none() {
            // llguidance took the token in its mask but not here: its bug, not the
            // grammar's.
            tracing::error!(token, "the grammar refused a token it allowed");
            self.0.failed = Some(GrammarError::Engine);
        }
        false
    }

    /// Whether the output is complete: nothing but end-of-sequence may follow.
    pub fn is_done(&self) -> bool {
        self.0.failed.is_none() && self.0.m.is_stopped()
    }

    /// Why the grammar can go no further, once it cannot: an llguidance limit, its
    /// time budget spent, or an llguidance failure.
    pub fn failure(&self) -> Option<&GrammarError> {
        self.0.failed.as_ref()
    }

    /// Runs `f` on the matcher, its time taken from the budget when `charged`;
    /// `None` once the grammar has failed (then, or before).
    fn run<T, E: fmt::Display>(
        &mut self,
        charged: bool,
        f: impl FnOnce(&mut Matcher) -> Result<T, E>,
    ) -> Option<T> {
        if self.0.failed.is_some() {
            return None;
        }
        let mark = charged.then(|| self.0.budget.mark());
        let r = f(&mut self.0.m);
        match r {
            Err(e) => {
                self.0.failed = Some(GrammarError::from_llguidance(&e.to_string(), Phase::Follow));
                None
            }
            Ok(_) if mark.is_some_and(|m| !self.0.budget.charge(m)) => {
                self.0.failed = Some(GrammarError::Exceeded(format!(
                    "it spent more than {:?} of work per token, past a reserve of {:?}",
                    limits::STEP_BUDGET,
                    limits::BUDGET_RESERVE
                )));
                None
            }
            Ok(v) => Some(v),
        }
    }
}

#[cfg(test)]
mod tests;
