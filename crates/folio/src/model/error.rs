//! The model layer's errors: loading a model ([`ModelError`]) and running a step
//! ([`StepError`]). A step fails only for what it was given (a bad token id, a batch
//! whose pages do not cover its positions) or for what it computed (non-finite
//! logits): it never allocates, so it cannot run out of pages.

use crate::error::{ErrorKind, GgufError, PoolError, TokenizerError};
use thiserror::Error;

/// Errors from building a model out of a GGUF file.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {arch:?} (folio runs: {supported})")]
    UnsupportedArchitecture { arch: String, supported: String },
    #[error("unsupported RoPE scaling type {ty:?} (folio reads: {supported})")]
    UnsupportedRopeScaling { ty: String, supported: String },
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {got:?}, expected {expected:?}")]
    BadShape {
        name: String,
        got: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor {name:?}: {reason}")]
    BadValues { name: String, reason: String },
    #[error("tensor {name:?} has type {ty}, which folio cannot compute with yet")]
    UnsupportedType { name: String, ty: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

/// Why a forward step was refused or failed. Nothing is stored when it fails, but the
/// slots of the step may hold garbage: the owner aborts the step.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum StepError {
    #[error("a step of sequence {seq} has no tokens")]
    Empty { seq: usize },
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error("sequence {seq} of the batch: {reason}")]
    BadBatch { seq: usize, reason: String },
    #[error("the model computed non-finite logits (the weights or the input are broken)")]
    NonFinite,
    /// A backend's device failed the step, or refused the pool when the engine
    /// started (lost, out of memory, a pool larger than it holds): the backend's own
    /// words.
    #[error("the backend's device failed: {0}")]
    Device(String),
}

impl StepError {
    /// A bad token is the caller's; a malformed batch is a bug of whoever planned it;
    /// non-finite logits are the model file's.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StepError::Empty { .. } | StepError::BadToken(_) => ErrorKind::Invalid,
            StepError::BadBatch { .. } | StepError::NonFinite | StepError::Device(_) => {
                ErrorKind::Internal
            }
        }
    }
}

impl ModelError {
    /// A model file folio cannot run is the file's (the caller chose it).
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Invalid
    }
}
