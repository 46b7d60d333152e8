//! The errors of the leaf modules (the GGUF reader and the tokenizer) and
//! [`ErrorKind`], the one classification every layer's error gives: whose fault it
//! is and what a server should answer. Each layer owns its errors beside its code
//! (`kv::KvError`, `model::ModelError` and `StepError`, `engine::EngineError`); the
//! binary wraps them in `anyhow`. The library never panics on bad input, it returns
//! one of these.

use thiserror::Error;

/// Errors from reading a GGUF file: every one names what is wrong and where.
#[derive(Debug, Error)]
pub enum GgufError {
    /// The OS error is part of the message (not a `source`), so it is printed once.
    #[error("cannot read {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path} {kind}, not a regular file")]
    NotAFile { path: String, kind: FileKind },
    #[error("not a GGUF file: magic bytes are {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (folio reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: {what} needs bytes {start}..{end}, but the file has {len}")]
    Truncated {
        what: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("{what} is {value}, above the limit of {limit}")]
    TooLarge {
        what: String,
        value: u64,
        limit: u64,
    },
    #[error("metadata key {key:?}: unknown value type {ty}")]
    BadValueType { key: String, ty: u32 },
    #[error("{0} is not valid UTF-8")]
    BadUtf8(String),
    #[error("tensor {name:?}: unknown tensor type id {ty}")]
    UnknownTensorType { name: String, ty: u32 },
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("duplicate {what} {name:?}")]
    Duplicate { what: &'static str, name: String },
    #[error("general.alignment is {0}, which is not a power of two")]
    BadAlignment(u64),
}

/// What a path that is not a regular file is instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    /// A FIFO (named pipe): opening it for reading would wait for a writer.
    Fifo,
    /// A character or block device, such as `/dev/zero`.
    Device,
    Socket,
    /// Anything else that is not a regular file.
    Other,
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "is a directory",
            FileKind::Fifo => "is a FIFO/named pipe",
            FileKind::Device => "is a device",
            FileKind::Socket => "is a socket",
            FileKind::Other => "is a special file",
        })
    }
}

/// Errors from starting the thread pool.
#[derive(Debug, Error)]
pub enum PoolError {
    #[error("{requested} threads requested, above the limit of {limit}")]
    TooManyThreads { requested: usize, limit: usize },
    /// The OS error is part of the message (not a `source`), so it is printed once.
    #[error("cannot start worker thread {index}: {error}")]
    Spawn { index: usize, error: std::io::Error },
}

/// Errors from the tokenizer and the chat template.
#[derive(Debug, Clone, Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer model {0:?} (folio reads gpt2 and llama)")]
    UnsupportedModel(String),
    #[error("tokenizer metadata: {0}")]
    BadVocab(String),
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
    #[error("chat template: {0}")]
    Template(String),
    #[error("the text to tokenize is {bytes} bytes, above the limit of {limit}")]
    InputTooLarge { bytes: usize, limit: usize },
}

impl TokenizerError {
    /// An id outside the vocabulary and a text over the limit are the caller's; a
    /// broken vocabulary or template in the model file is the server's.
    pub fn kind(&self) -> ErrorKind {
        match self {
            TokenizerError::UnknownId(_) | TokenizerError::InputTooLarge { .. } => {
                ErrorKind::Invalid
            }
            _ => ErrorKind::Internal,
        }
    }
}

/// Whose fault an error is, and so how a server answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The caller's input is wrong: a bad parameter, a prompt too long, an unknown
    /// token id, a misused page operation (HTTP 400).
    Invalid,
    /// What the caller named does not exist: a context, a snapshot (404).
    NotFound,
    /// The target is busy with other work; retry once it ends (409).
    Busy,
    /// The engine cannot serve it now: out of pages, a pool too small, stopped (503).
    Unavailable,
    /// The server's fault: a bug, a file it cannot read or write (500).
    Internal,
    /// Over a limit on what one caller may hold (the contexts' share of the pool):
    /// free some of it first (429).
    Limit,
}

impl ErrorKind {
    /// Whether the caller caused it (and must change the request to succeed).
    pub fn is_caller_fault(self) -> bool {
        matches!(self, ErrorKind::Invalid | ErrorKind::NotFound)
    }
}
