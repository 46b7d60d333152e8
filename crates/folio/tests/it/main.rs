//! folio's integration tests, one binary (one link, one start-up): the real default
//! model and tiny random models, through the public API only.

mod common;

mod architectures;
mod backend;
mod batch;
mod config;
mod context;
mod embeddings;
mod engine;
mod family_templates;
mod family_tokenizers;
mod fidelity;
mod fidelity_f64;
mod fidelity_f64_gemma;
mod fidelity_f64_long;
mod formats;
mod gguf_errors;
mod grammar;
mod kv_disk;
mod kv_props;
mod kv_q8;
mod layering;
mod outliers;
mod paged;
mod quant_reference;
mod readme;
mod sliding_window;
mod snapshot_hostile;
mod spec;
mod tiny_model;
mod tokenizer_parity;
