//! Hyper-parameters of a llama-family model, read from GGUF metadata: the architecture
//! (what differs from the llama block), the shape, the RoPE and which layers slide.
//!
//! Each architecture is the llama block with switches set here from
//! `general.architecture` and the metadata (an unknown name is
//! [`ModelError::UnsupportedArchitecture`], listing [`SUPPORTED`]); the forward pass
//! (`forward.rs`) calls them once per layer, never per token:
//!
//! | arch | what differs from llama |
//! |---|---|
//! | llama | Llama 1-3, Mistral, SmolLM; Llama 3's divisors (`rope_freqs.weight` or `rope.scaling.type = llama3`); tied or untied head; every layer slides when `llama.attention.sliding_window` is set |
//! | qwen2 | biases on Q, K, V ([`super::weights::Layer::add_biases`]); NeoX RoPE; a window in the metadata is ignored (as llama.cpp does, for qwen3 too) |
//! | qwen3 | per-head RMSNorm on Q and K before RoPE; head size from `attention.key_length` (Q wider than the model) |
//! | phi3 | `attn_qkv` and `ffn_up` fused, split at load (`weights.rs`); Q scaled before attention; long-context files: longrope (`rope.rs`) |
//! | gemma2 | embedding × sqrt(dim); GeGLU; post-attention and post-FFN norms; Q scaled by 1/sqrt(head); scores and logits soft-capped; even layers slide (default window 4096) |
//! | gemma3 | Gemma 2 without soft-capped scores, with Q/K norms; five local layers to a global one (`attention.sliding_window_pattern`: a period or a flag per layer); local layers use `rope.freq_base_swa` and no scaling |
//!
//! Every architecture is checked against llama.cpp on a tiny random model
//! (`tests/it/architectures.rs`). A sliding-window layer's query at `p` reads keys
//! `p + 1 - w ..= p`; which pages a sequence can then give up is the scheduler's
//! (`engine/scheduler.rs`) and the page table's (`kv/table.rs`) business.

use super::attention::Scores;
use super::error::ModelError;
use super::ops;
pub use super::rope::{Rope, RopeStyle};
use crate::gguf::{Gguf, Value};
use crate::kernels::{self, Isa};

/// The architectures folio runs, by their `general.architecture` names.
pub const SUPPORTED: &[&str] = &["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"];

/// An architecture folio runs: each is the llama block with the differences below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1-3, Mistral, SmolLM: the baseline.
    Llama,
    /// Biases on Q, K and V; NeoX RoPE.
    Qwen2,
    /// Per-head RMSNorm on Q and K; NeoX RoPE.
    Qwen3,
    /// Fused QKV and gate/up tensors (split at load); NeoX RoPE.
    Phi3,
    /// GeGLU, post-norms, embedding scaling, attention and final logit soft-capping,
    /// alternating sliding-window and global layers; NeoX RoPE.
    Gemma2,
    /// Gemma 2 without attention soft-capping, with Q/K norms, five local layers to a
    /// global one, and a RoPE of their own for the local layers.
    Gemma3,
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) · up.
    SwiGlu,
    /// gelu(gate) · up, with gelu's tanh approximation.
    GeGlu,
}

impl Activation {
    /// `gate` = act(gate) · up, row by row (the same bits on every path).
    pub fn apply(self, isa: Isa, gate: &mut [f32], up: &[f32]) {
        match self {
            Activation::SwiGlu => kernels::swiglu(isa, gate, up),
            Activation::GeGlu => ops::geglu(gate, up),
        }
    }
}

/// How one layer attends.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Keys a query sees: its own and the `w - 1` before it; `None` = all before it.
    pub window: Option<usize>,
    /// Whether the layer uses the local RoPE (`Config::rope_local`).
    pub local_rope: bool,
}

/// What the forward pass needs to know about the model's shape.
#[derive(Debug, Clone)]
pub struct Config {
    pub arch: String,
    pub kind: Arch,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rope: Rope,
    /// The RoPE of local (sliding-window) layers where it differs (Gemma).
    pub rope_local: Option<Rope>,
    pub norm_eps: f32,
    /// Whether q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on Q and K before RoPE (qwen3, gemma3).
    pub qk_norm: bool,
    /// RMSNorm after attention and after the feed-forward, before each residual add.
    pub post_norms: bool,
    pub activation: Activation,
    /// Multiplies the embedding rows (Gemma: sqrt(dim)).
    pub embed_scale: Option<f32>,
    /// Multiplies Q after RoPE, the kernel's own scale then being 1 (Gemma, Phi-3).
    pub q_scale: Option<f32>,
    /// Attention scores become `cap · tanh(score / cap)`.
    pub attn_softcap: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    pub layers: Vec<LayerSpec>,
}

impl Config {
    /// The widest window when every layer slides (Mistral-style); `None` when any layer
    /// attends to all keys (a global layer reads every page, as Gemma's do).
    pub fn sliding_window(&self) -> Option<usize> {
        self.layers
            .iter()
            .map(|l| l.window)
            .try_fold(0, |m, w| w.map(|w| m.max(w)))
            .filter(|&w| w > 0)
    }

    /// From which position on K/V may still be read by queries at positions `len` and
    /// after: a query at `p` sees keys `p + 1 - w ..= p` (see [`LayerSpec::window`]), so
    /// keys before `len + 1 - w` are never read again. `None` when some layer is global.
    pub fn kv_needed_from(&self, len: usize) -> Option<usize> {
        self.sliding_window().map(|w| Self::first_key(w, len))
    }

    /// The first key a query at position `pos` or after reads through a window of `w`.
    pub fn first_key(w: usize, pos: usize) -> usize {
        (pos + 1).saturating_sub(w)
    }

    /// Reads the config of a supported architecture.
    pub fn from_gguf(g: &Gguf) -> Result<Self, ModelError> {
        let (arch, kind) = arch_of(g)?;
        let m = Meta { g, arch: &arch };
        let n_layers = m.int("block_count")?;
        let dim = m.int("embedding_length")?;
        let ffn_dim = m.int("feed_forward_length")?;
        let n_heads = m.int("attention.head_count")?;
        let n_kv_heads = m.opt_int("attention.head_count_kv")?.unwrap_or(n_heads);
        let context_length = m.int("context_length").unwrap_or(2048);
        let head_dim = m.head_dim(dim, n_heads, n_kv_heads)?;
        let rope_dims = m.opt_int("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
            return Err(m.bad(
                "rope.dimension_count",
                format!("{rope_dims} for head size {head_dim}"),
            ));
        }
        let vocab = g
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(|a| a.len())
            .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let norm_eps = m.float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5);
        let style = match kind {
            Arch::Llama => RopeStyle::Adjacent,
            _ => RopeStyle::Halves,
        };
        let rope = Rope::from_gguf(g, &arch, style, rope_dims, context_length)?;
        let gemma = matches!(kind, Arch::Gemma2 | Arch::Gemma3);
        let layers = m.layers(kind, n_layers)?;
        let rope_local = gemma.then(|| m.local_rope(kind, &rope));
        let softcap = |k: &str| m.float(k).filter(|&c| c != 0.0);
        let attn_softcap = match kind {
            Arch::Gemma2 => Some(softcap("attn_logit_softcapping").unwrap_or(50.0)),
            _ => None,
        };
        let final_softcap = match kind {
            Arch::Gemma2 => Some(softcap("final_logit_softcapping").unwrap_or(30.0)),
            Arch::Gemma3 => softcap("final_logit_softcapping"),
            _ => None,
        };
        Ok(Self {
            arch: arch.clone(),
            kind,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_length,
            rope,
            rope_local,
            norm_eps,
            qkv_bias: kind == Arch::Qwen2,
            qk_norm: matches!(kind, Arch::Qwen3 | Arch::Gemma3),
            post_norms: gemma,
            activation: if gemma {
                Activation::GeGlu
            } else {
                Activation::SwiGlu
            },
            embed_scale: gemma.then(|| (dim as f32).sqrt()),
            q_scale: match kind {
                Arch::Gemma2 | Arch::Gemma3 | Arch::Phi3 => Some(1.0 / (head_dim as f32).sqrt()),
                _ => None,
            },
            attn_softcap,
            final_softcap,
            layers,
        })
    }

    /// Width of one token's K (or V) across the KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of one token's Q (and of the attention output) across the heads.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// How layer `l` scores queries against keys: scaled by 1/sqrt(head_dim) unless Q
    /// was scaled already, soft-capped and windowed as the model says.
    pub fn scores(&self, l: usize) -> Scores {
        Scores {
            scale: if self.q_scale.is_some() {
                1.0
            } else {
                1.0 / (self.head_dim as f32).sqrt()
            },
            softcap: self.attn_softcap,
            window: self.layers[l].window,
        }
    }

    /// The RoPE layer `l` applies.
    pub fn rope_of(&self, l: usize) -> &Rope {
        match &self.rope_local {
            Some(r) if self.layers[l].local_rope => r,
            _ => &self.rope,
        }
    }
}

/// The file's architecture, if folio runs it.
fn arch_of(g: &Gguf) -> Result<(String, Arch), ModelError> {
    let arch = g
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::MissingKey("general.architecture".into()))?
        .to_string();
    let kind = match arch.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "phi3" => Arch::Phi3,
        "gemma2" => Arch::Gemma2,
        "gemma3" => Arch::Gemma3,
        _ => {
            return Err(ModelError::UnsupportedArchitecture {
                arch,
                supported: SUPPORTED.join(", "),
            })
        }
    };
    Ok((arch, kind))
}

/// The architecture's metadata keys (`{arch}.{key}`), read with range checks.
struct Meta<'a> {
    g: &'a Gguf,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn bad(&self, k: &str, reason: String) -> ModelError {
        ModelError::BadMetadata {
            key: self.key(k),
            reason,
        }
    }

    /// A required integer in 1..=2^24.
    fn int(&self, k: &str) -> Result<usize, ModelError> {
        let full = self.key(k);
        let v = (self.g.get(&full))
            .ok_or_else(|| ModelError::MissingKey(full.clone()))?
            .as_u64()
            .ok_or_else(|| self.bad(k, "not a non-negative integer".into()))?;
        if v == 0 || v > 1 << 24 {
            return Err(self.bad(k, format!("{v} is out of range")));
        }
        Ok(v as usize)
    }

    /// An integer that may be absent, in range where present.
    fn opt_int(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.g.get(&self.key(k)) {
            Some(_) => self.int(k).map(Some),
            None => Ok(None),
        }
    }

    fn float(&self, k: &str) -> Option<f32> {
        self.g
            .get(&self.key(k))
            .and_then(Value::as_f64)
            .map(|v| v as f32)
    }

    /// The head size (the key length, or `dim / n_heads`), checked against the value
    /// length and the KV heads.
    fn head_dim(&self, dim: usize, n_heads: usize, n_kv_heads: usize) -> Result<usize, ModelError> {
        let head_dim = match self.opt_int("attention.key_length")? {
            Some(hd) => hd,
            None if dim.is_multiple_of(n_heads) => dim / n_heads,
            None => {
                return Err(self.bad(
                    "attention.head_count",
                    format!("{n_heads} does not divide {dim}"),
                ))
            }
        };
        if self
            .opt_int("attention.value_length")?
            .is_some_and(|v| v != head_dim)
        {
            return Err(self.bad(
                "attention.value_length",
                format!("differs from the key length {head_dim}"),
            ));
        }
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(self.bad(
                "attention.head_count_kv",
                format!("{n_kv_heads} does not divide {n_heads} heads"),
            ));
        }
        Ok(head_dim)
    }

    /// How each layer attends. Which layers slide: Gemma 2 every other one (from the
    /// first), Gemma 3 five in six, unless the metadata gives the pattern (a period, or
    /// a flag per layer); llama and Mistral every layer when the metadata names a
    /// window. Qwen's and Phi-3's windows are ignored, as llama.cpp ignores them.
    fn layers(&self, kind: Arch, n_layers: usize) -> Result<Vec<LayerSpec>, ModelError> {
        let window = self.opt_int("attention.sliding_window")?;
        let window = match kind {
            Arch::Gemma2 => Some(window.unwrap_or(4096)),
            Arch::Llama | Arch::Gemma3 => window,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 => None,
        };
        let gemma = matches!(kind, Arch::Gemma2 | Arch::Gemma3);
        let sliding: Vec<bool> = match (window, gemma) {
            (None, _) => vec![false; n_layers],
            (Some(_), true) => self.sliding_pattern(kind, n_layers)?,
            (Some(_), false) => vec![true; n_layers],
        };
        Ok((sliding.iter())
            .map(|&s| LayerSpec {
                window: window.filter(|_| s),
                local_rope: s && gemma,
            })
            .collect())
    }

    /// Gemma's sliding layers: a flag per layer, or a period (the last layer of each
    /// period is global).
    fn sliding_pattern(&self, kind: Arch, n_layers: usize) -> Result<Vec<bool>, ModelError> {
        let k = "attention.sliding_window_pattern";
        match self.g.get(&self.key(k)) {
            Some(Value::Array(flags)) => {
                let flags: Option<Vec<bool>> = flags.iter().map(Value::as_bool).collect();
                match flags {
                    Some(f) if f.len() == n_layers => Ok(f),
                    _ => Err(self.bad(k, format!("not {n_layers} booleans"))),
                }
            }
            given => {
                let n = match given {
                    Some(_) => self.int(k)?,
                    None if kind == Arch::Gemma2 => 2,
                    None => 6,
                };
                Ok((0..n_layers).map(|l| l % n < n - 1).collect())
            }
        }
    }

    /// Gemma's local layers' RoPE: a base of their own (by default Gemma 2's global
    /// one, Gemma 3's 10000) and, on Gemma 3, no scaling (its scaling is for its global
    /// layers).
    fn local_rope(&self, kind: Arch, rope: &Rope) -> Rope {
        let default = if kind == Arch::Gemma3 {
            10000.0
        } else {
            rope.base
        };
        let base = self.float("rope.freq_base_swa").unwrap_or(default);
        let mut r = rope.clone().with_base(base);
        if kind == Arch::Gemma3 {
            r.freq_scale = 1.0;
        }
        r
    }
}
