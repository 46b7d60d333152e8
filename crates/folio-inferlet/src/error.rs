//! [`InferletError`]: everything the host reports, typed to the caller, with
//! [`InferletError::kind`] saying whose fault it is (a server maps that to a status
//! without reading the text: a bad upload or a misbehaving program is the caller's
//! fault, never a 500).

use folio::{EngineError, ErrorKind};
use std::time::Duration;
use thiserror::Error;

/// What loading, storing or running an inferlet can fail with.
#[derive(Debug, Error)]
pub enum InferletError {
    /// The bytes are not a component, or not one of the `folio:inferlet` world.
    #[error("the program is not a valid inferlet component: {0}")]
    Invalid(String),
    /// The name cannot name a program.
    #[error("bad inferlet name {0:?}: use 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'")]
    BadName(String),
    #[error("no inferlet named {0:?}")]
    NotFound(String),
    #[error("{0} inferlets are running already (the most at once); retry later")]
    TooManyRuns(usize),
    #[error("{0} inferlets are stored already (the most kept); delete one first")]
    TooManyPrograms(usize),
    #[error("the program is {size} bytes; at most {limit} may be uploaded")]
    TooLarge { size: usize, limit: usize },
    /// The run passed its time limit and was stopped (its contexts dropped).
    #[error("the inferlet ran longer than its limit of {0:?} and was stopped")]
    TimedOut(Duration),
    /// The caller went away (or cancelled) and the run was stopped.
    #[error("the run was cancelled")]
    Cancelled,
    /// The program trapped (a bug or an attack: an out-of-bounds access, a call on a
    /// handle it does not hold, memory past its limit, ...).
    #[error("the inferlet failed: {0}")]
    Trap(String),
    /// The program ended with its own error message.
    #[error("the inferlet reported an error: {0}")]
    Program(String),
    /// A run's quota (contexts, output bytes) was exceeded and the run was stopped.
    #[error("{0}")]
    Quota(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store directory cannot be read or written.
    #[error("inferlet store: {0}")]
    Io(String),
    /// The host cannot be built (a wasmtime setting): the server's own fault.
    #[error("inferlet host: {0}")]
    Host(String),
}

impl InferletError {
    /// Whose fault it is: see [`ErrorKind`].
    pub fn kind(&self) -> ErrorKind {
        use InferletError as E;
        match self {
            E::Invalid(_)
            | E::BadName(_)
            | E::TooLarge { .. }
            | E::Trap(_)
            | E::Program(_)
            | E::Cancelled
            | E::TimedOut(_) => ErrorKind::Invalid,
            E::NotFound(_) => ErrorKind::NotFound,
            E::TooManyRuns(_) | E::TooManyPrograms(_) | E::Quota(_) => ErrorKind::Limit,
            E::Engine(e) => e.kind(),
            E::Io(_) | E::Host(_) => ErrorKind::Internal,
        }
    }
}
