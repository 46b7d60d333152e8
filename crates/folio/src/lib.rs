//! folio: an LLM inference engine built around a paged KV cache.
//!
//! # Layers (imports run one way: engine → model → kv → kernels → gguf)
//! - [`engine`]: the engine thread (continuous batching, preemption), [`Engine`],
//!   [`Context`], requests and events, [`forward_one`] for a single sequence.
//! - [`model`]: the llama-family forward pass over a planned [`Batch`], the sampler.
//! - [`tokenizer`]: BPE tokenizer and chat template from GGUF metadata (beside model).
//! - [`kv`]: the paged pool ([`PagedKv`]), page tables, the prefix index, snapshots,
//!   batches, the contiguous oracle.
//! - `kernels` (private): quantized formats, SIMD dot products with scalar twins,
//!   matmul, attention kernels, the thread pool.
//! - [`gguf`]: the GGUF file reader (mmap, bounds-checked).
//! - [`error`]: the leaf errors and [`ErrorKind`]; each layer's own errors are
//!   re-exported here too.
//!
//! The facade below is what programs need; the modules stay public for their types.

pub mod engine;
pub mod error;
pub mod gguf;
pub mod grammar;
#[doc(hidden)]
pub mod internals;
pub(crate) mod kernels;
pub mod kv;
pub mod machine;
pub mod model;
pub mod rng;
pub mod tiny;
pub mod tokenizer;

pub use engine::{
    forward_one, kv_event_channel, Completion, Context, ContextInfo, Embedding, Engine,
    EngineConfig, EngineError, EngineStats, Event, FinishReason, Holder, KvEvent, KvEventBatch,
    KvEventReceiver, KvEventTap, KvParent, PageEntry, PageMap, Pooling, Prompt, Request, Role,
    SpecMode, Stream, TokenLogprob, Usage,
};
pub use error::{ErrorKind, GgufError, TokenizerError};
pub use kv::{
    is_plain_name, BasicCache, Batch, DiskConfig, DiskError, DiskStats, KvDtype, KvError, KvSeq,
    Logits, PageState, PagedKv, SeqStep, SnapshotError,
};
pub use model::{Model, ModelError, SamplingParams, StepError};
