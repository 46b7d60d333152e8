//! AVX-512 (F, BW, VL, VNNI) matmul kernels, chosen at run time when the CPU runs them
//! (see `detect.rs`; the path's other kernels are the AVX2 ones), over tiles of sixteen
//! rows, one 32-bit lane per row ([`BlockQ4_1x16`], [`BlockQ8_0x16`]: the layout
//! `QMatrix` takes for this path; a matrix in the four-row layout runs the AVX2
//! kernels, with EVEX `vpdpbusd`, and gets their bits).
//!
//! Lane r of a weight vector holds four consecutive weights of row r as unsigned bytes,
//! and the activations' matching four bytes are broadcast to every lane (a load, no
//! shuffle), so one `vpdpbusd` adds four products to each of sixteen rows, and eight of
//! them sum a whole 32-weight block in integers, exactly (as two chains of four, added:
//! half the latency, the same integer). The float work (convert, scale, accumulate) is
//! then done once per block for sixteen rows. This path's kernels before (four rows per
//! vector, four lanes per row, on four-row tiles) did it for every four rows: 24 vector
//! operations per 512 multiply-adds of Q4_1 there, 13 here (and the nibble split, once
//! per block for all the activation rows of a call). On a 2-core
//! Emerald Rapids, alternated: pp512 627-711 → 762-960 tok/s (`folio bench`), batched
//! decode of 16 sequences 494-532 → 545-666.
//!
//! Per row, per block, in block order (the scalar twins `scalar::dot_q4_1_rows16` and
//! `scalar::dot_q8_0_rows16` are the same arithmetic):
//! - Q4_1: `acc = fma(d·d_x, Σ q·x, acc)` and, apart, `macc = fma(m, s_x, macc)`; the
//!   result is `acc + macc`.
//! - Q8_0: `acc = fma(d·d_x, Σ q·x, acc)`. The weights are stored offset by 128 (the
//!   unsigned operand); the integer sum starts from -128·Σx, the activation block's sum
//!   ([`ActKind::Q8Sums`](super::matmul::ActKind)), so it is Σ q·x exactly.
//!
//! Every activation row gets the same instructions whatever the tile width, so batch
//! invariance holds.
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

/// Activation block `x`'s four bytes `4k..4k+4`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn dword(x: &BlockQ8, k: usize) -> __m512i {
    let q: [u8; 4] = std::array::from_fn(|j| x.qs[4 * k + j] as u8);
    _mm512_set1_epi32(i32::from_le_bytes(q))
}

/// Sixteen packed Q4_1 rows × C activation rows: `out[c][r] = dot(row r, a[c])`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q4_1x16<const C: usize>(
    w: &[BlockQ4_1x16],
    a: [&[BlockQ8]; C],
    out: &mut [[f32; 16]; C],
) {
    let nb = tile_blocks(w, &a);
    let low4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS / 4, 5);
        let b = &w[i];
        // SAFETY: `d` is 16 halves (32 bytes); `qs` is 4 × 64 bytes.
        let (d, raw) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(b.d.as_ptr() as *const __m256i)),
                std::array::from_fn::<_, 4, _>(|j| {
                    _mm512_loadu_si512(b.qs[j].as_ptr() as *const __m512i)
                }),
            )
        };
        // Weights 4j..4j+4 of each row (low nibbles), then 16+4j.. (high).
        let q: [__m512i; 8] = std::array::from_fn(|k| {
            if k < 4 {
                _mm512_and_si512(raw[k], low4)
            } else {
                _mm512_and_si512(_mm512_srli_epi16(raw[k - 4], 4), low4)
            }
        });
        for c in 0..C {
            let x = &a[c][i];
            let (mut p, mut p2) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..4 {
                p = _mm512_dpbusd_epi32(p, q[k], dword(x, k));
                p2 = _mm512_dpbusd_epi32(p2, q[k + 4], dword(x, k + 4));
            }
            let p = _mm512_add_epi32(p, p2);
            let sc = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
            acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[c]);
        }
    }
    // The min terms in their own sums, added at the end (as llama.cpp's kernels keep
    // them), in a second pass over the tile (now in L1): beside the first pass's eight
    // weight vectors, C more accumulators would not fit in the registers.
    let mut macc = [_mm512_setzero_ps(); C];
    for (i, b) in w[..nb].iter().enumerate() {
        // SAFETY: `m` is 16 halves (32 bytes).
        let m = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(b.m.as_ptr() as *const __m256i)) };
        for c in 0..C {
            macc[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[c][i].s), macc[c]);
        }
    }
    for c in 0..C {
        // SAFETY: `out[c]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[c].as_mut_ptr(), _mm512_add_ps(acc[c], macc[c])) };
    }
}

/// Sixteen packed Q8_0 rows (offset by 128) × C activation rows: `out[c][r] = dot(row
/// r, a[c])`; `sums[c]` holds -128·Σx of each of `a[c]`'s blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q8_0x16<const C: usize>(
    w: &[BlockQ8_0x16],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &mut [[f32; 16]; C],
) {
    let nb = tile_blocks(w, &a);
    assert!(C <= 8 && sums.iter().all(|s| s.len() == nb));
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS / 4, 9);
        let b = &w[i];
        // SAFETY: `d` is 16 halves (32 bytes); `qs` is 8 × 64 bytes.
        let (d, q) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(b.d.as_ptr() as *const __m256i)),
                std::array::from_fn::<_, 8, _>(|k| {
                    _mm512_loadu_si512(b.qs[k].as_ptr() as *const __m512i)
                }),
            )
        };
        // Unrolled by hand (C ≤ 8, constant indices): as a loop, LLVM kept the widest
        // case rolled with its accumulators on the stack.
        macro_rules! row {
            ($($c:literal)*) => {$(
                if $c < C {
                    let x = &a[$c][i];
                    let mut p = _mm512_set1_epi32(sums[$c][i]);
                    let mut p2 = _mm512_setzero_si512();
                    for k in 0..4 {
                        p = _mm512_dpbusd_epi32(p, q[k], dword(x, k));
                        p2 = _mm512_dpbusd_epi32(p2, q[k + 4], dword(x, k + 4));
                    }
                    let p = _mm512_add_epi32(p, p2);
                    let sc = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
                    acc[$c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[$c]);
                }
            )*};
        }
        row!(0 1 2 3 4 5 6 7);
    }
    for c in 0..C {
        // SAFETY: `out[c]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[c].as_mut_ptr(), acc[c]) };
    }
}

/// One activation row against consecutive Q4_1 tiles of `nb` blocks each:
/// `out[16t + r] = dot(row r of tile t, a)`, each tile by `tile_q4_1x16`'s arithmetic
/// (looped here, compiled for the kernel's features, so the kernel inlines: decode's
/// matmuls are one row against thousands of tiles).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tiles_q4_1x16_one_row(w: &[BlockQ4_1x16], nb: usize, a: &[BlockQ8], out: &mut [f32]) {
    assert_eq!(
        w.len(),
        out.len() / 16 * nb,
        "a tile of blocks per 16 outputs"
    );
    for (tile, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(16)) {
        let mut r = [[0f32; 16]; 1];
        // SAFETY: same CPU features as this function.
        unsafe { tile_q4_1x16::<1>(tile, [a], &mut r) };
        o.copy_from_slice(&r[0]);
    }
}

/// [`tiles_q4_1x16_one_row`] for Q8_0 tiles; `sums` as in [`tile_q8_0x16`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tiles_q8_0x16_one_row(
    w: &[BlockQ8_0x16],
    nb: usize,
    a: &[BlockQ8],
    sums: &[i32],
    out: &mut [f32],
) {
    assert_eq!(
        w.len(),
        out.len() / 16 * nb,
        "a tile of blocks per 16 outputs"
    );
    for (tile, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(16)) {
        let mut r = [[0f32; 16]; 1];
        // SAFETY: same CPU features as this function.
        unsafe { tile_q8_0x16::<1>(tile, [a], [sums], &mut r) };
        o.copy_from_slice(&r[0]);
    }
}
