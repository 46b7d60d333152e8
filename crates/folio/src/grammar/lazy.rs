//! A model's grammar table, built on first use: [`LazyGrammars`] holds it once built,
//! [`GrammarTable`] is what a request carries to reach it.
//!
//! The table is not small: llguidance keeps the vocabulary's token trie and, for
//! speed inside JSON strings, a trie per token slice it precomputes (a handful of
//! near-whole copies). For Gemma 3's 262k tokens that is about 250 MB, two thirds of
//! the model's own weights. A server that never constrains output should not hold
//! it, so the engine keeps one per model (`Engine::grammars`: the server's routes and
//! its inferlets share it, where each used to build its own at start), built when the
//! first request asks for a grammar (Gemma 3: 0.8 s, once; SmolLM2: 0.12 s).

use super::{GrammarError, Grammars};
use crate::tokenizer::Tokenizer;
use std::sync::OnceLock;
use std::time::Instant;

/// A model's grammar table, or why it cannot be built, once some request asked.
#[derive(Default)]
pub struct LazyGrammars(OnceLock<Result<Grammars, GrammarError>>);

impl LazyGrammars {
    /// Nothing built yet.
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The table for `tok`'s vocabulary, padded to `vocab`, as a request reaches it.
    pub fn table<'a>(&'a self, tok: &'a Tokenizer, vocab: usize) -> GrammarTable<'a> {
        GrammarTable {
            lazy: self,
            tok,
            vocab,
        }
    }
}

/// A request's way to the grammar table: built by the first caller of [`get`]
/// (others wait for it), then shared.
///
/// [`get`]: GrammarTable::get
#[derive(Clone, Copy)]
pub struct GrammarTable<'a> {
    lazy: &'a LazyGrammars,
    tok: &'a Tokenizer,
    vocab: usize,
}

impl<'a> GrammarTable<'a> {
    /// Whether the table has been built (or failed to build): some caller asked.
    pub fn is_built(self) -> bool {
        self.lazy.0.get().is_some()
    }

    /// The table, built now if no request has asked before; the error (kept) when the
    /// vocabulary cannot serve one.
    pub fn get(self) -> Result<&'a Grammars, &'a GrammarError> {
        self.lazy
            .0
            .get_or_init(|| {
                let began = Instant::now();
                let built = Grammars::new(self.tok, self.vocab);
                match &built {
                    Ok(_) => tracing::info!(
                        "grammar table built for structured output ({} tokens) in {:.2} s",
                        self.vocab,
                        began.elapsed().as_secs_f64()
                    ),
                    Err(e) => tracing::warn!("{e}: structured output will answer 400"),
                }
                built
            })
            .as_ref()
    }
}
