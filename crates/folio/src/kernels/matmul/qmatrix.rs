//! [`QMatrix`], a weight matrix copied out of the file into the layout the kernels
//! read ([`Layout`]: GGUF's rows, or packed in tiles of rows), on buffers asked to be
//! backed by huge pages ([`WeightArena`], [`QMatrix::gather`]: a model's matrices in
//! one mapping), and its rows and tiles as the kernels and the embedding lookup read
//! them.

use super::pack::RowSource;
use super::weight_buf::{WeightArena, WeightBuf};
use super::ActKind;
use crate::gguf::GgmlType;
use crate::kernels::quant::{f32_to_f16, BlockQ4_1x4, BlockQ8_0x4, QK};
use crate::kernels::{scalar, Isa};

/// A weight matrix of `rows` × `cols` in one of the supported formats, copied out of the
/// file into 8-byte-aligned memory at load time.
///
/// NOTE: Q4_1 (the default model's type) and Q8_0 (its output head) are repacked at load
/// into tiles of rows, tile-major, so a tile kernel reads one stream ([`Layout`]), and on
/// the AVX-512, AVX2 and AVX-VNNI paths in sixteen-row tiles, as are Q4_0, Q5_0,
/// IQ4_NL, Q4_K and Q6_K; rows past the last whole tile are zero padding. Every other
/// type keeps GGUF's row-major blocks.
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub(super) row_bytes: usize,
    pub(super) layout: Layout,
    pub(super) data: WeightBuf,
}

/// How a matrix's blocks lie in memory ([`QMatrix::can_take`] says which a type has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// GGUF's rows of blocks.
    Rows,
    /// Q4_1 and Q8_0 in tiles of four rows ([`BlockQ4_1x4`], [`BlockQ8_0x4`]): the
    /// scalar kernels' layout (and the AVX2 and AVX-VNNI ones' under llama.cpp's
    /// arithmetic: [`QMatrix::llama_layout_for`]), and what [`QMatrix::new`] makes.
    Tiles4,
    /// The `tiles16` types in tiles of sixteen rows, one lane per row
    /// (`kernels::tiles16`): the AVX-512 kernels' layout, and the AVX2 and AVX-VNNI
    /// kernels' for all of them but Q5_K ([`QMatrix::for_isa`]).
    Tiles16,
}

impl Layout {
    /// Rows per tile (the threaded matmul splits work by tiles; `Rows` by four rows).
    #[inline]
    pub(super) fn tile_rows(self) -> usize {
        match self {
            Layout::Tiles16 => 16,
            _ => 4,
        }
    }
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

    /// Copies `bytes` (rows × row_bytes) into a matrix, Q4_1 and Q8_0 in tiles of four
    /// rows. `None` if the type is not supported or the sizes disagree.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Option<Self> {
        if !Self::supports(ty) {
            return None;
        }
        let layout = match ty {
            GgmlType::Q4_1 | GgmlType::Q8_0 => Layout::Tiles4,
            _ => Layout::Rows,
        };
        Self::new_in(layout, ty, rows, cols, bytes)
    }

    /// [`QMatrix::new`] straight into the layout `isa`'s kernels read: one packing,
    /// no intermediate copy.
    pub fn new_for(isa: Isa, ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Option<Self> {
        Self::new_in(Self::layout_for(isa, ty), ty, rows, cols, bytes)
    }

    fn new_in(
        layout: Layout,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Option<Self> {
        let row_bytes = ty.row_bytes(cols as u64)? as usize;
        if bytes.len() != row_bytes.checked_mul(rows)? {
            return None;
        }
        let source = |r: usize, out: &mut Vec<u8>| {
            out.extend_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
        };
        Self::from_source(layout, ty, rows, cols, &source)
    }

    /// A matrix of `ty` in the layout `isa`'s kernels read, its rows read in order, one
    /// at a time, from `source` (row `r`'s GGUF bytes appended to the buffer it is
    /// given): the loader's way of packing a tensor while releasing the file pages
    /// already read. `None` if the type is not supported.
    pub fn from_rows(
        isa: Isa,
        ty: GgmlType,
        (rows, cols): (usize, usize),
        source: RowSource,
    ) -> Option<Self> {
        Self::from_source(Self::layout_for(isa, ty), ty, rows, cols, source)
    }

    fn from_source(
        layout: Layout,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        source: RowSource,
    ) -> Option<Self> {
        if !Self::supports(ty) {
            return None;
        }
        let row_bytes = ty.row_bytes(cols as u64)? as usize;
        Some(Self::packed((ty, layout), (rows, cols, row_bytes), source))
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

    /// The layout `isa`'s kernels read for a matrix of type `ty`.
    pub fn layout_for(isa: Isa, ty: GgmlType) -> Layout {
        if isa.avx512() && Self::can_take(ty, Layout::Tiles16) {
            return Layout::Tiles16;
        }
        // Not Q5_K: its AVX2 tile kernel measured slower than the row dots (Llama-1B
        // shape in Q5_K_M, `FOLIO_ISA=avx2`, shared Zen 4, alternating: pp512 12.0-12.1
        // against 12.7-13.5 tok/s, tg64 4.9-5.4 against 6.0-7.4), so it runs only where a
        // matrix is in tiles anyway (laid out for AVX-512).
        if isa.avx2() && Self::avx2_tiles16(ty) && ty != GgmlType::Q5_K {
            return Layout::Tiles16;
        }
        match ty {
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

    /// [`QMatrix::for_isa`] in place; with `llama`, in the layout whose kernels sum in
    /// llama.cpp's order on `isa` ([`QMatrix::llama_layout_for`]).
    pub fn lay_out_for(&mut self, isa: Isa, llama: bool) {
        let layout = if llama {
            Self::llama_layout_for(isa, self.ty)
        } else {
            Self::layout_for(isa, self.ty)
        };
        *self = self.take().with_layout(layout);
    }

    /// The layout for `isa` under llama.cpp's arithmetic (`--llama-arithmetic`): as
    /// [`QMatrix::layout_for`], but Q4_1 and Q8_0 on the AVX2 paths in four-row tiles,
    /// whose kernels sum in the order of llama.cpp's AVX2 build (the sixteen-row
    /// kernels', faster there, sum in the AVX-512 path's order).
    pub fn llama_layout_for(isa: Isa, ty: GgmlType) -> Layout {
        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0) && isa.avx2() && !isa.avx512() {
            return Layout::Tiles4;
        }
        Self::layout_for(isa, ty)
    }

    /// This matrix, leaving an empty one (0 × 0) in its place.
    pub fn take(&mut self) -> Self {
        let empty = Self {
            ty: self.ty,
            rows: 0,
            cols: 0,
            row_bytes: 0,
            layout: Layout::Rows,
            data: WeightBuf::empty(),
        };
        std::mem::replace(self, empty)
    }

    /// Moves the words of the matrices not yet in an arena ([`WeightArena`]: the
    /// loader packs every matrix straight into one) into a new one, each matrix's start
    /// on a cache line, the arena asked to be backed by 2 MiB pages: matrices mapped one
    /// by one mostly fall on 4 KiB pages (only a large one, the output head, spans a
    /// whole 2 MiB page: 30 MB of SmolLM2's 96 were on huge pages), and decode streams
    /// every matrix once per token, missing the TLB on every 4 KiB page. The weights
    /// stay the same bits. Each matrix's old buffer is given back a piece at a time as
    /// it is copied, so the weights are held about once throughout (the arena's pages
    /// become resident only as they are written).
    pub fn gather(ms: &mut [&mut QMatrix]) {
        const LINE: usize = 8;
        let total: usize = (ms.iter())
            .filter(|m| !m.data.in_arena())
            .map(|m| m.data.len().next_multiple_of(LINE) * 8)
            .sum();
        if total == 0 {
            return;
        }
        let _arena = WeightArena::enter(total);
        for m in ms.iter_mut().filter(|m| !m.data.in_arena()) {
            let n = m.data.len();
            let mut moved = WeightBuf::zeroed(n);
            // A piece at a time, each given back once copied (the output head is
            // tens of MB).
            const PIECE: usize = 1 << 17;
            for p in (0..n).step_by(PIECE) {
                let q = (p + PIECE).min(n);
                moved[p..q].copy_from_slice(&m.data[p..q]);
                m.data.release(p..q);
            }
            m.data = moved;
        }
    }

    /// Row r's bytes as GGUF stores them (the `Rows` layout only).
    #[inline]
    pub(super) fn row(&self, r: usize) -> &[u8] {
        assert!(
            self.layout == Layout::Rows,
            "packed matrices have no GGUF rows"
        );
        let all: &[u8] = bytemuck::cast_slice(&self.data);
        &all[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// The packed tile t (rows from t × tile rows), as blocks of type `T` (the packed
    /// format).
    pub(super) fn tile<T: bytemuck::Pod>(&self, t: usize) -> &[T] {
        self.tiles(t, 1)
    }

    /// Packed tiles t..t+count, one after another.
    pub(super) fn tiles<T: bytemuck::Pod>(&self, t: usize, count: usize) -> &[T] {
        let nb = self.blocks_per_row();
        let size = std::mem::size_of::<T>();
        let all: &[u8] = bytemuck::cast_slice(&self.data);
        bytemuck::cast_slice(&all[t * nb * size..(t + count) * nb * size])
    }

    /// The packed Q4_1 tile holding rows 4t..4t+4.
    #[inline]
    pub(super) fn tile_q4_1(&self, t: usize) -> &[BlockQ4_1x4] {
        self.tile(t)
    }

    /// The packed Q8_0 tile holding rows 4t..4t+4.
    #[inline]
    pub(super) fn tile_q8_0(&self, t: usize) -> &[BlockQ8_0x4] {
        self.tile(t)
    }

    /// GGUF blocks per row (32 or 256 weights each, or one per weight for float types).
    #[inline]
    pub(super) fn blocks_per_row(&self) -> usize {
        let (per_block, _) = self.ty.block_layout();
        self.cols / per_block as usize
    }

    /// Whether `isa`'s kernel for this matrix also reads [`ActKind::Q8Sums`].
    #[inline]
    pub(super) fn reads_sums(&self, isa: Isa) -> bool {
        self.layout == Layout::Tiles16
            && match self.ty {
                GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::IQ4_NL => isa.avx2(),
                _ => false,
            }
    }

    /// Whether the AVX2 paths (AVX2, AVX-VNNI) have sixteen-row tile kernels for `ty`
    /// (`kernels::avx2_tiles16` and `avx2_tiles16_more`, over the AVX-512 path's
    /// layouts).
    #[inline]
    pub(super) fn avx2_tiles16(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q8_0
                | GgmlType::Q5_0
                | GgmlType::IQ4_NL
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }

    /// Rows per tile of the threaded matmul's work split.
    #[inline]
    pub(super) fn tile_rows(&self) -> usize {
        self.layout.tile_rows()
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
        let mut packed = Vec::new();
        let b = if self.layout == Layout::Rows {
            self.row(r)
        } else {
            self.gguf_row(r, &mut packed);
            &packed
        };
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
}
