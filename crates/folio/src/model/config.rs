//! Hyper-parameters of a llama-family model, read from GGUF metadata.

use super::error::ModelError;
use crate::gguf::{Gguf, Value};

/// RoPE variants: llama rotates adjacent pairs, NeoX rotates halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Adjacent,
    Halves,
}

/// What the forward pass needs to know about the model's shape.
#[derive(Debug, Clone)]
pub struct Config {
    pub arch: String,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub rope_dims: usize,
    pub rope_style: RopeStyle,
    pub norm_eps: f32,
    /// Whether q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
}

impl Config {
    /// Reads the config of a supported architecture.
    pub fn from_gguf(g: &Gguf) -> Result<Self, ModelError> {
        let arch = g
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::MissingKey("general.architecture".into()))?
            .to_string();
        let (rope_style, qkv_bias) = match arch.as_str() {
            "llama" => (RopeStyle::Adjacent, false),
            "qwen2" => (RopeStyle::Halves, true),
            _ => return Err(ModelError::UnsupportedArchitecture(arch)),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            let v = g
                .get(&full)
                .ok_or_else(|| ModelError::MissingKey(full.clone()))?
                .as_u64()
                .ok_or_else(|| ModelError::BadMetadata {
                    key: full.clone(),
                    reason: "not a non-negative integer".into(),
                })?;
            if v == 0 || v > 1 << 24 {
                return Err(ModelError::BadMetadata {
                    key: full,
                    reason: format!("{v} is out of range"),
                });
            }
            Ok(v as usize)
        };
        let float = |k: &str, default: f64| -> f32 {
            g.get(&key(k)).and_then(Value::as_f64).unwrap_or(default) as f32
        };
        let n_layers = int("block_count")?;
        let dim = int("embedding_length")?;
        let ffn_dim = int("feed_forward_length")?;
        let n_heads = int("attention.head_count")?;
        let n_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(_) => int("attention.head_count_kv")?,
            None => n_heads,
        };
        let context_length = int("context_length").unwrap_or(2048);
        let bad = |k: &str, reason: String| ModelError::BadMetadata {
            key: key(k),
            reason,
        };
        if !dim.is_multiple_of(n_heads) {
            return Err(bad(
                "attention.head_count",
                format!("{n_heads} does not divide {dim}"),
            ));
        }
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(bad(
                "attention.head_count_kv",
                format!("{n_kv_heads} does not divide {n_heads} heads"),
            ));
        }
        let head_dim = dim / n_heads;
        let rope_dims = g
            .get(&key("rope.dimension_count"))
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(bad(
                "rope.dimension_count",
                format!("{rope_dims} for head size {head_dim}"),
            ));
        }
        let vocab = g
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(|a| a.len())
            .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let rope_base = float("rope.freq_base", 10000.0);
        let norm_eps = float("attention.layer_norm_rms_epsilon", 1e-5);
        Ok(Self {
            arch,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_length,
            rope_base,
            rope_dims,
            rope_style,
            norm_eps,
            qkv_bias,
        })
    }

    /// Width of one token's K (or V) across the KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
