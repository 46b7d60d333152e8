//! The engine: one model, one KV page pool and a scheduler loop on its own thread,
//! shared by every caller. Callers submit [`Request`]s and read a [`Stream`] of
//! [`Event`]s; programs also drive [`Context`]s (append, flush, generate, fork,
//! truncate, snapshots, raw page operations) that share the pool and batch with the
//! rest of the work. [`forward_one`] runs one sequence's step without an engine (tests,
//! benches, teacher forcing).
//!
//! # Layout (imports run down this list, never up)
//! - `handle.rs`: the public handles, [`Engine`], [`Stream`], [`Context`].
//! - `core.rs`: the engine thread's loop: schedule → forward → update.
//! - `context.rs`: context state and its operations on the engine thread.
//! - `scheduler.rs`: continuous batching, chunked prefill within `max_batch_tokens`,
//!   admission by real page need, eviction then preemption; the only code that
//!   reserves or releases a sequence's pages.
//! - `seq.rs`: one running sample: tokens, sampler, text and stop strings.
//! - `single.rs`: [`forward_one`].
//! - `pooling.rs`: an embedding's token states made into one vector (mean, last,
//!   cls; L2 normalization), in float64.
//! - `events.rs`: the prefix index's changes sent to one subscriber (KV events).
//! - `text.rs`: streamed text with stop strings held back.
//! - `spec/`: speculative decoding without a draft model: drafts from the sample's own
//!   tokens and the salt's recent outputs, how many tokens to draft.
//! - `request.rs`, `error.rs`: the types callers see.
//!
//! NOTE: everything that touches the pool runs on the engine thread; handles talk to
//! it over channels, so no lock guards the KV cache.

mod context;
mod core;
mod error;
mod events;
mod handle;
mod pagemap;
pub mod pooling;
mod quota;
mod request;
mod scheduler;
mod seq;
mod single;
pub mod spec;
mod text;

pub use crate::model::sampler::{MAX_BIAS, MAX_LOGIT_BIAS};
pub use context::{ContextInfo, Role};
pub use error::EngineError;
pub use events::{kv_event_channel, KvEvent, KvEventBatch, KvEventReceiver, KvEventTap, KvParent};
pub use handle::{Context, Embedding, Engine, Stream};
pub use pagemap::{Holder, PageEntry, PageMap};
pub use pooling::Pooling;
pub use request::{
    Completion, EngineConfig, EngineStats, Event, FinishReason, Prompt, Request, TokenLogprob,
    Usage, MAX_BATCH_TOKENS, MAX_LOGPROBS, MAX_N, MAX_PREDICTION, STEP_TOKEN_BOUNDS,
};
pub use single::forward_one;
pub use spec::SpecMode;
