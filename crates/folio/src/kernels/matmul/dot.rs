//! One weight row against one activation row through the per-pair kernels (the path's,
//! or the scalar twins), and an AVX2 register tile of rows × activation rows over GGUF's
//! rows of the 32-element formats: what runs where no tile kernel reads the layout.

use super::{Activations, Layout, QMatrix};
use crate::gguf::GgmlType;
#[cfg(target_arch = "x86_64")]
use crate::kernels::quant::{
    BlockIq4Nl, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8, BlockQ8_0,
};
use crate::kernels::{scalar, Isa};

impl QMatrix {
    /// dot(row r, activation row t) through the per-pair kernels. Packed matrices
    /// reach here only where their layout is not the path's: four-row tiles on the
    /// scalar path, sixteen-row tiles on the scalar path and (Q4_1, Q8_0) the AVX2
    /// paths (`run_tile` runs the tile kernels of the others).
    #[inline]
    pub(super) fn dot(&self, isa: Isa, r: usize, act: &Activations, t: usize) -> f32 {
        let c = self.cols;
        if self.layout == Layout::Tiles16 {
            // A path without a tile kernel for this layout: the tile kernels' bits, by
            // the scalar twins.
            use crate::kernels::tiles16::{
                BlockIq4Nlx16, BlockQ4Kx16, BlockQ4_0x16, BlockQ5Kx16, BlockQ5_0x16, BlockQ6Kx16,
            };
            return match self.ty {
                GgmlType::Q8_0 => scalar::dot_q8_0_rows16(&self.q8_0_row(r), act.q8_row(t, c)),
                GgmlType::Q4_1 => scalar::dot_q4_1_rows16(&self.q4_1_row(r), act.q8_row(t, c)),
                GgmlType::Q5_0 => {
                    scalar::dot_q5_0_rows16(&self.lane_blocks::<BlockQ5_0x16>(r), act.q8_row(t, c))
                }
                GgmlType::Q4_0 => {
                    scalar::dot_q4_0_rows16(&self.lane_blocks::<BlockQ4_0x16>(r), act.q8_row(t, c))
                }
                GgmlType::IQ4_NL => scalar::dot_iq4nl_rows16(
                    &self.lane_blocks::<BlockIq4Nlx16>(r),
                    act.q8_row(t, c),
                ),
                GgmlType::Q4_K => {
                    scalar::dot_q4k_rows16(&self.lane_blocks::<BlockQ4Kx16>(r), act.q8k_row(t, c))
                }
                GgmlType::Q5_K => {
                    scalar::dot_q5k_rows16(&self.lane_blocks::<BlockQ5Kx16>(r), act.q8k_row(t, c))
                }
                _ => scalar::dot_q6k_rows16(&self.lane_blocks::<BlockQ6Kx16>(r), act.q8k_row(t, c)),
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
                use crate::kernels::{avx2, avx2_kquants};
                return match self.ty {
                    GgmlType::F32 => avx2::dot_f32(bytemuck::cast_slice(b), act.f32_row(t, c)),
                    GgmlType::F16 => avx2::dot_f16(bytemuck::cast_slice(b), act.f32_row(t, c)),
                    GgmlType::BF16 => avx2::dot_bf16(bytemuck::cast_slice(b), act.f32_row(t, c)),
                    GgmlType::Q4_K => avx2::dot_q4k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
                    GgmlType::Q6_K => avx2::dot_q6k(bytemuck::cast_slice(b), act.q8k_row(t, c)),
                    GgmlType::Q2_K => {
                        avx2_kquants::dot_q2k(bytemuck::cast_slice(b), act.q8k_row(t, c))
                    }
                    GgmlType::Q3_K => {
                        avx2_kquants::dot_q3k(bytemuck::cast_slice(b), act.q8k_row(t, c))
                    }
                    GgmlType::Q5_K => {
                        avx2_kquants::dot_q5k(bytemuck::cast_slice(b), act.q8k_row(t, c))
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
    pub(super) unsafe fn tile_avx2<const D: u8, const R: usize, const C: usize>(
        &self,
        r0: usize,
        act: &Activations,
        t0: usize,
        out: &mut [[f32; C]; R],
    ) {
        use crate::kernels::avx2;
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
