//! The model: llama-family config, weights, the forward pass over a planned
//! [`Batch`](crate::kv::Batch) and the sampler. It reads and writes K/V through
//! [`KvStorage`](crate::kv::KvStorage) by page id and never allocates pages; it imports
//! `kv`, `kernels`, `gguf` and `tokenizer`, nothing above.
//!
//! - `loaded`: [`Model`], the description (config, tokenizer, window, fingerprint) and
//!   its [`Backend`]; it checks each batch and hands the step to the backend.
//! - `backend`: the [`Backend`] trait and its contract (pages, K/V, same bits).
//! - `cpu`: [`CpuBackend`], weights laid out for the kernels, calibration of the
//!   outlier blocks (`outliers`), one [`kernels::Cpu`](crate::kernels::Cpu) handle.
//! - `forward`: the CPU step: scratch buffers, embed, attention block, feed-forward
//!   block, head.
//! - `attention`: paged attention (plan, run, combine).
//! - `config`, `weights`, `rope`, `ops`: the layer's description and its small steps.
//! - `dequant`: [`dequantize`], a tensor's rows as floats for backends of their own.
//! - `sampler`, `step_logits`: what comes out of a step.

mod attention;
mod backend;
mod config;
mod cpu;
mod dequant;
mod error;
mod forward;
mod loaded;
mod ops;
mod outliers;
mod rope;
pub mod sampler;
mod step_logits;
mod weights;

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests_avxvnni;

/// The most threads `Model::load` accepts.
pub use crate::kernels::pool::MAX_THREADS;
pub use attention::{attention, AttentionStep, Heads, Scores, ROW_BLOCK, SPLIT_KEYS};
pub use backend::{Backend, BackendFigure};
pub use config::{Activation, Arch, Config, LayerSpec, SUPPORTED};
pub use cpu::CpuBackend;
pub use dequant::dequantize;
pub use error::{ModelError, StepError};
pub use loaded::Model;
pub use rope::{Rope, RopeStyle, SCALING_TYPES};
pub use sampler::{Sampler, SamplingParams};
pub use step_logits::StepLogits;
