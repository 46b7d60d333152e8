//! Typed weight handles, resolved by GGUF tensor name and shape-checked at load time.

use super::config::Config;
use super::error::ModelError;
use crate::gguf::{GgmlType, Gguf};
use crate::kernels::QMatrix;

/// One transformer block's weights.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: QMatrix,
    pub ffn_norm: Vec<f32>,
    pub w_gate: QMatrix,
    pub w_up: QMatrix,
    pub w_down: QMatrix,
}

/// All the weights of the model.
pub struct Weights {
    pub embed: QMatrix,
    pub layers: Vec<Layer>,
    pub out_norm: Vec<f32>,
    /// `None` when the output head is tied to the embedding.
    pub output: Option<QMatrix>,
}

impl Weights {
    pub fn load(g: &Gguf, c: &Config) -> Result<Self, ModelError> {
        let (d, kv, f) = (c.dim as u64, c.kv_dim() as u64, c.ffn_dim as u64);
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
            layers.push(Layer {
                attn_norm: vector(g, &n("attn_norm.weight"), d)?,
                wq: matrix(g, &n("attn_q.weight"), d, d)?,
                wk: matrix(g, &n("attn_k.weight"), d, kv)?,
                wv: matrix(g, &n("attn_v.weight"), d, kv)?,
                bq: bias("attn_q.bias", d)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                wo: matrix(g, &n("attn_output.weight"), d, d)?,
                ffn_norm: vector(g, &n("ffn_norm.weight"), d)?,
                w_gate: matrix(g, &n("ffn_gate.weight"), d, f)?,
                w_up: matrix(g, &n("ffn_up.weight"), d, f)?,
                w_down: matrix(g, &n("ffn_down.weight"), f, d)?,
            });
        }
        let output = match g.tensor("output.weight") {
            Some(_) => Some(matrix(g, "output.weight", d, c.vocab as u64)?),
            None => None,
        };
        Ok(Self {
            embed: matrix(g, "token_embd.weight", d, c.vocab as u64)?,
            layers,
            out_norm: vector(g, "output_norm.weight", d)?,
            output,
        })
    }

    /// The matrix that maps hidden states to logits.
    pub fn head(&self) -> &QMatrix {
        self.output.as_ref().unwrap_or(&self.embed)
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

fn matrix(g: &Gguf, name: &str, cols: u64, rows: u64) -> Result<QMatrix, ModelError> {
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
    QMatrix::new(t.ty, rows as usize, cols as usize, g.tensor_bytes(t)).ok_or_else(|| {
        ModelError::UnsupportedType {
            name: name.into(),
            ty: t.ty.to_string(),
        }
    })
}

fn vector(g: &Gguf, name: &str, len: u64) -> Result<Vec<f32>, ModelError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
    if t.num_elements() != len || t.dims[0] != len {
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
