//! Typed weight handles, resolved by GGUF tensor name and shape-checked at load time.

use super::config::{Arch, Config};
use super::error::ModelError;
use super::rope::LongRope;
use crate::gguf::{GgmlType, Gguf};
use crate::kernels::matmul::RowSource;
use crate::kernels::{Isa, QMatrix};

/// One transformer block's weights.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// Per-head RMSNorm weights of Q and K (`head_dim` each).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: QMatrix,
    /// RMSNorm of the attention output before its residual add (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: QMatrix,
    pub w_up: QMatrix,
    pub w_down: QMatrix,
    /// RMSNorm of the feed-forward output before its residual add (Gemma).
    pub post_ffn_norm: Option<Vec<f32>>,
}

impl Layer {
    /// Adds the Q, K and V biases where the layer has them (Qwen2) to every row.
    pub fn add_biases(&self, q: &mut [f32], k: &mut [f32], v: &mut [f32]) {
        for (bias, out) in [(&self.bq, q), (&self.bk, k), (&self.bv, v)] {
            if let Some(b) = bias {
                for row in out.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
                }
            }
        }
    }
}

/// All the weights of the model.
pub struct Weights {
    pub embed: QMatrix,
    pub layers: Vec<Layer>,
    pub out_norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    pub output: Option<QMatrix>,
}

/// The RoPE's per-frequency divisors the file stores: Llama 3's (`rope_freqs.weight`,
/// as llama.cpp's converter stores its scaling), or Phi-3's long-context pair
/// (`rope_factors_short` / `_long.weight`), of which the model's context picks one
/// (`rope::LongRope`). Part of the model's description, whatever backend runs it.
pub fn rope_divisors(
    g: &Gguf,
    c: &Config,
) -> Result<(Option<Vec<f32>>, Option<LongRope>), ModelError> {
    let n_factors = c.rope.dims as u64 / 2;
    let factors = |name: &str| -> Result<Option<Vec<f32>>, ModelError> {
        g.tensor(name)
            .map(|_| divisors(g, name, n_factors))
            .transpose()
    };
    let rope_freqs = factors("rope_freqs.weight")?;
    let short = factors("rope_factors_short.weight")?;
    let long = factors("rope_factors_long.weight")?;
    let longrope = (short.is_some() || long.is_some()).then_some(LongRope {
        short,
        long,
        n_ctx_orig: c.rope.yarn.0,
    });
    Ok((rope_freqs, longrope))
}

impl Weights {
    /// The model's weights out of `g`, each matrix packed once, straight into the
    /// layout `isa`'s kernels read, and its file pages released once copied (the file
    /// is never resident beside the copies).
    pub fn load(g: &Gguf, c: &Config, isa: Isa) -> Result<Self, ModelError> {
        let (d, kv, f) = (c.dim as u64, c.kv_dim() as u64, c.ffn_dim as u64);
        let (qd, hd) = (c.q_dim() as u64, c.head_dim as u64);
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let bias = |s: &str, len: u64| -> Result<Option<Vec<f32>>, ModelError> {
                if c.qkv_bias {
                    vector(g, &n(s), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            let norm = |s: &str, len: u64, present: bool| -> Result<Option<Vec<f32>>, ModelError> {
                present.then(|| vector(g, &n(s), len)).transpose()
            };
            // Phi-3 stores Q, K and V as one matrix, and gate and up as one: their
            // rows are split here, so the forward pass sees the usual matrices.
            let [wq, wk, wv] = match g.tensor(&n("attn_qkv.weight")) {
                Some(_) => split(g, isa, &n("attn_qkv.weight"), d, [qd, kv, kv])?,
                None => [
                    matrix(g, isa, &n("attn_q.weight"), d, qd)?,
                    matrix(g, isa, &n("attn_k.weight"), d, kv)?,
                    matrix(g, isa, &n("attn_v.weight"), d, kv)?,
                ],
            };
            let [w_gate, w_up] = match g.tensor(&n("ffn_gate.weight")) {
                Some(_) => [
                    matrix(g, isa, &n("ffn_gate.weight"), d, f)?,
                    matrix(g, isa, &n("ffn_up.weight"), d, f)?,
                ],
                None => split(g, isa, &n("ffn_up.weight"), d, [f, f])?,
            };
            layers.push(Layer {
                attn_norm: vector(g, &n("attn_norm.weight"), d)?,
                wq,
                wk,
                wv,
                bq: bias("attn_q.bias", qd)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                q_norm: norm("attn_q_norm.weight", hd, c.qk_norm)?,
                k_norm: norm("attn_k_norm.weight", hd, c.qk_norm)?,
                wo: matrix(g, isa, &n("attn_output.weight"), qd, d)?,
                post_attn_norm: norm("post_attention_norm.weight", d, c.post_norms)?,
                ffn_norm: vector(g, &n("ffn_norm.weight"), d)?,
                w_gate,
                w_up,
                w_down: matrix(g, isa, &n("ffn_down.weight"), f, d)?,
                post_ffn_norm: norm("post_ffw_norm.weight", d, c.post_norms)?,
            });
        }
        // Gemma 2's head is its embedding even where the file holds an output matrix,
        // as llama.cpp reads it.
        let output = match g.tensor("output.weight") {
            Some(_) if c.kind != Arch::Gemma2 => {
                Some(matrix(g, isa, "output.weight", d, c.vocab as u64)?)
            }
            _ => None,
        };
        Ok(Self {
            embed: matrix(g, isa, "token_embd.weight", d, c.vocab as u64)?,
            layers,
            out_norm: vector(g, "output_norm.weight", d)?,
            output,
        })
    }

    /// Whether some layer norms a residual branch's output before adding it (Gemma):
    /// only then does that output need a buffer of its own.
    pub fn post_norms(&self) -> bool {
        (self.layers.iter()).any(|l| l.post_attn_norm.is_some() || l.post_ffn_norm.is_some())
    }

    /// The matrix that maps hidden states to logits.
    pub fn head(&self) -> &QMatrix {
        self.output.as_ref().unwrap_or(&self.embed)
    }

    /// The output head, to change (a tied head is the embedding: its lookups read
    /// each row's first `dim` values, whatever columns follow them).
    pub fn head_mut(&mut self) -> &mut QMatrix {
        self.output.as_mut().unwrap_or(&mut self.embed)
    }

    /// Every matrix, layer by layer, then the embedding and the untied head.
    fn matrices_mut(&mut self) -> Vec<&mut QMatrix> {
        let mut ms: Vec<&mut QMatrix> = Vec::new();
        for l in &mut self.layers {
            ms.extend([
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.w_gate,
                &mut l.w_up,
                &mut l.w_down,
            ]);
        }
        ms.push(&mut self.embed);
        if let Some(o) = &mut self.output {
            ms.push(o);
        }
        ms
    }

    /// Every matrix in the layout `isa`'s kernels read (with `llama`, those that sum in
    /// llama.cpp's order: [`QMatrix::llama_layout_for`]).
    pub fn lay_out_for(&mut self, isa: Isa, llama: bool) {
        for m in self.matrices_mut() {
            m.lay_out_for(isa, llama);
        }
    }

    /// Every matrix's words in one region backed by huge pages ([`QMatrix::gather`]):
    /// once the matrices are final (laid out, outlier columns added).
    pub fn gather(&mut self) {
        QMatrix::gather(&mut self.matrices_mut());
    }

    /// Bytes of weights read by one decode step.
    pub fn bytes_per_token(&self) -> usize {
        let per_layer: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .iter()
                    .map(|m| m.size_bytes())
                    .sum::<usize>()
            })
            .sum();
        per_layer + self.head().size_bytes()
    }
}

fn matrix(g: &Gguf, isa: Isa, name: &str, cols: u64, rows: u64) -> Result<QMatrix, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if t.dims != [cols, rows] {
        return Err(ModelError::BadShape {
            name: name.into(),
            got: t.dims.clone(),
            expected: vec![cols, rows],
        });
    }
    let bytes = g.tensor_bytes(t);
    let unsupported = || ModelError::UnsupportedType {
        name: name.into(),
        ty: t.ty.to_string(),
    };
    let row_bytes = t.ty.row_bytes(cols).ok_or_else(unsupported)? as usize;
    if bytes.len() != row_bytes * rows as usize {
        return Err(unsupported());
    }
    let m = released_as_read(g, t.offset as usize, row_bytes, |source| {
        QMatrix::from_rows(isa, t.ty, (rows as usize, cols as usize), source)
    });
    g.release_tensor(t);
    m.ok_or_else(unsupported)
}

/// Runs `pack` with a source of rows of `row_bytes` starting at byte `at` of the file,
/// which releases the file's pages behind the rows read, a few MiB at a time: a tensor
/// being packed is not held twice either.
fn released_as_read<T>(
    g: &Gguf,
    at: usize,
    row_bytes: usize,
    pack: impl FnOnce(RowSource) -> T,
) -> T {
    const STRIDE: usize = 4 << 20;
    let file = g.bytes();
    let done = std::cell::Cell::new(at);
    let source = |r: usize, out: &mut Vec<u8>| {
        let start = at + r * row_bytes;
        out.extend_from_slice(&file[start..start + row_bytes]);
        if start - done.get() >= STRIDE {
            g.release(done.get()..start);
            done.set(start);
        }
    };
    pack(&source)
}

fn vector(g: &Gguf, name: &str, len: u64) -> Result<Vec<f32>, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if t.num_elements() != len || t.dims.first() != Some(&len) {
        return Err(ModelError::BadShape {
            name: name.into(),
            got: t.dims.clone(),
            expected: vec![len],
        });
    }
    let m = QMatrix::new(t.ty, 1, len as usize, g.tensor_bytes(t))
        .filter(|_| matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
        .ok_or_else(|| ModelError::UnsupportedType {
            name: name.into(),
            ty: t.ty.to_string(),
        })?;
    let mut v = vec![0f32; len as usize];
    m.dequant_row(0, &mut v);
    Ok(v)
}

/// The RoPE divisors `name` (`len` of them): each finite and positive, for the angle
/// is divided by it.
fn divisors(g: &Gguf, name: &str, len: u64) -> Result<Vec<f32>, ModelError> {
    let v = vector(g, name, len)?;
    match v.iter().position(|&f| !(f.is_finite() && f > 0.0)) {
        Some(i) => Err(ModelError::BadValues {
            name: name.into(),
            reason: format!("divisor {i} is {}; RoPE divisors must be positive", v[i]),
        }),
        None => Ok(v),
    }
}

/// The matrix `name` of `cols` columns and `parts`' rows in all, as one matrix per part
/// (consecutive rows, in order).
fn split<const N: usize>(
    g: &Gguf,
    isa: Isa,
    name: &str,
    cols: u64,
    parts: [u64; N],
) -> Result<[QMatrix; N], ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    let rows: u64 = parts.iter().sum();
    if t.dims != [cols, rows] {
        return Err(ModelError::BadShape {
            name: name.into(),
            got: t.dims.clone(),
            expected: vec![cols, rows],
        });
    }
    let unsupported = || ModelError::UnsupportedType {
        name: name.into(),
        ty: t.ty.to_string(),
    };
    let row_bytes = t.ty.row_bytes(cols).ok_or_else(unsupported)? as usize;
    let bytes = g.tensor_bytes(t);
    let mut at = 0;
    let mut out = Vec::with_capacity(N);
    for p in parts {
        let len = p as usize * row_bytes;
        let part = bytes.get(at..at + len).ok_or_else(unsupported)?;
        let m = QMatrix::new_for(isa, t.ty, p as usize, cols as usize, part);
        out.push(m.ok_or_else(unsupported)?);
        at += len;
    }
    g.release_tensor(t);
    out.try_into().map_err(|_| unsupported())
}
