//! The model's weights in device memory, uploaded once. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16 and BF16 matrices go up as the file stores
//! them: their blocks are decoded in the matmul kernel. A matrix the kernels cannot
//! read so (rows not whole blocks) is dequantized on the host and goes up as f32 (four
//! bytes a weight: correct, but not the memory or bandwidth of its format). Norms and
//! biases go up as f32. The embedding table goes up like any matrix (a tied model's
//! is the head's): a step gathers its own tokens' rows on the device.

use crate::device::Gpu;
use crate::error::GpuError;
use folio::gguf::{GgmlType, Gguf, TensorInfo};
use folio::model::{dequantize, Config};
use std::borrow::Cow;
use std::ops::Range;

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

    /// The GGUF type whose blocks it reads (F32: also a matrix widened on the host).
    pub fn ggml(self) -> GgmlType {
        match self {
            Format::Q4_0 => GgmlType::Q4_0,
            Format::Q4_1 => GgmlType::Q4_1,
            Format::Q5_0 => GgmlType::Q5_0,
            Format::Q8_0 => GgmlType::Q8_0,
            Format::Q4K => GgmlType::Q4_K,
            Format::Q6K => GgmlType::Q6_K,
            Format::F32 => GgmlType::F32,
            Format::Q5K => GgmlType::Q5_K,
            Format::F16 => GgmlType::F16,
            Format::Q5_1 => GgmlType::Q5_1,
            Format::Iq4Nl => GgmlType::IQ4_NL,
            Format::Q2K => GgmlType::Q2_K,
            Format::Q3K => GgmlType::Q3_K,
            Format::Bf16 => GgmlType::BF16,
        }
    }

    /// GGUF's name for it, lower case (`q4_k`; `f32` for a matrix widened on the host).
    pub fn name(self) -> String {
        self.ggml().to_string().to_lowercase()
    }

    /// The format's number in `matmul_f32_inputs.wgsl` (its `FORMAT` constant).
    pub fn wgsl(self) -> u32 {
        self as u32
    }
}

/// A matrix of `rows` outputs × `cols` inputs on the device, in pieces of whole rows
/// (one, unless the matrix is larger than one binding holds: a tied head of a large
/// vocabulary on a device that binds 128 MiB). It may be the rows of up to three of the
/// model's matrices one after another, its parts (Q, K and V, or gate and up, where
/// they have one format): one dispatch computes them all, each into its own output
/// (`kernels::Outputs`).
pub(crate) struct Matrix {
    /// What it is in every layer (`attn_q/k/v`, `ffn_down`, `output`): what a profile
    /// calls it.
    pub role: String,
    /// Each piece's buffer, its first row and its rows.
    pub pieces: Vec<(wgpu::Buffer, usize, usize)>,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub bytes: usize,
    /// Each part's rows, in order (one part: the whole matrix).
    pub parts: Vec<usize>,
}

impl Matrix {
    /// The dispatches that compute the matrix: each piece's index and its rows (from the
    /// piece's first) one dispatch takes. `fused`: each piece whole; otherwise each
    /// part's rows in each piece they lie in, part by part (one dispatch a part where
    /// the matrix is one piece).
    pub fn dispatches(&self, fused: bool) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
        let pieces = self.pieces.iter().map(|&(_, first, n)| (first, n));
        dispatches(self.rows, &self.parts, pieces, fused)
    }
}

/// [`Matrix::dispatches`] of a matrix of `rows` in `parts` and `pieces` (each one's first
/// row and rows).
fn dispatches<'a>(
    rows: usize,
    parts: &'a [usize],
    pieces: impl Iterator<Item = (usize, usize)> + Clone + 'a,
    fused: bool,
) -> impl Iterator<Item = (usize, Range<usize>)> + 'a {
    let whole = fused.then_some(0..rows);
    let each = parts.iter().scan(0, |at, &n| {
        *at += n;
        Some(*at - n..*at)
    });
    let ranges = whole.into_iter().chain(each.filter(move |_| !fused));
    ranges.flat_map(move |range| {
        // The range's rows in each piece it reaches, from the piece's first.
        pieces
            .clone()
            .enumerate()
            .filter_map(move |(i, (first, n))| {
                let (start, end) = (range.start.max(first), range.end.min(first + n));
                (start < end).then(|| (i, start - first..end - first))
            })
    })
}

/// One block's weights.
pub(crate) struct Layer {
    pub attn_norm: wgpu::Buffer,
    /// Q, K and V in order, those next to each other in one format in one matrix.
    pub qkv: Vec<Matrix>,
    /// Q, K and V biases (Qwen2), each its matrix's rows long.
    pub biases: Option<[wgpu::Buffer; 3]>,
    /// Per-head RMSNorm weights of Q and K (Qwen3, Gemma 3), `head_dim` long.
    pub qk_norm: Option<[wgpu::Buffer; 2]>,
    pub wo: Matrix,
    /// The norm of the attention's output before the residual (Gemma's post-norms).
    pub post_attn_norm: Option<wgpu::Buffer>,
    pub ffn_norm: wgpu::Buffer,
    /// Gate and up, in one matrix where they have one format.
    pub gate_up: Vec<Matrix>,
    pub w_down: Matrix,
    /// The norm of the feed-forward's output before the residual.
    pub post_ffn_norm: Option<wgpu::Buffer>,
}

/// Every weight of the model.
pub(crate) struct Weights {
    pub layers: Vec<Layer>,
    pub out_norm: wgpu::Buffer,
    pub head: Matrix,
    /// The embedding table where the model does not tie it to the head (a tied
    /// model's table is the head's matrix: [`Weights::table`]).
    pub embed: Option<Matrix>,
    /// Matrices that went up as f32 because the kernels do not read their type.
    pub widened: usize,
}

impl Weights {
    /// Every matrix: each layer's, then the head.
    pub fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let per_layer = self.layers.iter().flat_map(|l| {
            (l.qkv.iter().chain([&l.wo]))
                .chain(l.gate_up.iter())
                .chain([&l.w_down])
        });
        per_layer.chain([&self.head])
    }

    /// Bytes of weights one decode step reads.
    pub fn bytes_per_token(&self) -> usize {
        self.matrices().map(|m| m.bytes).sum()
    }

    /// The embedding table (`Kernels::embed` gathers a step's rows from it).
    pub fn table(&self) -> &Matrix {
        self.embed.as_ref().unwrap_or(&self.head)
    }

    /// The formats its matrices and table are in (`Kernels::for_formats` compiles
    /// theirs only), in the order of [`Format::ALL`].
    pub fn formats(&self) -> Vec<Format> {
        let has = |f: &Format| {
            self.matrices()
                .chain([self.table()])
                .any(|m| m.format == *f)
        };
        Format::ALL.into_iter().filter(has).collect()
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
    // The embedding gather reads a step's tokens as f32 values (`Kernels::embed`).
    if c.vocab > 1 << 24 {
        return no("a vocabulary of more than 2^24 tokens");
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
        let mut rows = |name: &str, cols: usize, parts: &[usize]| {
            decode(g, &n(name), cols, parts, &mut widened)
        };
        let qkv = match g.tensor(&n("attn_qkv.weight")) {
            Some(_) => rows("attn_qkv.weight", d, &[qd, kv, kv])?,
            None => [
                rows("attn_q.weight", d, &[qd])?,
                rows("attn_k.weight", d, &[kv])?,
                rows("attn_v.weight", d, &[kv])?,
            ]
            .into_iter()
            .flatten()
            .collect(),
        };
        let gate_up = match g.tensor(&n("ffn_gate.weight")) {
            Some(_) => [
                rows("ffn_gate.weight", d, &[f])?,
                rows("ffn_up.weight", d, &[f])?,
            ]
            .into_iter()
            .flatten()
            .collect(),
            None => rows("ffn_up.weight", d, &[f, f])?,
        };
        let wo = rows("attn_output.weight", qd, &[d])?;
        let w_down = rows("ffn_down.weight", f, &[d])?;
        let up = |name: &str, parts| upload(gpu, &n(name), d, parts);
        let qkv = up("attn_q/k/v", qkv)?;
        let gate_up = up("ffn_gate/up", gate_up)?;
        let wo = one(upload(gpu, &n("attn_output.weight"), qd, wo)?);
        let w_down = one(upload(gpu, &n("ffn_down.weight"), f, w_down)?);
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
            qkv,
            biases,
            qk_norm,
            wo,
            post_attn_norm: post("post_attention_norm.weight")?,
            ffn_norm: v("ffn_norm.weight", d)?,
            gate_up,
            w_down,
            post_ffn_norm: post("post_ffw_norm.weight")?,
        });
    }
    let head_name = if g.tensor("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let head = decode(g, head_name, d, &[c.vocab], &mut widened)?;
    let mut head = one(upload(gpu, head_name, d, head)?);
    let tied = head_name == "token_embd.weight";
    if tied {
        head.role = "output (token_embd)".into();
    }
    // A table of its own where the model has a head of its own.
    let embed = match tied {
        true => None,
        false => {
            let rows = decode(g, "token_embd.weight", d, &[c.vocab], &mut widened)?;
            Some(one(upload(gpu, "token_embd.weight", d, rows)?))
        }
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

/// Some of a matrix's rows as the kernels read them.
struct Rows<'a> {
    format: Format,
    data: Cow<'a, [u8]>,
    rows: usize,
}

/// The matrix `name` of `cols` columns split into consecutive row ranges of `parts`
/// rows each (one part: the whole matrix), in a format the kernels read (widened to
/// f32 where they read none of its type).
fn decode<'a>(
    g: &'a Gguf,
    name: &str,
    cols: usize,
    parts: &[usize],
    widened: &mut usize,
) -> Result<Vec<Rows<'a>>, GpuError> {
    let t = tensor(g, name, cols, parts.iter().sum())?;
    let rb = row_bytes(t, cols)?;
    let bytes = g.tensor_bytes(t);
    let mut at = 0;
    let mut out = Vec::with_capacity(parts.len());
    for &rows in parts {
        let part = &bytes[at * rb..(at + rows) * rb];
        at += rows;
        // The kernels read a type in its blocks where a row is whole chunks of 32 (a
        // K-quant's, of 256); anything else goes up widened to f32.
        let block = t.ty.block_layout().0.max(32) as usize;
        let read = Format::ALL
            .into_iter()
            .find(|f| f.ggml() == t.ty && (t.ty == GgmlType::F32 || cols.is_multiple_of(block)));
        let (format, data): (Format, Cow<[u8]>) = match read {
            Some(format) => (format, part.into()),
            None => {
                let v = dequantize(t.ty, rows, cols, part).ok_or_else(|| unsupported_type(t))?;
                *widened += 1;
                (Format::F32, bytemuck::cast_slice(&v).to_vec().into())
            }
        };
        out.push(Rows { format, data, rows });
    }
    Ok(out)
}

/// `parts` uploaded, those next to each other in one format (up to three) as one
/// matrix of several parts ([`Matrix::parts`]).
fn upload(gpu: &Gpu, name: &str, cols: usize, parts: Vec<Rows>) -> Result<Vec<Matrix>, GpuError> {
    let mut groups: Vec<Vec<Rows>> = Vec::new();
    for part in parts {
        match groups.last_mut() {
            Some(last) if last[0].format == part.format && last.len() < 3 => last.push(part),
            _ => groups.push(vec![part]),
        }
    }
    groups
        .into_iter()
        .map(|group| {
            let sizes: Vec<usize> = group.iter().map(|p| p.rows).collect();
            let format = group[0].format;
            let data: Cow<[u8]> = match group.len() {
                1 => group.into_iter().next().expect("one part").data,
                _ => group
                    .iter()
                    .map(|p| &p.data[..])
                    .collect::<Vec<_>>()
                    .concat()
                    .into(),
            };
            pieces(gpu, name, (format, &data), cols, sizes)
        })
        .collect()
}

/// A matrix of `parts` (their rows) in `format`, its bytes `data`, uploaded in pieces
/// of whole rows, each within one binding.
fn pieces(
    gpu: &Gpu,
    name: &str,
    (format, data): (Format, &[u8]),
    cols: usize,
    parts: Vec<usize>,
) -> Result<Matrix, GpuError> {
    let rows: usize = parts.iter().sum();
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
    // "blk.3.ffn_down.weight" is "ffn_down".
    let role = match name.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, r)| r),
        None => name,
    };
    Ok(Matrix {
        role: role.trim_end_matches(".weight").to_string(),
        pieces,
        format,
        rows,
        cols,
        bytes: data.len(),
        parts,
    })
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
    use super::{dispatches, Format};

    /// A matrix of parts in pieces (as one larger than a binding goes up): fused, each
    /// piece whole; otherwise each part in each piece it lies in, none past a piece's
    /// ends (a part that ends before a piece starts, or starts after it ends, has no
    /// dispatch there).
    #[test]
    fn a_matrix_is_dispatched_by_pieces_or_by_parts_within_them() {
        let pieces = [(0, 1000), (1000, 1000), (2000, 1000), (3000, 72)];
        let parts = [2048, 512, 512];
        let by =
            |fused| dispatches(3072, &parts, pieces.iter().copied(), fused).collect::<Vec<_>>();
        assert_eq!(
            by(true),
            vec![(0, 0..1000), (1, 0..1000), (2, 0..1000), (3, 0..72)]
        );
        assert_eq!(
            by(false),
            vec![
                (0, 0..1000),
                (1, 0..1000),
                (2, 0..48),
                (2, 48..560),
                (2, 560..1000),
                (3, 0..72)
            ]
        );
        // One piece: one dispatch, or one a part.
        let one =
            |fused| dispatches(3072, &parts, [(0, 3072)].into_iter(), fused).collect::<Vec<_>>();
        assert_eq!(one(true), vec![(0, 0..3072)]);
        assert_eq!(
            one(false),
            vec![(0, 0..2048), (0, 2048..2560), (0, 2560..3072)]
        );
    }

    /// The kernels keep one pipeline per format at index `wgsl()`, built in `ALL`'s order.
    #[test]
    fn every_format_is_listed_at_its_number() {
        for (i, f) in Format::ALL.iter().enumerate() {
            assert_eq!(f.wgsl() as usize, i, "{f:?}");
        }
    }
}
