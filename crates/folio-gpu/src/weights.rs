//! The model's weights in device memory, uploaded once. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16 and BF16 matrices go up as the file stores
//! them: their blocks are decoded in the matmul kernel. A matrix the kernels cannot
//! read so (rows not whole blocks) is dequantized on the host and goes up as f32 (four
//! bytes a weight: correct, but not the memory or bandwidth of its format). Norms and
//! biases go up as f32. The embedding stays on the host in its stored form: a step looks up
//! only its own tokens' rows.

use crate::device::Gpu;
use crate::error::GpuError;
use folio::gguf::{GgmlType, Gguf, TensorInfo};
use folio::model::{dequantize, Config};

/// How a matrix's words are read by the matmul kernel. The discriminants are the
/// formats' numbers in `matmul_f32_inputs.wgsl` (its `FORMAT` constant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Format {
    Q4_0 = 0,
    Q4_1 = 1,
    Q5_0 = 2,
    Q8_0 = 3,
    Q4K = 4,
    Q6K = 5,
    F32 = 6,
    Q5K = 7,
    F16 = 8,
    Q5_1 = 9,
    Iq4Nl = 10,
    Q2K = 11,
    Q3K = 12,
    Bf16 = 13,
}

impl Format {
    /// Every format, in the order of their numbers.
    pub const ALL: [Format; 14] = [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q8_0,
        Format::Q4K,
        Format::Q6K,
        Format::F32,
        Format::Q5K,
        Format::F16,
        Format::Q5_1,
        Format::Iq4Nl,
        Format::Q2K,
        Format::Q3K,
        Format::Bf16,
    ];

    /// The format's number in `matmul_f32_inputs.wgsl` (its `FORMAT` constant).
    pub fn wgsl(self) -> u32 {
        self as u32
    }
}

/// A matrix of `rows` outputs × `cols` inputs on the device, in pieces of whole rows
/// (one, unless the matrix is larger than one binding holds: a tied head of a large
/// vocabulary on a device that binds 128 MiB).
pub(crate) struct Matrix {
    /// Each piece's buffer, its first row and its rows.
    pub pieces: Vec<(wgpu::Buffer, usize, usize)>,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub bytes: usize,
}

/// One block's weights.
pub(crate) struct Layer {
    pub attn_norm: wgpu::Buffer,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    /// Q, K and V biases (Qwen2), each its matrix's rows long.
    pub biases: Option<[wgpu::Buffer; 3]>,
    /// Per-head RMSNorm weights of Q and K (Qwen3, Gemma 3), `head_dim` long.
    pub qk_norm: Option<[wgpu::Buffer; 2]>,
    pub wo: Matrix,
    /// The norm of the attention's output before the residual (Gemma's post-norms).
    pub post_attn_norm: Option<wgpu::Buffer>,
    pub ffn_norm: wgpu::Buffer,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    /// The norm of the feed-forward's output before the residual.
    pub post_ffn_norm: Option<wgpu::Buffer>,
}

/// The embedding table on the host, rows as stored.
pub(crate) struct Embedding {
    ty: GgmlType,
    row_bytes: usize,
    dim: usize,
    bytes: Vec<u8>,
}

impl Embedding {
    /// Token `t`'s row as floats.
    pub fn row(&self, t: u32) -> Vec<f32> {
        let at = t as usize * self.row_bytes;
        dequantize(self.ty, 1, self.dim, &self.bytes[at..at + self.row_bytes])
            .expect("the type was checked at load")
    }
}

/// Every weight of the model.
pub(crate) struct Weights {
    pub layers: Vec<Layer>,
    pub out_norm: wgpu::Buffer,
    pub head: Matrix,
    pub embed: Embedding,
    /// Matrices that went up as f32 because the kernels do not read their type.
    pub widened: usize,
}

impl Weights {
    /// Every matrix: each layer's, then the head.
    pub fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let per_layer = self
            .layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        per_layer.chain([&self.head])
    }

    /// Bytes of weights one decode step reads.
    pub fn bytes_per_token(&self) -> usize {
        self.matrices().map(|m| m.bytes).sum()
    }
}

/// What the GPU path runs: the llama family's layer (RMSNorm, RoPE, GQA, a SiLU- or
/// GELU-gated MLP) with Q/K/V biases, per-head Q/K norms, post-norms, soft-capping and
/// a second, local RoPE where the model has them (Qwen 2 and 3, Gemma 2 and 3).
/// Anything else is [`GpuError::Unsupported`], for the CPU to run.
pub(crate) fn check(c: &Config) -> Result<(), GpuError> {
    let no = |what: &str| Err(GpuError::Unsupported(format!("{} ({what})", c.arch)));
    if c.rope_local.as_ref().is_some_and(|l| l.dims != c.rope.dims) {
        return no("a local RoPE over other dimensions than the global one");
    }
    if !c.head_dim.is_multiple_of(2) || c.head_dim > 256 || c.rope.dims > c.head_dim {
        return no("a head size above 256 or odd");
    }
    if c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return no("query heads not a multiple of K/V heads");
    }
    // The matmuls split their inputs into chunks of 32 (`matmul_common.wgsl`).
    if [c.dim, c.q_dim(), c.ffn_dim]
        .iter()
        .any(|w| !w.is_multiple_of(32))
    {
        return no("a matmul input width not a multiple of 32");
    }
    Ok(())
}

/// Loads the weights of `c`'s model from `g` onto `gpu`.
pub(crate) fn load(gpu: &Gpu, g: &Gguf, c: &Config) -> Result<Weights, GpuError> {
    check(c)?;
    let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn_dim);
    let qd = c.q_dim();
    let mut widened = 0;
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let mut m = |name: &str, cols: usize, parts: &[usize]| {
            matrices(gpu, g, &n(name), cols, parts, &mut widened)
        };
        let [wq, wk, wv] = match g.tensor(&n("attn_qkv.weight")) {
            Some(_) => three(m("attn_qkv.weight", d, &[qd, kv, kv])?),
            None => [
                one(m("attn_q.weight", d, &[qd])?),
                one(m("attn_k.weight", d, &[kv])?),
                one(m("attn_v.weight", d, &[kv])?),
            ],
        };
        let [w_gate, w_up] = match g.tensor(&n("ffn_gate.weight")) {
            Some(_) => [
                one(m("ffn_gate.weight", d, &[f])?),
                one(m("ffn_up.weight", d, &[f])?),
            ],
            None => two(m("ffn_up.weight", d, &[f, f])?),
        };
        let wo = one(m("attn_output.weight", qd, &[d])?);
        let w_down = one(m("ffn_down.weight", f, &[d])?);
        let v = |name: &str, len: usize| vector(gpu, g, &n(name), len);
        let biases = match c.qkv_bias {
            true => Some([
                v("attn_q.bias", qd)?,
                v("attn_k.bias", kv)?,
                v("attn_v.bias", kv)?,
            ]),
            false => None,
        };
        let qk_norm = match c.qk_norm {
            true => Some([
                v("attn_q_norm.weight", c.head_dim)?,
                v("attn_k_norm.weight", c.head_dim)?,
            ]),
            false => None,
        };
        let post = |name: &str| c.post_norms.then(|| v(name, d)).transpose();
        layers.push(Layer {
            attn_norm: v("attn_norm.weight", d)?,
            wq,
            wk,
            wv,
            biases,
            qk_norm,
            wo,
            post_attn_norm: post("post_attention_norm.weight")?,
            ffn_norm: v("ffn_norm.weight", d)?,
            w_gate,
            w_up,
            w_down,
            post_ffn_norm: post("post_ffw_norm.weight")?,
        });
    }
    let head_name = if g.tensor("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let head = one(matrices(gpu, g, head_name, d, &[c.vocab], &mut widened)?);
    let t = tensor(g, "token_embd.weight", d, c.vocab)?;
    let row_bytes = row_bytes(t, d)?;
    if dequantize(t.ty, 1, d, &g.tensor_bytes(t)[..row_bytes]).is_none() {
        return Err(unsupported_type(t));
    }
    let embed = Embedding {
        ty: t.ty,
        row_bytes,
        dim: d,
        bytes: g.tensor_bytes(t).to_vec(),
    };
    if widened > 0 {
        tracing::info!(
            matrices = widened,
            "gpu: matrices of a type the kernels do not read went up as f32"
        );
    }
    Ok(Weights {
        layers,
        out_norm: vector(gpu, g, "output_norm.weight", d)?,
        head,
        embed,
        widened,
    })
}

fn one(mut v: Vec<Matrix>) -> Matrix {
    v.remove(0)
}

fn two(v: Vec<Matrix>) -> [Matrix; 2] {
    v.try_into().ok().expect("two parts asked for")
}

fn three(v: Vec<Matrix>) -> [Matrix; 3] {
    v.try_into().ok().expect("three parts asked for")
}

fn unsupported_type(t: &TensorInfo) -> GpuError {
    GpuError::Model(folio::ModelError::UnsupportedType {
        name: t.name.clone(),
        ty: t.ty.to_string(),
    })
}

fn tensor<'a>(
    g: &'a Gguf,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<&'a TensorInfo, GpuError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| folio::ModelError::MissingTensor(name.into()))?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(folio::ModelError::BadShape {
            name: name.into(),
            got: t.dims.clone(),
            expected: vec![cols as u64, rows as u64],
        }
        .into());
    }
    Ok(t)
}

fn row_bytes(t: &TensorInfo, cols: usize) -> Result<usize, GpuError> {
    t.ty.row_bytes(cols as u64)
        .map(|b| b as usize)
        .ok_or_else(|| unsupported_type(t))
}

/// The matrix `name` of `cols` columns split into consecutive row ranges of `parts`
/// rows each (one part: the whole matrix), uploaded.
fn matrices(
    gpu: &Gpu,
    g: &Gguf,
    name: &str,
    cols: usize,
    parts: &[usize],
    widened: &mut usize,
) -> Result<Vec<Matrix>, GpuError> {
    let t = tensor(g, name, cols, parts.iter().sum())?;
    let rb = row_bytes(t, cols)?;
    let bytes = g.tensor_bytes(t);
    let mut at = 0;
    let mut out = Vec::with_capacity(parts.len());
    for &rows in parts {
        let part = &bytes[at * rb..(at + rows) * rb];
        at += rows;
        let (format, data): (Format, std::borrow::Cow<[u8]>) = match t.ty {
            GgmlType::Q4_0 if cols.is_multiple_of(32) => (Format::Q4_0, part.into()),
            GgmlType::Q4_1 if cols.is_multiple_of(32) => (Format::Q4_1, part.into()),
            GgmlType::Q5_0 if cols.is_multiple_of(32) => (Format::Q5_0, part.into()),
            GgmlType::Q8_0 if cols.is_multiple_of(32) => (Format::Q8_0, part.into()),
            GgmlType::Q4_K if cols.is_multiple_of(256) => (Format::Q4K, part.into()),
            GgmlType::Q6_K if cols.is_multiple_of(256) => (Format::Q6K, part.into()),
            GgmlType::Q5_K if cols.is_multiple_of(256) => (Format::Q5K, part.into()),
            GgmlType::Q5_1 if cols.is_multiple_of(32) => (Format::Q5_1, part.into()),
            GgmlType::IQ4_NL if cols.is_multiple_of(32) => (Format::Iq4Nl, part.into()),
            GgmlType::Q2_K if cols.is_multiple_of(256) => (Format::Q2K, part.into()),
            GgmlType::Q3_K if cols.is_multiple_of(256) => (Format::Q3K, part.into()),
            GgmlType::F32 => (Format::F32, part.into()),
            GgmlType::F16 if cols.is_multiple_of(32) => (Format::F16, part.into()),
            GgmlType::BF16 if cols.is_multiple_of(32) => (Format::Bf16, part.into()),
            _ => {
                let v = dequantize(t.ty, rows, cols, part).ok_or_else(|| unsupported_type(t))?;
                *widened += 1;
                (Format::F32, bytemuck::cast_slice(&v).to_vec().into())
            }
        };
        // Pieces of whole rows, each within one binding.
        let row = data.len() / rows.max(1);
        let per = (gpu.max_binding() as usize / row.max(1)).min(rows.max(1));
        if per == 0 {
            return Err(GpuError::TooLarge {
                what: format!("a row of matrix {name}"),
                bytes: row as u64,
                limit: gpu.max_binding(),
            });
        }
        let pieces = (0..rows)
            .step_by(per)
            .map(|first| {
                let n = per.min(rows - first);
                let bytes = &data[first * row..(first + n) * row];
                (gpu.upload(name, bytes), first, n)
            })
            .collect();
        out.push(Matrix {
            pieces,
            format,
            rows,
            cols,
            bytes: data.len(),
        });
    }
    Ok(out)
}

/// The vector `name` of `len` floats, uploaded.
fn vector(gpu: &Gpu, g: &Gguf, name: &str, len: usize) -> Result<wgpu::Buffer, GpuError> {
    let t = g
        .tensor(name)
        .ok_or_else(|| folio::ModelError::MissingTensor(name.into()))?;
    if t.num_elements() != len as u64 {
        return Err(folio::ModelError::BadShape {
            name: name.into(),
            got: t.dims.clone(),
            expected: vec![len as u64],
        }
        .into());
    }
    let v = dequantize(t.ty, 1, len, g.tensor_bytes(t)).ok_or_else(|| unsupported_type(t))?;
    Ok(gpu.upload(name, bytemuck::cast_slice(&v)))
}

#[cfg(test)]
mod tests {
    use super::Format;

    /// The kernels keep one pipeline per format at index `wgsl()`, built in `ALL`'s order.
    #[test]
    fn every_format_is_listed_at_its_number() {
        for (i, f) in Format::ALL.iter().enumerate() {
            assert_eq!(f.wgsl() as usize, i, "{f:?}");
        }
    }
}
