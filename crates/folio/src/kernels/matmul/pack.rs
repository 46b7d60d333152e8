//! Between GGUF's rows of blocks and the tile layouts of Q4_1 and Q8_0: packing at load
//! ([`QMatrix::new`]) and into another path's layout ([`QMatrix::with_layout`]), the
//! rows read back bit for bit ([`QMatrix::gguf_bytes`]), and a matrix of chosen block
//! columns ([`QMatrix::block_columns`], the outlier pass's).

use super::qmatrix::{weight_buffer, Words};
use super::{ActKind, Layout, QMatrix};
use crate::gguf::GgmlType;
use crate::kernels::quant::{
    BlockQ4_1, BlockQ4_1x16, BlockQ4_1x4, BlockQ8_0, BlockQ8_0x16, BlockQ8_0x4, QK,
};

impl QMatrix {
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

    pub(super) fn pack_q4_1(rows: usize, cols: usize, row_bytes: usize, bytes: &[u8]) -> Self {
        let put = |t: &mut BlockQ4_1x4, k: usize, blk: BlockQ4_1| {
            t.dm[k] = blk.d;
            t.dm[4 + k] = blk.m;
            t.qs[k] = blk.qs;
        };
        let shape = (rows, cols, row_bytes);
        Self::pack((GgmlType::Q4_1, Layout::Tiles4), shape, bytes, put)
    }

    pub(super) fn pack_q8_0(rows: usize, cols: usize, row_bytes: usize, bytes: &[u8]) -> Self {
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

    /// Row r of a packed Q8_0 matrix as GGUF blocks.
    pub(super) fn q8_0_row(&self, r: usize) -> Vec<BlockQ8_0> {
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
    pub(super) fn q4_1_row(&self, r: usize) -> Vec<BlockQ4_1> {
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
}
