//! The model: llama-family config, weights, the forward pass over a planned
//! [`Batch`](crate::kv::Batch) and the sampler. It reads and writes K/V through
//! [`KvStorage`](crate::kv::KvStorage) by page id and never allocates pages; it imports
//! `kv`, `kernels`, `gguf` and `tokenizer`, nothing above.

mod attention;
mod config;
mod error;
mod llama;
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
pub use attention::{attention, attention_with, Heads, Scores, ROW_BLOCK, SPLIT_KEYS};
pub use config::{Activation, Arch, Config, LayerSpec, SUPPORTED};
pub use error::{ModelError, StepError};
pub use llama::Model;
pub use rope::{Rope, RopeStyle, SCALING_TYPES};
pub use sampler::{Sampler, SamplingParams};
pub use step_logits::StepLogits;
