//! AVX-512 (F, BW, VL, VNNI) matmul kernels, chosen at run time when the CPU runs them
//! (see `detect.rs`; the path's other kernels are the AVX2 ones).
//!
//! `vpdpbusd` multiplies unsigned by signed bytes and sums four products into each
//! 32-bit lane in one instruction: exact integer sums, where AVX2 needs two
//! instructions (`maddubs`, `madd`). Then, per 32-weight block, the lanes go to float
//! and are scaled.
//! - Q4_1 (`tile_q4_1x4`, the default model's format) puts four rows in one vector, 4
//!   lanes per row, each lane summing 8 products (4 of the low nibbles, 4 of the high):
//!   half the float work of 8 lanes per row. (A variant that kept the AVX2 lanes, and
//!   so llama.cpp's AVX2 bits, prefilled at 0.83x of this one on a Zen 4: pp512
//!   595-636 tok/s against 715-770.)
//! - Q8_0 (`tile_q8_0`, the default model's output head) the same way, from tiles
//!   packed at load with four rows' first halves together and their second halves
//!   together. (The variant with AVX2's lanes and bits, on GGUF rows, decoded 16
//!   sequences at 518-526 tok/s against 529-618.)
//!
//! Their bits differ from the AVX2 path's by summation order only; every (row, column)
//! gets the same instructions whatever the tile width, so batch invariance holds on
//! this path as on the others.
//!
//! Every function here is `unsafe` only because it is compiled for CPU features the
//! caller must have checked; slices are indexed with bounds checks.
#![allow(unsafe_code)]

use super::avx2::{prefetch, tile_blocks, TILE_PREFETCH_BLOCKS};
use super::quant::*;
use std::arch::x86_64::*;

/// Runs one 512-bit VNNI instruction (and a zmm xor): `detect` executes this in a child
/// process before choosing the AVX-512 path.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn probe() {
    // SAFETY: register-only instructions of the features this function requires.
    unsafe {
        std::arch::asm!(
            "vpxord {z}, {z}, {z}",
            "vpdpbusd {z}, {z}, {z}",
            z = out(zmm_reg) _,
            options(nomem, nostack, preserves_flags),
        );
    }
}

/// Lane l of a 16-lane vector belongs to row l / 4: the index vector that spreads four
/// rows' scales over their lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn rows_of_lanes() -> __m512i {
    _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
}

/// An activation block's first and last 16 values, each broadcast to all four rows.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves(x: &BlockQ8) -> (__m512i, __m512i) {
    let q = x.qs.as_ptr() as *const __m128i;
    // SAFETY: `qs` is 32 readable bytes: two 16-byte loads.
    unsafe {
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(q)),
            _mm512_broadcast_i32x4(_mm_loadu_si128(q.add(1))),
        )
    }
}

/// Each row's sum of its four lanes (lanes 4r..4r+4), in one fixed order.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn row_sums(acc: __m512) -> [f32; 4] {
    let mut v = [0f32; 16];
    // SAFETY: `v` is 16 floats.
    unsafe { _mm512_storeu_ps(v.as_mut_ptr(), acc) };
    std::array::from_fn(|r| {
        let l = &v[4 * r..4 * r + 4];
        (l[0] + l[2]) + (l[1] + l[3])
    })
}

/// Four packed Q4_1 rows × C activation rows: `out[r][c] = dot(row r, a[c])`.
///
/// The tile's 64 nibble bytes (16 per row) load as one vector, split into low and high
/// nibbles; each activation block's halves are broadcast to the four rows' lanes. Lane
/// 4r+k then holds row r's products of weights 4k..4k+3 and 16+4k..16+4k+3, scaled by
/// d_r·d_x and accumulated over blocks; the min terms m_r·s_x accumulate as in the AVX2
/// kernel. The four lanes of a row are summed in a fixed order at the end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q4_1x4<const C: usize>(
    w: &[BlockQ4_1x4],
    a: [&[BlockQ8]; C],
    out: &mut [[f32; C]; 4],
) {
    let nb = tile_blocks(w, &a);
    let low4 = _mm512_set1_epi8(0x0F);
    let row_of = rows_of_lanes();
    let mut acc = [_mm512_setzero_ps(); C];
    let mut macc = [_mm256_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS, 2);
        let b = &w[i];
        // SAFETY: `dm` is 8 halves (16 bytes); `qs` is 4 × 16 contiguous bytes.
        let (dm, raw) = unsafe {
            (
                _mm256_cvtph_ps(_mm_loadu_si128(b.dm.as_ptr() as *const __m128i)),
                _mm512_loadu_si512(b.qs.as_ptr() as *const __m512i),
            )
        };
        let d = _mm512_permutexvar_ps(row_of, _mm512_castps256_ps512(dm));
        let wl = _mm512_and_si512(raw, low4);
        let wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        for c in 0..C {
            let x = &a[c][i];
            let (al, ah) = halves(x);
            let p =
                _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wl, al), wh, ah);
            let sc = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
            acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[c]);
            // Lanes 4..7: fma(m_r, s_x, acc), the min terms.
            macc[c] = _mm256_fmadd_ps(dm, _mm256_set1_ps(x.s), macc[c]);
        }
    }
    for c in 0..C {
        let mut m = [0f32; 8];
        // SAFETY: `m` is 8 floats.
        unsafe { _mm256_storeu_ps(m.as_mut_ptr(), macc[c]) };
        // SAFETY: same CPU features as this function.
        let sums = unsafe { row_sums(acc[c]) };
        for (r, row) in out.iter_mut().enumerate() {
            row[c] = sums[r] + m[4 + r];
        }
    }
}

/// Four packed Q8_0 rows × C activation rows, 4 lanes per row as `tile_q4_1x4`: the
/// tile's first halves of four rows are one 64-byte load, its second halves another,
/// so lane 4r+k sums row r's products of weights 4k..4k+3 and 16+4k..16+4k+3.
///
/// `a` is the activations offset by 128 ([`ActKind::Q8Offset`](super::matmul::ActKind)),
/// the unsigned operand of `vpdpbusd`, against the weights as they are (signed): each
/// lane sums (x + 128)·w, and starts from -128·Σw, made once per block from the weights
/// (`vpdpbusd` of 0x80 bytes). The lane's integer is Σ x·w exactly, the same integer
/// the signs-onto-activations form (|w| · ±x, two masked negations per activation
/// block) gave, so the bits are those of that form with two fewer operations per
/// column and block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q8_0<const C: usize>(
    w: &[BlockQ8_0x4],
    a: [&[BlockQ8]; C],
    out: &mut [[f32; C]; 4],
) {
    let nb = tile_blocks(w, &a);
    let row_of = rows_of_lanes();
    let offset = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS, 3);
        let b = &w[i];
        // SAFETY: `qs` is 8 × 16 contiguous bytes, `d` 4 halves (8 bytes).
        let (wl, wh, dh) = unsafe {
            (
                _mm512_loadu_si512(b.qs.as_ptr() as *const __m512i),
                _mm512_loadu_si512(b.qs[4].as_ptr() as *const __m512i),
                _mm_loadl_epi64(b.d.as_ptr() as *const __m128i),
            )
        };
        let zero = _mm512_setzero_si512();
        let lift = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, offset, wl), offset, wh);
        let start = _mm512_sub_epi32(zero, lift);
        let d = _mm512_permutexvar_ps(row_of, _mm512_castps128_ps512(_mm_cvtph_ps(dh)));
        for c in 0..C {
            let x = &a[c][i];
            let (al, ah) = halves(x);
            let p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, al, wl), ah, wh);
            let sc = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
            acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[c]);
        }
    }
    for c in 0..C {
        // SAFETY: same CPU features as this function.
        let sums = unsafe { row_sums(acc[c]) };
        for (r, row) in out.iter_mut().enumerate() {
            row[c] = sums[r];
        }
    }
}

super::one_row_over_tiles!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    tiles_q4_1x4_one_row,
    tile_q4_1x4,
    BlockQ4_1x4
);
super::one_row_over_tiles!(
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    tiles_q8_0_one_row,
    tile_q8_0,
    BlockQ8_0x4
);
