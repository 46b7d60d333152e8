//! folio: an LLM inference engine built around a paged KV cache.
//!
//! # Layout
//! - [`gguf`]: the GGUF file reader (mmap, bounds-checked).
//! - [`kernels`]: quantized formats, SIMD dot products with scalar twins, matmul, threads.
//! - [`tokenizer`]: BPE tokenizer and chat template from GGUF metadata.
//! - [`model`]: the llama-family forward pass, its KV cache and the sampler.
//! - [`engine`]: the engine thread: continuous batching, preemption, the Context API.
//! - [`generate`]: one completion on one sequence (prefix reuse, stop strings, stats).
//! - [`tiny`]: a tiny random model as a real GGUF file, for tests.
//! - [`error`]: typed errors of every module.

pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod rng;
pub mod tiny;
pub mod tokenizer;
