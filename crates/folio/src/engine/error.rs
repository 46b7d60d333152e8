//! [`EngineError`]: everything the engine reports, typed to the caller. Errors from
//! the layers below are carried as values; [`EngineError::kind`] says whose fault it is
//! (a bad request, something missing, busy, overloaded, or the server's own), so a
//! server maps it to a status without reading the text.

use crate::error::{ErrorKind, TokenizerError};
use crate::kv::{KvError, SnapshotError};
use crate::model::StepError;
use thiserror::Error;

/// What the engine reports when a request or call cannot be served.
#[derive(Debug, Clone, Error)]
pub enum EngineError {
    #[error("the engine has stopped")]
    Closed,
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Disk(#[from] crate::kv::DiskError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Step(#[from] StepError),
    #[error(transparent)]
    Grammar(#[from] crate::grammar::GrammarError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {len} tokens; the context window holds {window} (prompt and at least one generated token)")]
    PromptTooLong { len: usize, window: usize },
    #[error("the request needs {needed} KV pages; the pool can give it at most {available}")]
    PoolTooSmall { needed: usize, available: usize },
    #[error("the request needs {needed} KV pages (prompt plus max_tokens); the whole pool has {pages}: ask for fewer tokens")]
    TooLargeForPool { needed: usize, pages: usize },
    #[error("the request ran longer than its time limit of {limit:?} and was stopped")]
    TimedOut { limit: std::time::Duration },
    #[error("{name}: {reason}")]
    Param { name: &'static str, reason: String },
    #[error("engine configuration: {name} {reason}")]
    Config { name: &'static str, reason: String },
    #[error("no context {0}")]
    NoContext(u64),
    #[error("the context is busy with a generation")]
    Busy,
    #[error("the context has {0} pending tokens: flush it before saving")]
    NotFlushed(usize),
    #[error("cannot drop {wanted} tokens from a context of {len}")]
    TruncateTooFar { wanted: usize, len: usize },
    #[error("cannot release {wanted} working pages: the context has {have}")]
    ReleaseTooMany { wanted: usize, have: usize },
    #[error("contexts and snapshots hold {held} pages and this needs {need} more; together they may hold at most {limit} of the pool's pages (the rest is kept for requests): delete, truncate or unpin some first")]
    ContextPages {
        held: usize,
        need: usize,
        limit: usize,
    },
}

impl EngineError {
    /// Whose fault it is: see [`ErrorKind`].
    pub fn kind(&self) -> ErrorKind {
        use EngineError as E;
        match self {
            E::Closed | E::PoolTooSmall { .. } | E::TimedOut { .. } => ErrorKind::Unavailable,
            E::Internal(_) => ErrorKind::Internal,
            E::Kv(e) => e.kind(),
            E::Snapshot(e) => e.kind(),
            E::Disk(e) => e.kind(),
            E::Tokenizer(e) => e.kind(),
            E::Step(e) => e.kind(),
            E::Grammar(e) => e.kind(),
            E::EmptyPrompt
            | E::TooLargeForPool { .. }
            | E::PromptTooLong { .. }
            | E::Param { .. }
            | E::Config { .. }
            | E::NotFlushed(_)
            | E::TruncateTooFar { .. }
            | E::ReleaseTooMany { .. } => ErrorKind::Invalid,
            E::NoContext(_) => ErrorKind::NotFound,
            E::Busy => ErrorKind::Busy,
            E::ContextPages { .. } => ErrorKind::Limit,
        }
    }

    pub(crate) fn param(name: &'static str, reason: impl Into<String>) -> Self {
        EngineError::Param {
            name,
            reason: reason.into(),
        }
    }
}
