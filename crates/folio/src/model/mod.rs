//! The model: llama-family config, weights, the forward pass, its KV cache and sampling.

mod cache;
mod config;
mod llama;
mod ops;
pub mod sampler;
mod weights;

pub use cache::{BasicCache, KvCache};
pub use config::{Config, RopeStyle};
pub use llama::{Logits, Model};
pub use sampler::{Sampler, SamplingParams};
