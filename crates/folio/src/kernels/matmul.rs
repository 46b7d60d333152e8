//! Weight matrices laid out for the kernels, and the threaded matmul
//! `out[t][r] = dot(W[r], x[t])` over a batch of activation rows.
//!
//! Activations are quantized once per input to the format the weights' dot product
//! wants (8-bit blocks for the 32-element formats, Q8_K for the K-quants, f32 for float
//! weights), and several matrices that read the same input (Q, K, V; gate, up) run in
//! one parallel region, split by row tiles across threads. Every output element is
//! computed by exactly one thread with a fixed reduction order, so results do not depend
//! on the thread count or on how many activation rows share the call.

use super::pool::{share, ThreadPool, WorkList};
use super::quant::*;
use super::{scalar, Isa};
use crate::gguf::GgmlType;

/// Runs `$body` with `$d` bound to the 8-bit dot step of `isa`'s AVX2 kernels (a
/// const: `avxvnni::VEX` on the AVX-VNNI path, `avxvnni::EVEX` on the AVX-512 path,
/// else `avxvnni::MADD`; the same bits on every path).
#[cfg(target_arch = "x86_64")]
macro_rules! with_dot {
    ($isa:expr, $d:ident => $body:expr) => {
        if $isa.avx_vnni() {
            const $d: u8 = super::avxvnni::VEX;
            $body
        } else if $isa.avx512() {
            const $d: u8 = super::avxvnni::EVEX;
            $body
        } else {
            const $d: u8 = super::avxvnni::MADD;
            $body
        }
    };
}

/// A weight matrix of `rows` × `cols` in one of the supported formats, copied out of the
/// file into 8-byte-aligned memory at load time.
///
/// NOTE: Q4_1 (the default model's type) and Q8_0 (its output head) are repacked at load
/// into tiles of rows, tile-major, so a tile kernel reads one stream ([`Layout`]); rows
/// past the last whole tile are zero padding. Every other type keeps GGUF's row-major
/// blocks.
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    layout: Layout,
    data: Words,
}

/// A matrix's words: its own buffer, or its range of a region that a model's matrices
/// share ([`QMatrix::gather`]).
enum Words {
    Own(Vec<u64>),
    Shared(std::sync::Arc<Vec<u64>>, std::ops::Range<usize>),
}

impl std::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            Words::Own(v) => v,
            Words::Shared(region, range) => &region[range.clone()],
        }
    }
}

/// How a matrix's blocks lie in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGUF's rows of blocks.
    Rows,
    /// Q4_1 and Q8_0 in tiles of four rows ([`BlockQ4_1x4`], [`BlockQ8_0x4`]): the
    /// scalar, AVX2 and AVX-VNNI kernels' layout, and what [`QMatrix::new`] makes.
    Tiles4,
    /// Q4_1 and Q8_0 in tiles of sixteen rows, one lane per row ([`BlockQ4_1x16`],
    /// [`BlockQ8_0x16`]): the AVX-512 kernels' layout ([`QMatrix::for_isa`]).
    Tiles16,
}

/// A zeroed buffer of `n` words for weights, asked to be backed by 2 MiB pages before
/// anything touches it: decode streams every weight once per token, and with 4 KiB
/// pages the TLB misses on every page. (Large allocations are fresh mappings; the
/// kernel merges adjacent ones with the same advice, so the matrices of a model share
/// huge pages where their span allows.) Advice only: without transparent huge pages
/// nothing changes.
fn weight_buffer(n: usize) -> Vec<u64> {
    let mut v = vec![0u64; n];
    super::advise_huge_pages(&mut v);
    v
}

impl Layout {
    /// Rows per tile (the threaded matmul splits work by tiles; `Rows` by four rows).
    fn tile_rows(self) -> usize {
        match self {
            Layout::Tiles16 => 16,
            _ => 4,
        }
    }
}

/// Which activation format a weight type's dot product consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActKind {
    F32,
    Q8,
    Q8K,
    /// Q8 and each block's -128·Σq: the AVX-512 Q8_0 kernel's start (see
    /// `avx512::tile_q8_0x16`, whose weights are offset by 128).
    Q8Sums,
}

impl QMatrix {
    /// Whether folio can compute with weights of type `ty`.
    pub fn supports(ty: GgmlType) -> bool {
        use GgmlType::*;
        matches!(
            ty,
            F32 | F16
                | BF16
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | IQ4_NL
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
        )
    }

    /// Copies `bytes` (rows × row_bytes) into a matrix. `None` if the type is not
    /// supported or the sizes disagree.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Option<Self> {
        if !Self::supports(ty) {
            return None;
        }
        let row_bytes = ty.row_bytes(cols as u64)? as usize;
        if bytes.len() != row_bytes.checked_mul(rows)? {
            return None;
        }
        if ty == GgmlType::Q4_1 {
            return Some(Self::pack_q4_1(rows, cols, row_bytes, bytes));
        }
        if ty == GgmlType::Q8_0 {
            return Some(Self::pack_q8_0(rows, cols, row_bytes, bytes));
        }
        let mut data = weight_buffer(bytes.len().div_ceil(8));
        bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..bytes.len()].copy_from_slice(bytes);
        Some(Self {
            ty,
            rows,
            cols,
            row_bytes,
            layout: Layout::Rows,
            data: Words::Own(data),
        })
    }

    /// Packs GGUF rows of blocks `B` into tiles `T` of `layout`'s rows, tile-major:
    /// `put(tile, r % tile rows, block)` stores one row's block into its tile. Rows past
    /// the last whole tile stay zero.
    fn pack<B: bytemuck::Pod, T: bytemuck::Pod>(
        (ty, layout): (GgmlType, Layout),
        (rows, cols, row_bytes): (usize, usize, usize),
        bytes: &[u8],
        put: impl Fn(&mut T, usize, B),
    ) -> Self {
        let nb = cols / QK;
        let size = std::mem::size_of::<T>();
        let tr = layout.tile_rows();
        let len = rows.div_ceil(tr) * nb * size;
        let mut data = weight_buffer(len.div_ceil(8));
        let packed: &mut [T] =
            bytemuck::cast_slice_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..len]);
        for r in 0..rows {
            let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
            for (b, raw) in row.chunks_exact(std::mem::size_of::<B>()).enumerate() {
                put(
                    &mut packed[(r / tr) * nb + b],
                    r % tr,
                    bytemuck::pod_read_unaligned(raw),
                );
            }
        }
        Self {
            ty,
            rows,
            cols,
            row_bytes,
            layout,
            data: Words::Own(data),
        }
    }

    fn pack_q4_1(rows: usize, cols: usize, row_bytes: usize, bytes: &[u8]) -> Self {
        let put = |t: &mut BlockQ4_1x4, k: usize, blk: BlockQ4_1| {
            t.dm[k] = blk.d;
            t.dm[4 + k] = blk.m;
            t.qs[k] = blk.qs;
        };
        let shape = (rows, cols, row_bytes);
        Self::pack((GgmlType::Q4_1, Layout::Tiles4), shape, bytes, put)
    }

    fn pack_q8_0(rows: usize, cols: usize, row_bytes: usize, bytes: &[u8]) -> Self {
        let put = |t: &mut BlockQ8_0x4, k: usize, blk: BlockQ8_0| {
            t.d[k] = blk.d;
            t.qs[k].copy_from_slice(&blk.qs[..QK / 2]);
            t.qs[4 + k].copy_from_slice(&blk.qs[QK / 2..]);
        };
        let shape = (rows, cols, row_bytes);
        Self::pack((GgmlType::Q8_0, Layout::Tiles4), shape, bytes, put)
    }

    fn pack_q4_1x16(rows: usize, cols: usize, row_bytes: usize, bytes: &[u8]) -> Self {
        let put = |t: &mut BlockQ4_1x16, r: usize, blk: BlockQ4_1| {
            t.d[r] = blk.d;
            t.m[r] = blk.m;
            for (j, q) in t.qs.iter_mut().enumerate() {
                q[4 * r..4 * r + 4].copy_from_slice(&blk.qs[4 * j..4 * j + 4]);
            }
        };
        let shape = (rows, cols, row_bytes);
        Self::pack((GgmlType::Q4_1, Layout::Tiles16), shape, bytes, put)
    }

    fn pack_q8_0x16(rows: usize, cols: usize, row_bytes: usize, bytes: &[u8]) -> Self {
        let put = |t: &mut BlockQ8_0x16, r: usize, blk: BlockQ8_0| {
            t.d[r] = blk.d;
            for (k, q) in t.qs.iter_mut().enumerate() {
                for j in 0..4 {
                    q[4 * r + j] = (blk.qs[4 * k + j] as u8) ^ 0x80;
                }
            }
        };
        let shape = (rows, cols, row_bytes);
        Self::pack((GgmlType::Q8_0, Layout::Tiles16), shape, bytes, put)
    }

    /// The layout `isa`'s kernels read for a matrix of type `ty`.
    pub fn layout_for(isa: Isa, ty: GgmlType) -> Layout {
        match ty {
            GgmlType::Q4_1 | GgmlType::Q8_0 if isa.avx512() => Layout::Tiles16,
            GgmlType::Q4_1 | GgmlType::Q8_0 => Layout::Tiles4,
            _ => Layout::Rows,
        }
    }

    /// This matrix's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The same weights in the layout `isa`'s kernels read (every path computes with
    /// every layout; the others' fall back to slower kernels).
    pub fn for_isa(self, isa: Isa) -> Self {
        let layout = Self::layout_for(isa, self.ty);
        self.with_layout(layout)
    }

    /// [`QMatrix::for_isa`] in place.
    pub fn lay_out_for(&mut self, isa: Isa) {
        let empty = Self {
            ty: self.ty,
            rows: 0,
            cols: 0,
            row_bytes: 0,
            layout: Layout::Rows,
            data: Words::Own(Vec::new()),
        };
        *self = std::mem::replace(self, empty).for_isa(isa);
    }

    /// The same weights, bit for bit, in `layout` (`Rows` for Q4_1 and Q8_0, or a tile
    /// layout for another type, is not made: the matrix comes back as it is).
    pub fn with_layout(self, layout: Layout) -> Self {
        if layout == self.layout || !matches!(self.ty, GgmlType::Q4_1 | GgmlType::Q8_0) {
            return self;
        }
        let bytes = self.gguf_bytes();
        let (ty, rows, cols, rb) = (self.ty, self.rows, self.cols, self.row_bytes);
        match (layout, ty) {
            (Layout::Tiles16, GgmlType::Q4_1) => Self::pack_q4_1x16(rows, cols, rb, &bytes),
            (Layout::Tiles16, _) => Self::pack_q8_0x16(rows, cols, rb, &bytes),
            (Layout::Tiles4, GgmlType::Q4_1) => Self::pack_q4_1(rows, cols, rb, &bytes),
            (Layout::Tiles4, _) => Self::pack_q8_0(rows, cols, rb, &bytes),
            (Layout::Rows, _) => self,
        }
    }

    /// Moves the matrices' words into one region, each matrix's start on a cache line,
    /// the region asked to be backed by 2 MiB pages ([`weight_buffer`]). Matrices
    /// allocated one by one mostly fall on 4 KiB pages: only a large one (the output
    /// head) spans a whole 2 MiB page, and 30 MB of SmolLM2's 96 were on huge pages.
    /// Decode streams every matrix once per token (missing the TLB on every 4 KiB page
    /// without huge pages). The weights stay the same bits.
    pub fn gather(ms: &mut [&mut QMatrix]) {
        const LINE: usize = 8;
        let total: usize = ms.iter().map(|m| m.data.len().next_multiple_of(LINE)).sum();
        let mut region = weight_buffer(total);
        let mut ranges = Vec::with_capacity(ms.len());
        let mut at = 0;
        for m in ms.iter() {
            let n = m.data.len();
            region[at..at + n].copy_from_slice(&m.data);
            ranges.push(at..at + n);
            at += n.next_multiple_of(LINE);
        }
        let region = std::sync::Arc::new(region);
        for (m, range) in ms.iter_mut().zip(ranges) {
            m.data = Words::Shared(region.clone(), range);
        }
    }

    /// Every row as GGUF stores it, one after another.
    pub(crate) fn gguf_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows * self.row_bytes);
        for r in 0..self.rows {
            match (self.layout, self.ty) {
                (Layout::Rows, _) => out.extend_from_slice(self.row(r)),
                (_, GgmlType::Q8_0) => {
                    out.extend_from_slice(bytemuck::cast_slice(&self.q8_0_row(r)))
                }
                _ => out.extend_from_slice(bytemuck::cast_slice(&self.q4_1_row(r))),
            }
        }
        out
    }

    /// The packed tile t (rows from t × tile rows), as blocks of type `T` (the packed
    /// format).
    fn tile<T: bytemuck::Pod>(&self, t: usize) -> &[T] {
        self.tiles(t, 1)
    }

    /// Packed tiles t..t+count, one after another.
    fn tiles<T: bytemuck::Pod>(&self, t: usize, count: usize) -> &[T] {
        let nb = self.cols / QK;
        let size = std::mem::size_of::<T>();
        let all: &[u8] = bytemuck::cast_slice(&self.data);
        bytemuck::cast_slice(&all[t * nb * size..(t + count) * nb * size])
    }

    /// The packed Q4_1 tile holding rows 4t..4t+4.
    fn tile_q4_1(&self, t: usize) -> &[BlockQ4_1x4] {
        self.tile(t)
    }

    /// The packed Q8_0 tile holding rows 4t..4t+4.
    fn tile_q8_0(&self, t: usize) -> &[BlockQ8_0x4] {
        self.tile(t)
    }

    /// Row r of a packed Q8_0 matrix as GGUF blocks.
    fn q8_0_row(&self, r: usize) -> Vec<BlockQ8_0> {
        if self.layout == Layout::Tiles16 {
            let i = r % 16;
            return self
                .tile::<BlockQ8_0x16>(r / 16)
                .iter()
                .map(|t| BlockQ8_0 {
                    d: t.d[i],
                    qs: std::array::from_fn(|j| (t.qs[j / 4][4 * i + j % 4] ^ 0x80) as i8),
                })
                .collect();
        }
        self.tile_q8_0(r / 4)
            .iter()
            .map(|t| {
                let mut qs = [0i8; QK];
                qs[..QK / 2].copy_from_slice(&t.qs[r % 4]);
                qs[QK / 2..].copy_from_slice(&t.qs[4 + r % 4]);
                BlockQ8_0 { d: t.d[r % 4], qs }
            })
            .collect()
    }

    /// Row r of a packed Q4_1 matrix as GGUF blocks.
    fn q4_1_row(&self, r: usize) -> Vec<BlockQ4_1> {
        if self.layout == Layout::Tiles16 {
            let i = r % 16;
            return self
                .tile::<BlockQ4_1x16>(r / 16)
                .iter()
                .map(|t| BlockQ4_1 {
                    d: t.d[i],
                    m: t.m[i],
                    qs: std::array::from_fn(|j| t.qs[j / 4][4 * i + j % 4]),
                })
                .collect();
        }
        self.tile_q4_1(r / 4)
            .iter()
            .map(|t| BlockQ4_1 {
                d: t.dm[r % 4],
                m: t.dm[4 + r % 4],
                qs: t.qs[r % 4],
            })
            .collect()
    }

    /// Builds a matrix from f32 values, stored as `ty` (F32, F16 or BF16 only): used by
    /// tests and tiny models.
    pub fn from_f32(ty: GgmlType, rows: usize, cols: usize, values: &[f32]) -> Option<Self> {
        let bytes: Vec<u8> = match ty {
            GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => values
                .iter()
                .flat_map(|v| f32_to_f16(*v).to_le_bytes())
                .collect(),
            GgmlType::BF16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
            _ => return None,
        };
        Self::new(ty, rows, cols, &bytes)
    }

    fn row(&self, r: usize) -> &[u8] {
        assert!(
            self.layout == Layout::Rows,
            "packed matrices have no GGUF rows"
        );
        let all: &[u8] = bytemuck::cast_slice(&self.data);
        &all[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Whether `isa`'s kernel for this matrix also reads [`ActKind::Q8Sums`].
    fn reads_sums(&self, isa: Isa) -> bool {
        isa.avx512() && self.layout == Layout::Tiles16 && self.ty == GgmlType::Q8_0
    }

    /// Rows per tile of the threaded matmul's work split.
    fn tile_rows(&self) -> usize {
        self.layout.tile_rows()
    }

    /// A matrix of the same format whose rows are blocks `blocks` (32 columns each) of
    /// this one's rows, in that order: the same weights, bit for bit (a block may come
    /// twice). `None` for the formats whose blocks are not 32 wide, or a block past the
    /// row's end.
    pub fn block_columns(&self, blocks: &[usize]) -> Option<QMatrix> {
        let nb = self.cols / QK;
        if self.act_kind() != ActKind::Q8 || blocks.iter().any(|&b| b >= nb) {
            return None;
        }
        let size = self.row_bytes / nb;
        let mut bytes = Vec::with_capacity(self.rows * blocks.len() * size);
        for row in self.gguf_bytes().chunks_exact(self.row_bytes) {
            for &b in blocks {
                bytes.extend_from_slice(&row[b * size..(b + 1) * size]);
            }
        }
        Some(Self::new(self.ty, self.rows, blocks.len() * QK, &bytes)?.with_layout(self.layout))
    }

    pub fn act_kind(&self) -> ActKind {
        match self.ty {
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL => ActKind::Q8,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                ActKind::Q8K
            }
            _ => ActKind::F32,
        }
    }

    /// Bytes of weights (what one full pass over the matrix reads).
    pub fn size_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// Writes row `r` as f32 into `out`: its first `out.len()` values (at most `cols`,
    /// whole blocks), for embedding lookups.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let n = out.len().min(self.cols);
        assert!(n == self.cols || (n.is_multiple_of(QK) && self.act_kind() == ActKind::Q8));
        let out = &mut out[..n];
        if self.layout != Layout::Rows {
            return match self.ty {
                GgmlType::Q8_0 => scalar::dequant_q8_0(&self.q8_0_row(r), out),
                _ => scalar::dequant_q4_1(&self.q4_1_row(r), out),
            };
        }
        let b = self.row(r);
        match self.ty {
            GgmlType::F32 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
                }
            }
            GgmlType::F16 => scalar::dequant_f16(bytemuck::cast_slice(b), out),
            GgmlType::BF16 => scalar::dequant_bf16(bytemuck::cast_slice(b), out),
            GgmlType::Q4_0 => scalar::dequant_q4_0(bytemuck::cast_slice(b), out),
            GgmlType::Q4_1 => scalar::dequant_q4_1(bytemuck::cast_slice(b), out),
            GgmlType::Q8_0 => scalar::dequant_q8_0(bytemuck::cast_slice(b), out),
            GgmlType::Q4_K => scalar::dequant_q4k(bytemuck::cast_slice(b), out),
            GgmlType::Q6_K => scalar::dequant_q6k(bytemuck::cast_slice(b), out),
            GgmlType::Q5_0 => scalar::dequant_q5_0(bytemuck::cast_slice(b), out),
            GgmlType::Q5_1 => scalar::dequant_q5_1(bytemuck::cast_slice(b), out),
            GgmlType::IQ4_NL => scalar::dequant_iq4nl(bytemuck::cast_slice(b), out),
            GgmlType::Q2_K => scalar::dequant_q2k(bytemuck::cast_slice(b), out),
            GgmlType::Q3_K => scalar::dequant_q3k(bytemuck::cast_slice(b), out),
            GgmlType::Q5_K => scalar::dequant_q5k(bytemuck::cast_slice(b), out),
            _ => unreachable!("QMatrix::new admits supported types only"),
        }
    }

    /// dot(row r, activation row t) through the per-pair kernels. Packed Q4_1 and Q8_0
    /// reach here only where their layout is not the path's: four-row tiles on the
    /// scalar path, sixteen-row tiles on any path but AVX-512 (`run_tile` runs the tile
    /// kernels of the others).
    fn dot(&self, isa: Isa, r: usize, act: &Activations, t: usize) -> f32 {
        let c = self.cols;
        if self.layout == Layout::Tiles16 {
            // Another path's kernels on the AVX-512 layout: the AVX-512 bits, by the
            // scalar twins.
            return match self.ty {
                GgmlType::Q8_0 => scalar::dot_q8_0_rows16(&self.q8_0_row(r), act.q8_row(t, c)),
                _ => scalar::dot_q4_1_rows16(&self.q4_1_row(r), act.q8_row(t, c)),
            };
        }
        if self.layout == Layout::Tiles4 {
            debug_assert!(!isa.avx2(), "packed tiles run through run_tile's kernels");
            return match self.ty {
                GgmlType::Q8_0 => scalar::dot_q8_0(&self.q8_0_row(r), act.q8_row(t, c)),
                _ => scalar::dot_q4_1(&self.q4_1_row(r), act.q8_row(t, c)),
            };
        }
        let b = self.row(r);
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c.
            unsafe {
                use super::avx2;
                return match self.ty {
                    GgmlType::F32 => avx2::dot_f32(bytemuck::cast_slice(b), act.f32_row(t, c)),
                    GgmlType::F16 => avx2::dot_f16(bytemuck::cast_slice(b), act.f32_row(t, c)),
                    GgmlType::BF16 => avx2::dot_bf16(bytemuck::cast_slice(b), act.f32_row(t, c)),
                    GgmlType::Q4_K => avx2::dot_q4k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
                    GgmlType::Q6_K => avx2::dot_q6k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
                    GgmlType::Q2_K => {
                        super::avx2_kquants::dot_q2k(bytemuck::cast_slice(b), act.q8k_row(t, c))
                    }
                    GgmlType::Q3_K => {
                        super::avx2_kquants::dot_q3k(bytemuck::cast_slice(b), act.q8k_row(t, c))
                    }
                    GgmlType::Q5_K => {
                        super::avx2_kquants::dot_q5k(bytemuck::cast_slice(b), act.q8k_row(t, c))
                    }
                    GgmlType::Q4_0
                    | GgmlType::Q4_1
                    | GgmlType::Q5_0
                    | GgmlType::Q5_1
                    | GgmlType::Q8_0
                    | GgmlType::IQ4_NL => {
                        let mut o = [[0f32; 1]; 1];
                        with_dot!(isa, D => self.tile_avx2::<D, 1, 1>(r, act, t, &mut o));
                        o[0][0]
                    }
                    _ => unreachable!("QMatrix::new admits supported types only"),
                };
            }
        }
        let _ = isa;
        match self.ty {
            GgmlType::F32 => scalar::dot_f32(bytemuck::cast_slice(b), act.f32_row(t, c)),
            GgmlType::F16 => scalar::dot_f16(bytemuck::cast_slice(b), act.f32_row(t, c)),
            GgmlType::BF16 => scalar::dot_bf16(bytemuck::cast_slice(b), act.f32_row(t, c)),
            GgmlType::Q4_0 => scalar::dot_q4_0(bytemuck::cast_slice(b), act.q8_row(t, c)),
            GgmlType::Q4_1 => scalar::dot_q4_1(bytemuck::cast_slice(b), act.q8_row(t, c)),
            GgmlType::Q8_0 => scalar::dot_q8_0(bytemuck::cast_slice(b), act.q8_row(t, c)),
            GgmlType::Q4_K => scalar::dot_q4k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
            GgmlType::Q6_K => scalar::dot_q6k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
            GgmlType::Q5_0 => scalar::dot_q5_0(bytemuck::cast_slice(b), act.q8_row(t, c)),
            GgmlType::Q5_1 => scalar::dot_q5_1(bytemuck::cast_slice(b), act.q8_row(t, c)),
            GgmlType::IQ4_NL => scalar::dot_iq4nl(bytemuck::cast_slice(b), act.q8_row(t, c)),
            GgmlType::Q2_K => scalar::dot_q2k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
            GgmlType::Q3_K => scalar::dot_q3k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
            GgmlType::Q5_K => scalar::dot_q5k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
            _ => unreachable!("QMatrix::new admits supported types only"),
        }
    }

    /// R rows from `r0` × C activation rows from `t0` through an AVX2 register tile,
    /// with the 8-bit dot step `D`.
    ///
    /// # Safety
    /// The CPU must support avx2, fma and f16c, and step `D`'s instruction.
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_avx2<const D: u8, const R: usize, const C: usize>(
        &self,
        r0: usize,
        act: &Activations,
        t0: usize,
        out: &mut [[f32; C]; R],
    ) {
        use super::avx2;
        let a: [&[BlockQ8]; C] = std::array::from_fn(|c| act.q8_row(t0 + c, self.cols));
        macro_rules! go {
            ($k:ident, $blk:ty) => {{
                let w: [&[$blk]; R] =
                    std::array::from_fn(|r| bytemuck::cast_slice(self.row(r0 + r)));
                // SAFETY: the caller guarantees the CPU features.
                unsafe { avx2::$k::<D, R, C>(w, a, out) }
            }};
        }
        match self.ty {
            GgmlType::Q4_0 => go!(tile_q4_0, BlockQ4_0),
            GgmlType::Q4_1 => go!(tile_q4_1, BlockQ4_1),
            GgmlType::Q8_0 => go!(tile_q8_0, BlockQ8_0),
            GgmlType::Q5_0 => go!(tile_q5_0, BlockQ5_0),
            GgmlType::Q5_1 => go!(tile_q5_1, BlockQ5_1),
            GgmlType::IQ4_NL => go!(tile_iq4nl, BlockIq4Nl),
            _ => unreachable!("tiles exist for the 32-element formats only"),
        }
    }
}

/// One input batch (`n` rows of `cols`), kept as f32 and quantized on demand.
#[derive(Default)]
pub struct Activations {
    n: usize,
    cols: usize,
    f32: Vec<f32>,
    q8: Vec<BlockQ8>,
    q8k: Vec<BlockQ8K>,
    sums: Vec<i32>,
    have_q8: bool,
    have_q8k: bool,
    have_sums: bool,
}

impl Activations {
    /// Takes `n` rows of `cols` values from `x`.
    pub fn set(&mut self, x: &[f32], n: usize, cols: usize) {
        self.n = n;
        self.cols = cols;
        self.f32.clear();
        self.f32.extend_from_slice(&x[..n * cols]);
        self.have_q8 = false;
        self.have_q8k = false;
        self.have_sums = false;
    }

    /// Builds `n` rows of `cols` values in place, `row(r, values)` writing row `r`, and
    /// quantizes them for `ws`, the matrices that will read them, in the same pass:
    /// the steps between two matmuls of a small batch (a norm, a copy, an activation
    /// function, then the 8-bit rounding) as one parallel region, rows split over
    /// `pool`'s threads from [`BUILD_ROWS`] rows, where each alone would run on one
    /// thread. Each row is built and quantized the same way whatever the split.
    pub fn build(
        &mut self,
        pool: &ThreadPool,
        isa: Isa,
        (n, cols): (usize, usize),
        ws: &[&QMatrix],
        row: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        let sums = ws.iter().any(|w| w.reads_sums(isa));
        let q8 = sums || ws.iter().any(|w| w.act_kind() == ActKind::Q8);
        let nb = cols / QK;
        self.n = n;
        self.cols = cols;
        self.f32.resize(n * cols, 0.0);
        self.q8
            .resize(if q8 { n * nb } else { 0 }, BlockQ8::zeroed());
        self.sums.resize(if sums { n * nb } else { 0 }, 0);
        let (mut f, mut q, mut s) = (&mut self.f32[..], &mut self.q8[..], &mut self.sums[..]);
        let mut parts = Vec::new();
        for (a, b) in pool.row_chunks(n, BUILD_ROWS) {
            let k = b - a;
            let (f0, f1) = std::mem::take(&mut f).split_at_mut(k * cols);
            let (q0, q1) = std::mem::take(&mut q).split_at_mut(if q8 { k * nb } else { 0 });
            let (s0, s1) = std::mem::take(&mut s).split_at_mut(if sums { k * nb } else { 0 });
            parts.push((a, f0, q0, s0));
            (f, q, s) = (f1, q1, s1);
        }
        pool.each(parts, &|(first, f, q, s)| {
            for (i, values) in f.chunks_exact_mut(cols).enumerate() {
                row(first + i, values);
            }
            if q8 {
                super::quantize_q8(isa, f, q);
            }
            block_sums(q, s);
        });
        self.have_q8 = q8;
        self.have_sums = sums;
        self.have_q8k = false;
    }

    /// The values of every row, back to back.
    pub fn values(&self) -> &[f32] {
        &self.f32
    }

    /// Makes sure the `kind` representation exists (quantized on `isa`'s path, rows
    /// split over `pool`'s threads when there are many; every path and split produces
    /// the same bytes).
    pub fn ensure(&mut self, pool: &ThreadPool, isa: Isa, kind: ActKind) {
        match kind {
            ActKind::F32 => {}
            ActKind::Q8 if !self.have_q8 => {
                let (nb, cols) = (self.cols / QK, self.cols);
                self.q8.resize(self.n * nb, BlockQ8::zeroed());
                let x = &self.f32;
                pool.rows_mut(&mut self.q8, nb, PARALLEL_ROWS, &|first, q| {
                    let rows = q.len() / nb;
                    super::quantize_q8(isa, &x[first * cols..(first + rows) * cols], q);
                });
                self.have_q8 = true;
            }
            ActKind::Q8K if !self.have_q8k => {
                self.q8k
                    .resize(self.n * self.cols / QK_K, BlockQ8K::zeroed());
                scalar::quantize_q8k(&self.f32, &mut self.q8k);
                self.have_q8k = true;
            }
            ActKind::Q8Sums if !self.have_sums => {
                self.ensure(pool, isa, ActKind::Q8);
                self.sums.resize(self.q8.len(), 0);
                block_sums(&self.q8, &mut self.sums);
                self.have_sums = true;
            }
            _ => {}
        }
    }

    fn f32_row(&self, t: usize, cols: usize) -> &[f32] {
        &self.f32[t * cols..(t + 1) * cols]
    }
    fn q8_row(&self, t: usize, cols: usize) -> &[BlockQ8] {
        self.q8_rows(t, 1, cols)
    }
    /// Rows `t..t + n`, one after another.
    fn q8_rows(&self, t: usize, n: usize, cols: usize) -> &[BlockQ8] {
        let nb = cols / QK;
        &self.q8[t * nb..(t + n) * nb]
    }
    fn sums_row(&self, t: usize, cols: usize) -> &[i32] {
        self.sums_rows(t, 1, cols)
    }
    fn sums_rows(&self, t: usize, n: usize, cols: usize) -> &[i32] {
        assert!(self.have_sums, "block sums made before use");
        let nb = cols / QK;
        &self.sums[t * nb..(t + n) * nb]
    }
    fn q8k_row(&self, t: usize, cols: usize) -> &[BlockQ8K] {
        let nb = cols / QK_K;
        &self.q8k[t * nb..(t + 1) * nb]
    }
}

/// -128·Σq of each of `q`'s blocks into `out` (as many; none when `out` is empty).
fn block_sums(q: &[BlockQ8], out: &mut [i32]) {
    for (s, b) in out.iter_mut().zip(q) {
        *s = -128 * b.qs.iter().map(|&q| i32::from(q)).sum::<i32>();
    }
}

use bytemuck::Zeroable;

/// A shared view of one output buffer that threads write at disjoint indices, each
/// once: the value, or (`add`) the value added to what is there.
struct OutView {
    ptr: *mut f32,
    len: usize,
    add: bool,
}
// SAFETY: threads write through the view only at disjoint (row, token) indices, each
// bounds-checked against `len`, while the buffer is exclusively borrowed by `matmul`.
unsafe impl Sync for OutView {}

impl OutView {
    fn write(&self, i: usize, v: f32) {
        assert!(i < self.len);
        // SAFETY: in bounds (checked above); no two threads touch the same index, and
        // nothing else reads the buffer until the parallel region ends.
        unsafe {
            let p = self.ptr.add(i);
            *p = if self.add { *p + v } else { v };
        }
    }

    /// Writes `v` at indices `i..i + v.len()`.
    fn write_run(&self, i: usize, v: &[f32]) {
        let out = self.run(i, v.len());
        if self.add {
            out.iter_mut().zip(v).for_each(|(o, v)| *o += v);
        } else {
            out.copy_from_slice(v);
        }
    }

    /// Indices `i..i + len`, for a kernel that writes them itself (each once, by
    /// `add`'s rule). A caller asks for each index once, as for `write`.
    #[allow(clippy::mut_from_ref)]
    fn run(&self, i: usize, len: usize) -> &mut [f32] {
        assert!(i + len <= self.len);
        // SAFETY: in bounds (checked above); no other thread touches these indices, and
        // nothing else reads the buffer until the parallel region ends.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i), len) }
    }

    /// `rows` runs of `len` from index `i`, `stride` apart, for an AVX-512 tile call
    /// (its contract holds: in bounds, checked here, and each index asked for once).
    #[cfg(target_arch = "x86_64")]
    fn tile_out(&self, i: usize, stride: usize, rows: usize, len: usize) -> super::avx512::TileOut {
        assert!(rows > 0 && i + (rows - 1) * stride + len <= self.len);
        super::avx512::TileOut {
            ptr: self.ptr.wrapping_add(i),
            stride,
            len,
            add: self.add,
        }
    }
}

/// Sixteen rows from `r0` (the first `real` of them real, the rest padding) × activation
/// rows `t0..n` through the AVX-512 lane-per-row kernels, sixteen activation rows per
/// call (the whole batch of a 16-sequence decode step: each weight loaded once) or up
/// to eight, which write (or add) their results straight into `out`; every (row,
/// column) gets the same arithmetic whatever the width.
#[cfg(target_arch = "x86_64")]
fn run_tile16(
    w: &QMatrix,
    act: &Activations,
    r0: usize,
    real: usize,
    t0: usize,
    n: usize,
    out: &OutView,
) {
    use super::avx512::{tile_q4_1x16, tile_q8_0x16};
    macro_rules! widths {
        ($k:expr, |$c:ident| $call:expr, $($w:literal)*) => {
            match $k {
                $($w => {
                    const $c: usize = $w;
                    $call
                })*
                _ => unreachable!("widths cover 1..=8 and 16"),
            }
        };
    }
    let mut t = t0;
    while t < n {
        let k = if n - t >= 16 { 16 } else { (n - t).min(8) };
        let nb = w.cols / QK;
        let rows = act.q8_rows(t, k, w.cols);
        // Each row its own slice: given one slice and a stride instead, LLVM spilled the
        // sixteen-row Q8_0 kernel's accumulators (269 zmm spills), row barrier or not.
        let a = |c: usize| &rows[c * nb..(c + 1) * nb];
        let o = out.tile_out(t * w.rows + r0, w.rows, k, real);
        if w.ty == GgmlType::Q4_1 {
            let tile = w.tiles::<BlockQ4_1x16>(r0 / 16, 1);
            // SAFETY: AVX-512 paths are only produced after running the features; `o`'s
            // rows are this call's alone (`tile_out`).
            widths!(k, |C| unsafe {
                tile_q4_1x16::<C>(tile, std::array::from_fn(a), &o)
            }, 1 2 3 4 5 6 7 8 16);
        } else {
            let tile = w.tiles::<BlockQ8_0x16>(r0 / 16, 1);
            let sums = act.sums_rows(t, k, w.cols);
            let s = |c: usize| &sums[c * nb..(c + 1) * nb];
            // SAFETY: as above.
            widths!(k, |C| unsafe {
                tile_q8_0x16::<C>(tile, std::array::from_fn(a), std::array::from_fn(s), &o)
            }, 1 2 3 4 5 6 7 8 16);
        }
        t += k;
    }
}

/// Rows of the four-row tile kernels.
const ROW_TILE: usize = 4;
/// Rows of activations from which element-wise work is split over threads.
pub const PARALLEL_ROWS: usize = 32;
/// Rows from which [`Activations::build`] splits its rows over threads: its work per
/// row (a norm or an activation function, a copy, the 8-bit rounding) is more than
/// one element-wise step's.
pub const BUILD_ROWS: usize = 4;
/// Activation rows per block of the matmul's outer loop (32 rows of 576 8-bit values
/// take ~23 KB: they stay in L1).
const COL_BLOCK: usize = 32;

/// For each `(w, out)`: `out[t * w.rows + r] = dot(w row r, x row t)` for every
/// activation row t of `act`. Matrices must have `cols` equal to the activations'.
pub fn matmul(
    pool: &ThreadPool,
    isa: Isa,
    act: &mut Activations,
    jobs: &mut [(&QMatrix, &mut [f32])],
) {
    matmul_into(pool, isa, act, jobs, false);
}

/// [`matmul`] of one matrix added to `out`: `out[t * w.rows + r] += dot(w row r, x row
/// t)`, each sum rounded once, as a matmul then an add would (a residual connection
/// without its own pass over the rows).
pub fn matmul_add(
    pool: &ThreadPool,
    isa: Isa,
    act: &mut Activations,
    w: &QMatrix,
    out: &mut [f32],
) {
    matmul_into(pool, isa, act, &mut [(w, out)], true);
}

/// [`matmul`], or with `add` [`matmul_add`].
fn matmul_into(
    pool: &ThreadPool,
    isa: Isa,
    act: &mut Activations,
    jobs: &mut [(&QMatrix, &mut [f32])],
    add: bool,
) {
    for (w, out) in jobs.iter() {
        assert_eq!(
            w.cols, act.cols,
            "matmul: weight and activation widths differ"
        );
        assert!(out.len() >= act.n * w.rows, "matmul: output too small");
    }
    for (w, _) in jobs.iter() {
        act.ensure(pool, isa, w.act_kind());
        if w.reads_sums(isa) {
            act.ensure(pool, isa, ActKind::Q8Sums);
        }
    }
    let act = &*act;
    let views: Vec<(&QMatrix, OutView)> = jobs
        .iter_mut()
        .map(|(w, o)| {
            (
                *w,
                OutView {
                    ptr: o.as_mut_ptr(),
                    len: o.len(),
                    add,
                },
            )
        })
        .collect();
    let tiles: Vec<usize> = views
        .iter()
        .map(|(w, _)| w.rows.div_ceil(w.tile_rows()))
        .collect();
    let total: usize = tiles.iter().sum();
    let n_threads = pool.parallelism().min(total.max(1));
    // Global tile index -> (matrix, its first row).
    let locate = |tile: usize| {
        let mut base = 0;
        for (j, &nt) in tiles.iter().enumerate() {
            if tile < base + nt {
                return (j, (tile - base) * views[j].0.tile_rows());
            }
            base += nt;
        }
        unreachable!("tile {tile} past the last matrix")
    };
    // Each task owns a contiguous share of the tiles and runs it column block by column
    // block (a block of activation rows stays in L1 while the task's weight tiles, in
    // its thread's L2, pass over it): a work item is (column block, a few tiles of the
    // share). The owner takes items from the front of its list; a task that has
    // finished takes them from the front of another's too, so a thread slowed down (a
    // busy neighbour, the other thread's serial work) never leaves the rest waiting.
    // From the front, not the back: a thief then reads weights in ascending order, and
    // decode (bound by memory) ran ~1.5x slower on items taken in descending order (the
    // hardware prefetcher's loss). With few activation rows a tile is quick work:
    // items of several tiles keep claiming cheap.
    let per = if act.n >= PARALLEL_ROWS { 1 } else { 8 };
    let n_blocks = act.n.div_ceil(COL_BLOCK);
    let lists: Vec<WorkList> = (0..n_threads)
        .map(|i| {
            let (a, b) = share(total, i, n_threads);
            WorkList::new((b - a).div_ceil(per) * n_blocks)
        })
        .collect();
    let item = |i: usize, k: usize| {
        let (a, b) = share(total, i, n_threads);
        let chunks = (b - a).div_ceil(per);
        let (cb, c) = (k / chunks, k % chunks);
        let t0 = cb * COL_BLOCK;
        let t1 = (t0 + COL_BLOCK).min(act.n);
        let (mut tile, end) = (a + c * per, (a + (c + 1) * per).min(b));
        while tile < end {
            let (j, r0) = locate(tile);
            let (w, out) = &views[j];
            // This item's tiles of matrix j.
            let tr = w.tile_rows();
            let count = (tiles[j] - r0 / tr).min(end - tile);
            if t1 - t0 == 1 && run_tiles_one_row(isa, w, act, r0, count, t0, out) {
                tile += count;
                continue;
            }
            for k in 0..count {
                let r = r0 + k * tr;
                run_tile(isa, w, act, r, (r + tr).min(w.rows), t0, t1, out);
            }
            tile += count;
        }
    };
    pool.run(&|i| {
        if i >= n_threads {
            return;
        }
        while let Some(k) = lists[i].pop_front() {
            item(i, k);
        }
        for j in (1..n_threads).map(|o| (i + o) % n_threads) {
            while let Some(k) = lists[j].pop_front() {
                item(j, k);
            }
        }
    });
}

/// Runs a four-row tile kernel over activation rows `t0..n` in calls as wide as the
/// widest width listed (the rest in one narrower call), and writes the first `real`
/// rows' results; `act.row` names the activations' row accessor the kernel reads.
/// Every (row, column) gets the same arithmetic whatever the width.
#[cfg(target_arch = "x86_64")]
macro_rules! by_columns {
    ($w:expr, $act:ident.$row:ident, $out:expr, $r0:expr, $real:expr, $t0:expr, $n:expr,
     |$a:ident, $o:ident| $call:expr, $($c:literal)*) => {{
        let widest = [$($c),*].into_iter().max().unwrap_or(1);
        let mut t = $t0;
        while t < $n {
            let k = ($n - t).min(widest);
            let mut all = [[0f32; 8]; 4];
            match k {
                $($c => {
                    let $a: [&[BlockQ8]; $c] = std::array::from_fn(|c| $act.$row(t + c, $w.cols));
                    let mut $o = [[0f32; $c]; 4];
                    $call;
                    for (d, s) in all.iter_mut().zip($o) {
                        d[..$c].copy_from_slice(&s);
                    }
                })*
                _ => unreachable!("widths cover 1..=widest"),
            }
            for (r, row) in all.iter().enumerate().take($real) {
                for (c, &v) in row.iter().enumerate().take(k) {
                    $out.write((t + c) * $w.rows + $r0 + r, v);
                }
            }
            t += k;
        }
    }};
}

/// Activation row t against `count` whole tiles from row r0, in one kernel call where
/// the path has a one-row form over tiles (the same bits as `run_tile` tile by tile).
/// False, with nothing written, where it has none or the last tile holds padding rows.
fn run_tiles_one_row(
    isa: Isa,
    w: &QMatrix,
    act: &Activations,
    r0: usize,
    count: usize,
    t: usize,
    out: &OutView,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && w.layout == Layout::Tiles16 && r0 + count * 16 <= w.rows {
        use super::avx512;
        let nb = w.cols / QK;
        let a = act.q8_row(t, w.cols);
        let tiles = r0 / 16;
        let o = out.run(t * w.rows + r0, count * 16);
        match w.ty {
            // SAFETY: AVX-512 paths are only produced after running the features.
            GgmlType::Q4_1 => unsafe {
                avx512::tiles_q4_1x16_one_row(w.tiles(tiles, count), nb, a, o, out.add)
            },
            // SAFETY: as above.
            _ => unsafe {
                let sums = act.sums_row(t, w.cols);
                avx512::tiles_q8_0x16_one_row(w.tiles(tiles, count), nb, a, sums, o, out.add)
            },
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && w.layout == Layout::Tiles4 && r0 + count * ROW_TILE <= w.rows {
        use super::avx2;
        let nb = w.cols / QK;
        let a = act.q8_row(t, w.cols);
        let mut o = [0f32; 8 * ROW_TILE];
        for first in (0..count).step_by(8) {
            let k = (count - first).min(8);
            let tile = r0 / ROW_TILE + first;
            let o = &mut o[..k * ROW_TILE];
            let q4 = || w.tiles::<BlockQ4_1x4>(tile, k);
            let q8 = || w.tiles::<BlockQ8_0x4>(tile, k);
            match w.ty {
                // SAFETY: AVX2 paths are only produced after detecting avx2, fma and
                // f16c, and the AVX-VNNI and AVX-512 ones after running `vpdpbusd`.
                GgmlType::Q4_1 => with_dot!(isa, D => unsafe {
                    avx2::tiles_q4_1x4_one_row::<D>(q4(), nb, a, o)
                }),
                // SAFETY: as above.
                GgmlType::Q8_0 => with_dot!(isa, D => unsafe {
                    avx2::tiles_q8_0x4_one_row::<D>(q8(), nb, a, o)
                }),
                _ => return false,
            }
            out.write_run(t * w.rows + tile * ROW_TILE, o);
        }
        return true;
    }
    let _ = (isa, w, act, r0, count, t, out);
    false
}

#[allow(clippy::too_many_arguments)]
fn run_tile(
    isa: Isa,
    w: &QMatrix,
    act: &Activations,
    r0: usize,
    r1: usize,
    t0: usize,
    n: usize,
    out: &OutView,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && w.layout == Layout::Tiles16 {
        run_tile16(w, act, r0, r1 - r0, t0, n, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && w.layout == Layout::Tiles4 && w.ty == GgmlType::Q8_0 {
        let tile = w.tile_q8_0(r0 / 4);
        // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c, and
        // the AVX-VNNI and AVX-512 ones after running `vpdpbusd`.
        with_dot!(isa, D => by_columns!(w, act.q8_row, out, r0, r1 - r0, t0, n, |a, o| unsafe {
            super::avx2::tile_q8_0x4::<D, _>(tile, a, &mut o)
        }, 1 2));
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && w.layout == Layout::Tiles4 && w.ty == GgmlType::Q4_1 {
        let tile = w.tile_q4_1(r0 / 4);
        let real = r1 - r0;
        let emit = |t: usize, o: &[[f32; 3]; 4], k: usize| {
            for (r, row) in o.iter().enumerate().take(real) {
                for (c, &v) in row.iter().enumerate().take(k) {
                    out.write((t + c) * w.rows + r0 + r, v);
                }
            }
        };
        // Three activation rows per call (the widest tile that stays in registers);
        // every (row, column) gets the same arithmetic whatever the width.
        let mut t = t0;
        while t < n {
            let k = (n - t).min(3);
            let q = |c: usize| act.q8_row(t + c, w.cols);
            let mut o = [[0f32; 3]; 4];
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c,
            // and the AVX-VNNI one after running its `vpdpbusd`.
            with_dot!(isa, D => unsafe {
                use super::avx2::tile_q4_1x4;
                match k {
                    3 => tile_q4_1x4::<D, 3>(tile, [q(0), q(1), q(2)], &mut o),
                    2 => {
                        let mut o2 = [[0f32; 2]; 4];
                        tile_q4_1x4::<D, 2>(tile, [q(0), q(1)], &mut o2);
                        for (d, s) in o.iter_mut().zip(o2) {
                            d[..2].copy_from_slice(&s);
                        }
                    }
                    _ => {
                        let mut o1 = [[0f32; 1]; 4];
                        tile_q4_1x4::<D, 1>(tile, [q(0)], &mut o1);
                        for (d, s) in o.iter_mut().zip(o1) {
                            d[0] = s[0];
                        }
                    }
                }
            });
            emit(t, &o, k);
            t += k;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2()
        && r1 - r0 == ROW_TILE
        && w.layout == Layout::Rows
        && matches!(
            w.ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::IQ4_NL
        )
    {
        let mut t = t0;
        while t + 2 <= n {
            let mut o = [[0f32; 2]; ROW_TILE];
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c,
            // and the AVX-VNNI one after running its `vpdpbusd`.
            with_dot!(isa, D => unsafe { w.tile_avx2::<D, ROW_TILE, 2>(r0, act, t, &mut o) });
            for (r, row) in o.iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    out.write((t + c) * w.rows + r0 + r, v);
                }
            }
            t += 2;
        }
        if t < n {
            let mut o = [[0f32; 1]; ROW_TILE];
            // SAFETY: as above.
            with_dot!(isa, D => unsafe { w.tile_avx2::<D, ROW_TILE, 1>(r0, act, t, &mut o) });
            for (r, row) in o.iter().enumerate() {
                out.write(t * w.rows + r0 + r, row[0]);
            }
        }
        return;
    }
    for r in r0..r1 {
        for t in t0..n {
            out.write(t * w.rows + r, w.dot(isa, r, act, t));
        }
    }
}
