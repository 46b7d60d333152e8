//! [`GrammarError`]: why a grammar could not be built or followed, and the one place
//! llguidance's own messages become folio's. Those messages may carry the parser's
//! state, the whole grammar, or (after a panic llguidance caught) a backtrace with
//! crate paths: [`GrammarError::from_llguidance`] keeps only their first line, logs
//! the rest with `tracing`, and turns a panic into [`GrammarError::Engine`], whose
//! text says nothing of it.

use crate::error::ErrorKind;
use thiserror::Error;

/// The longest llguidance reason a client sees, in bytes (the whole goes to the log).
const MAX_REASON_BYTES: usize = 400;

/// Why a grammar could not be built or followed.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum GrammarError {
    /// The source is malformed, or uses what llguidance does not support.
    #[error("the grammar does not compile: {0}")]
    Compile(String),
    /// The source is over one of folio's caps, checked before any compile work
    /// (see [`crate::grammar::limits`]).
    #[error("the grammar is too large: {what} is {size}; folio compiles at most {limit}")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    /// No output can match: the grammar's language is empty.
    #[error("the grammar is unsatisfiable: no output can match it")]
    Unsatisfiable,
    /// Following the grammar needs more work than folio allows: one of llguidance's
    /// per-token limits, or the time budget of [`crate::grammar::limits`].
    #[error("the grammar needs more work per token than folio allows ({0}); make it smaller or less ambiguous")]
    Exceeded(String),
    /// llguidance failed on this grammar (a panic it caught, or a state it should
    /// never reach): the details are in the server's log only.
    #[error("the grammar engine failed on this grammar")]
    Engine,
    /// Its request went away (the client left, or its time ran out) while it compiled.
    #[error("the grammar's compile was abandoned: its request went away")]
    Cancelled,
    #[error("the model's vocabulary cannot be used for grammars: {0}")]
    Vocabulary(String),
}

/// Where an llguidance message came from: compiling, or following the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Compile,
    Follow,
}

impl GrammarError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            GrammarError::Compile(_)
            | GrammarError::TooLarge { .. }
            | GrammarError::Unsatisfiable
            | GrammarError::Exceeded(_) => ErrorKind::Invalid,
            GrammarError::Cancelled => ErrorKind::Unavailable,
            GrammarError::Engine | GrammarError::Vocabulary(_) => ErrorKind::Internal,
        }
    }

    /// folio's error for an llguidance message `raw` met in `phase`: its first line,
    /// cut to [`MAX_REASON_BYTES`]; a panic is [`GrammarError::Engine`]. The whole
    /// message is logged.
    pub(crate) fn from_llguidance(raw: &str, phase: Phase) -> Self {
        if raw.starts_with("panic:") || raw.contains("<backtrace>") {
            tracing::error!(details = raw, "llguidance panicked on a grammar");
            return GrammarError::Engine;
        }
        if raw == llguidance::Cancelled.to_string() {
            return GrammarError::Cancelled;
        }
        tracing::debug!(details = raw, ?phase, "llguidance refused a grammar");
        let reason = short(raw);
        match phase {
            Phase::Compile => GrammarError::Compile(reason),
            Phase::Follow => GrammarError::Exceeded(reason),
        }
    }
}

/// The first line of `raw` (llguidance appends its state and the grammar on the
/// lines after), at most [`MAX_REASON_BYTES`] long.
fn short(raw: &str) -> String {
    let line = raw.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let line = line.trim();
    if line.len() <= MAX_REASON_BYTES {
        return line.to_string();
    }
    let mut end = MAX_REASON_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F17 of the 2026-11-27 probe: a panic llguidance caught came back as the error
    /// text, backtrace and crate paths included.
    #[test]
    fn a_caught_panic_becomes_a_short_message_without_its_backtrace() {
        let raw = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n   0: {closure#0}<…>\n             at /home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/llguidance-1.9.1/src/panic_utils.rs:40:29\n</backtrace>";
        for phase in [Phase::Compile, Phase::Follow] {
            let e = GrammarError::from_llguidance(raw, phase);
            assert_eq!(e, GrammarError::Engine);
            let text = e.to_string();
            for leak in ["panic", "backtrace", ".rs:", "registry", "assertion"] {
                assert!(!text.contains(leak), "{text:?} holds {leak:?}");
            }
        }
    }

    #[test]
    fn an_llguidance_message_keeps_only_its_first_line_and_is_cut() {
        let raw = "Parser Error: Current row has 2001 items; max is 2000\n<state>\nTokens: ⟦item⟧\n</state><grammar>\nstart: \"secret\"\n</grammar>";
        let e = GrammarError::from_llguidance(raw, Phase::Follow);
        assert_eq!(
            e,
            GrammarError::Exceeded("Parser Error: Current row has 2001 items; max is 2000".into())
        );
        let long = format!("{}\nmore", "é".repeat(1000));
        let GrammarError::Compile(r) = GrammarError::from_llguidance(&long, Phase::Compile) else {
            panic!("a compile message is a compile error");
        };
        assert!(r.len() <= MAX_REASON_BYTES + '…'.len_utf8(), "{}", r.len());
        assert!(!r.contains("more"));
    }
}
