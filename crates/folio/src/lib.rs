//! folio: an LLM inference engine built around a paged KV cache.
//!
//! # Layout
//! - [`gguf`]: the GGUF file reader (mmap, bounds-checked).
//! - [`kernels`]: quantized formats, SIMD dot products with scalar twins, matmul, threads.
//! - [`tokenizer`]: BPE tokenizer and chat template from GGUF metadata.
//! - [`model`]: the llama-family forward pass, its KV cache and the sampler.
//! - [`error`]: typed errors of every module.
#![deny(missing_docs)]
#![allow(missing_docs)]

pub mod error;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod model;
pub mod tokenizer;
