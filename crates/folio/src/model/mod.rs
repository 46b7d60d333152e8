//! The model: llama-family config, weights, the forward pass, its KV cache and sampling.

mod attention;
mod cache;
mod config;
mod llama;
mod ops;
pub mod sampler;
mod weights;

pub use attention::{attention, Heads, SPLIT_KEYS};
pub use cache::{BasicCache, KvBatch, KvCache};
pub use config::{Config, RopeStyle};
pub use llama::{Logits, Model, Step};
pub use sampler::{Sampler, SamplingParams};
