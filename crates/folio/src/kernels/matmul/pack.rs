//! Between GGUF's rows of blocks and the tile layouts (four-row tiles of Q4_1 and Q8_0,
//! sixteen-row tiles of the `tiles16` types): packing at load ([`QMatrix::new`],
//! [`QMatrix::new_for`]) and into another path's layout
//! ([`QMatrix::with_layout`]), the rows read back bit for bit (`gguf_row`), and a
//! matrix of chosen block columns ([`QMatrix::block_columns`], the outlier pass's).
//! Every packing reads its source a row at a time ([`RowSource`]) and writes the one
//! buffer it makes: no whole-matrix copy in between.

use super::weight_buf::WeightBuf;
use super::{ActKind, Layout, QMatrix};
use crate::gguf::GgmlType;
use crate::kernels::quant::{
    BlockQ4_1, BlockQ4_1x16, BlockQ4_1x4, BlockQ8_0, BlockQ8_0x16, BlockQ8_0x4, QK,
};
use crate::kernels::tiles16::Tile16;

/// Where a matrix being packed reads its rows: row `r`'s GGUF bytes, appended to the
/// (cleared) buffer it is given. A slice of the file, or another matrix's rows.
pub type RowSource<'a> = &'a dyn Fn(usize, &mut Vec<u8>);

impl QMatrix {
    /// A matrix of `ty` in `layout` (tiles for Q4_1 and Q8_0 only; `Rows` otherwise),
    /// its rows read one at a time from `row`: no copy of the whole matrix is made
    /// besides the packed one.
    pub(super) fn packed(
        (ty, layout): (GgmlType, Layout),
        (rows, cols, row_bytes): (usize, usize, usize),
        row: RowSource,
    ) -> Self {
        use crate::kernels::tiles16::{
            BlockIq4Nlx16, BlockQ4Kx16, BlockQ4_0x16, BlockQ5Kx16, BlockQ5_0x16, BlockQ6Kx16,
        };
        let shape = (rows, cols, row_bytes);
        match (layout, ty) {
            (Layout::Rows, _) => Self::pack_rows((ty, rows, cols, row_bytes), row),
            (Layout::Tiles16, GgmlType::Q4_1) => Self::pack16::<BlockQ4_1x16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::Q8_0) => Self::pack16::<BlockQ8_0x16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::Q5_0) => Self::pack16::<BlockQ5_0x16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::Q4_0) => Self::pack16::<BlockQ4_0x16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::IQ4_NL) => Self::pack16::<BlockIq4Nlx16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::Q4_K) => Self::pack16::<BlockQ4Kx16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::Q5_K) => Self::pack16::<BlockQ5Kx16>(ty, shape, row),
            (Layout::Tiles16, GgmlType::Q6_K) => Self::pack16::<BlockQ6Kx16>(ty, shape, row),
            (Layout::Tiles16, _) => unreachable!("no sixteen-row tiles for {ty}"),
            (Layout::Tiles4, GgmlType::Q4_1) => {
                let put = |t: &mut BlockQ4_1x4, k: usize, blk: BlockQ4_1| {
                    t.dm[k] = blk.d;
                    t.dm[4 + k] = blk.m;
                    t.qs[k] = blk.qs;
                };
                Self::pack((ty, layout), shape, row, put)
            }
            (Layout::Tiles4, _) => {
                let put = |t: &mut BlockQ8_0x4, k: usize, blk: BlockQ8_0| {
                    t.d[k] = blk.d;
                    t.qs[k].copy_from_slice(&blk.qs[..QK / 2]);
                    t.qs[4 + k].copy_from_slice(&blk.qs[QK / 2..]);
                };
                Self::pack((ty, layout), shape, row, put)
            }
        }
    }

    /// Packs into sixteen-row tiles of `T` ([`Tile16::put`]).
    fn pack16<T: Tile16>(ty: GgmlType, shape: (usize, usize, usize), row: RowSource) -> Self {
        let put = |t: &mut T, r: usize, b: T::Block| t.put(r, &b);
        Self::pack((ty, Layout::Tiles16), shape, row, put)
    }

    /// GGUF's rows, as they are.
    fn pack_rows(
        (ty, rows, cols, row_bytes): (GgmlType, usize, usize, usize),
        row: RowSource,
    ) -> Self {
        let len = rows * row_bytes;
        let mut data = WeightBuf::zeroed(len.div_ceil(8));
        let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..len];
        let mut buf = Vec::with_capacity(row_bytes);
        for (r, dst) in out
            .chunks_exact_mut(row_bytes.max(1))
            .enumerate()
            .take(rows)
        {
            buf.clear();
            row(r, &mut buf);
            dst.copy_from_slice(&buf);
        }
        Self {
            ty,
            rows,
            cols,
            row_bytes,
            layout: Layout::Rows,
            data,
        }
    }

    /// Packs GGUF rows of blocks `B` into tiles `T` of `layout`'s rows, tile-major:
    /// `put(tile, r % tile rows, block)` stores one row's block into its tile. Rows past
    /// the last whole tile stay zero.
    fn pack<B: bytemuck::Pod, T: bytemuck::Pod>(
        (ty, layout): (GgmlType, Layout),
        (rows, cols, row_bytes): (usize, usize, usize),
        row: RowSource,
        put: impl Fn(&mut T, usize, B),
    ) -> Self {
        let nb = row_bytes / std::mem::size_of::<B>();
        let size = std::mem::size_of::<T>();
        let tr = layout.tile_rows();
        let len = rows.div_ceil(tr) * nb * size;
        let mut data = WeightBuf::zeroed(len.div_ceil(8));
        let packed: &mut [T] =
            bytemuck::cast_slice_mut(&mut bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..len]);
        let mut buf = Vec::with_capacity(row_bytes);
        for r in 0..rows {
            buf.clear();
            row(r, &mut buf);
            for (b, raw) in buf.chunks_exact(std::mem::size_of::<B>()).enumerate() {
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
            data,
        }
    }

    /// The same weights, bit for bit, in `layout` (a layout the type has no kernels
    /// for, [`QMatrix::can_take`], is not made: the matrix comes back as it is).
    pub fn with_layout(self, layout: Layout) -> Self {
        if layout == self.layout || !Self::can_take(self.ty, layout) {
            return self;
        }
        let shape = (self.rows, self.cols, self.row_bytes);
        Self::packed((self.ty, layout), shape, &|r, out| self.gguf_row(r, out))
    }

    /// Whether some path's kernels read a matrix of `ty` in `layout`: GGUF's rows for
    /// every type but Q4_1 and Q8_0 (always in tiles), four-row tiles for those two, and
    /// sixteen-row tiles for the types of `tiles16`.
    pub fn can_take(ty: GgmlType, layout: Layout) -> bool {
        use GgmlType::*;
        match layout {
            Layout::Rows => !matches!(ty, Q4_1 | Q8_0),
            Layout::Tiles4 => matches!(ty, Q4_1 | Q8_0),
            Layout::Tiles16 => {
                matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q8_0 | IQ4_NL | Q4_K | Q5_K | Q6_K)
            }
        }
    }

    /// Row `r` as GGUF stores it, appended to `out`.
    pub(super) fn gguf_row(&self, r: usize, out: &mut Vec<u8>) {
        use crate::kernels::tiles16::{
            BlockIq4Nlx16, BlockQ4Kx16, BlockQ4_0x16, BlockQ5Kx16, BlockQ5_0x16, BlockQ6Kx16,
        };
        fn put<T: Tile16>(m: &QMatrix, r: usize, out: &mut Vec<u8>) {
            out.extend_from_slice(bytemuck::cast_slice(&m.lane_blocks::<T>(r)));
        }
        match (self.layout, self.ty) {
            (Layout::Rows, _) => out.extend_from_slice(self.row(r)),
            (Layout::Tiles16, GgmlType::Q4_1) => put::<BlockQ4_1x16>(self, r, out),
            (Layout::Tiles16, GgmlType::Q8_0) => put::<BlockQ8_0x16>(self, r, out),
            (Layout::Tiles16, GgmlType::Q5_0) => put::<BlockQ5_0x16>(self, r, out),
            (Layout::Tiles16, GgmlType::Q4_0) => put::<BlockQ4_0x16>(self, r, out),
            (Layout::Tiles16, GgmlType::IQ4_NL) => put::<BlockIq4Nlx16>(self, r, out),
            (Layout::Tiles16, GgmlType::Q4_K) => put::<BlockQ4Kx16>(self, r, out),
            (Layout::Tiles16, GgmlType::Q5_K) => put::<BlockQ5Kx16>(self, r, out),
            (Layout::Tiles16, _) => put::<BlockQ6Kx16>(self, r, out),
            (_, GgmlType::Q8_0) => out.extend_from_slice(bytemuck::cast_slice(&self.q8_0_row(r))),
            _ => out.extend_from_slice(bytemuck::cast_slice(&self.q4_1_row(r))),
        }
    }

    /// Row r of a matrix in sixteen-row tiles of `T`, as GGUF blocks.
    pub(super) fn lane_blocks<T: Tile16>(&self, r: usize) -> Vec<T::Block> {
        debug_assert_eq!(self.layout, Layout::Tiles16);
        self.tile::<T>(r / 16)
            .iter()
            .map(|t| t.get(r % 16))
            .collect()
    }

    /// [`QMatrix::block_columns`] of a matrix that is not needed after: its own
    /// buffer's pages are given back as its rows are read, so the two are never held
    /// whole at once (the output head, widened by the outlier pass, is the largest
    /// matrix of most models). `Err` gives the matrix back, untouched, where
    /// `block_columns` would give `None`.
    pub fn into_block_columns(self, blocks: &[usize]) -> Result<QMatrix, QMatrix> {
        let nb = self.cols / QK;
        if self.act_kind() != ActKind::Q8 || blocks.iter().any(|&b| b >= nb) {
            return Err(self);
        }
        let size = self.row_bytes / nb;
        let row_bytes = blocks.len() * size;
        let (ty, layout, rows, own_bytes) = (self.ty, self.layout, self.rows, self.row_bytes);
        // The words before row `r`'s: in tile layouts, the tiles wholly before it (a
        // tile holds `tile_rows` rows of `own_bytes` each).
        let words_before = move |r: usize| match layout {
            Layout::Rows => r * own_bytes / 8,
            _ => r / layout.tile_rows() * layout.tile_rows() * own_bytes / 8,
        };
        let old = std::cell::RefCell::new(self);
        let source = |r: usize, out: &mut Vec<u8>| {
            let mut m = old.borrow_mut();
            let mut own = Vec::with_capacity(m.row_bytes);
            m.gguf_row(r, &mut own);
            for &b in blocks {
                out.extend_from_slice(&own[b * size..(b + 1) * size]);
            }
            if (r + 1).is_multiple_of(256) {
                let upto = words_before(r + 1);
                m.data.release(0..upto);
            }
        };
        let shape = (rows, blocks.len() * QK, row_bytes);
        Ok(Self::packed((ty, layout), shape, &source))
    }

    /// Every row as GGUF stores it, one after another (the tests' check that packing
    /// keeps every bit).
    #[cfg(test)]
    pub(crate) fn gguf_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows * self.row_bytes);
        for r in 0..self.rows {
            self.gguf_row(r, &mut out);
        }
        out
    }

    /// Row r of a packed Q8_0 matrix as GGUF blocks.
    pub(super) fn q8_0_row(&self, r: usize) -> Vec<BlockQ8_0> {
        if self.layout == Layout::Tiles16 {
            return self.lane_blocks::<BlockQ8_0x16>(r);
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
            return self.lane_blocks::<BlockQ4_1x16>(r);
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
        let row_bytes = blocks.len() * size;
        let source = |r: usize, out: &mut Vec<u8>| {
            let mut own = Vec::with_capacity(self.row_bytes);
            self.gguf_row(r, &mut own);
            for &b in blocks {
                out.extend_from_slice(&own[b * size..(b + 1) * size]);
            }
        };
        let shape = (self.rows, blocks.len() * QK, row_bytes);
        Some(Self::packed((self.ty, self.layout), shape, &source))
    }
}
