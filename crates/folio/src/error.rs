//! Typed errors for every library module. The binary wraps them in `anyhow`; the library
//! never panics on bad input, it returns one of these.

use thiserror::Error;

/// Errors from reading a GGUF file: every one names what is wrong and where.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
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

/// Errors from building a model out of a GGUF file.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (folio runs llama-family models: llama)")]
    UnsupportedArchitecture(String),
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
    #[error("tensor {name:?} has type {ty}, which folio cannot compute with yet")]
    UnsupportedType { name: String, ty: String },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// Errors from the tokenizer and the chat template.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer model {0:?} (folio reads gpt2 and llama)")]
    UnsupportedModel(String),
    #[error("tokenizer metadata: {0}")]
    BadVocab(String),
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
    #[error("chat template: {0}")]
    Template(String),
}

/// Errors from running the model.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("position {pos} is outside the KV cache capacity of {capacity} tokens")]
    ContextFull { pos: usize, capacity: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {len} tokens, the context holds {capacity}")]
    PromptTooLong { len: usize, capacity: usize },
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error("KV cache: {0}")]
    Kv(String),
}
