//! AVX2 sixteen-row tile kernels for Q4_1, Q8_0, Q4_0, IQ4_NL and Q5_K over the
//! AVX-512 path's layouts ([`BlockQ4_1x16`], [`BlockQ8_0x16`], [`BlockQ4_0x16`],
//! [`BlockIq4Nlx16`], [`BlockQ5Kx16`]), in the shape of
//! `avx2_tiles16`'s (whose helpers they share: two halves of eight rows on 256-bit
//! vectors, the 8-bit dot step `D`, the widths and the passes over the halves), with
//! the AVX-512 kernels' bits (`avx512::tile_q4_1x16` and `tile_q8_0x16`,
//! `avx512_kquants::tile_q32x16` and `tile_kx16`; the scalar twins
//! `scalar::dot_q4_1_rows16`, `dot_q8_0_rows16`, `dot_q4_0_rows16`, `dot_iq4nl_rows16`
//! and `dot_q5k_rows16` define them).
//!
//! `vpmaddubsw` saturates at ±32767; with activations within -128..=127 none of these
//! sums gets there:
//! - Q4_0 and Q4_1: nibbles 0..=15 (Q4_0's -8 is in the sum's start): a pair
//!   2·15·128 = 3840, eight vectors summed 30720;
//! - Q5_K: 5-bit 0..=31: 2·31·128 = 7936, four summed 31744;
//! - Q8_0: its bytes offset by 128 (as the VNNI steps take them) would saturate a pair,
//!   so with `MADD` they are moved back to signed and taken by sign, as IQ4_NL's
//!   levels below (a pair at most 2·128·127 = 32512).
//! - IQ4_NL: its levels moved up by 128 (as the VNNI steps and AVX-512 take them) reach
//!   241, and a pair 2·241·128 would saturate. So with `MADD` the levels stay signed
//!   (-127..=113) and each vector is taken as |level| times the activation with the
//!   level's sign (`vpsignb`, as `avx2`'s IQ4_NL row kernel): a pair at most 2·127·127 =
//!   32258 (Q8 activations are within ±127: `scalar::quantize_q8`), each vector's pairs
//!   widened to 32 bits on its own. The sum is Σ level·x either way (the VNNI steps'
//!   Σ (level + 128)·x starts from -128·Σx), exact, so every path gives the same bits.
//!
//! Per row, in order (as the AVX-512 kernels and the twins):
//! - Q4_1, per block: `acc = fma(d·d_x, Σ q·x, acc)`, and apart `macc = fma(m, s_x,
//!   macc)`; the result is `acc + macc`.
//! - Q8_0, per block: `acc = fma(d·d_x, Σ q·x, acc)`.
//! - Q4_0 and IQ4_NL, per block: `acc = fma(d·d_x, Σ v·x, acc)` with v the signed
//!   value; the integer sum of the unsigned bytes starts from -8·Σx (a sixteenth of the
//!   Q8_0 kernel's block sums, `ActKind::Q8Sums`) for Q4_0, -128·Σx for IQ4_NL's
//!   levels moved up (the VNNI steps) or zero (`MADD`, signed levels).
//! - Q5_K, per super-block: for each sub-block j of 32, `acc = fma((d·sc_j)·d_x, Σ q·x,
//!   acc)`; then `acc = fnmadd(dmin·d_x, Σ_j m_j·Σx_j, acc)` (the mins' sum in integers
//!   by `vpmaddwd` over pairs of sub-blocks, as `avx2_tiles16`'s Q4_K).
//!
//! Every activation row gets the same instructions whatever the tile width (batch
//! invariance). Eight weight vectors per (sub-)block: both halves in one pass over the
//! blocks at width one (decode), half by half wider, as `avx2_tiles16`'s Q5_0 and Q4_K;
//! at width one each block's lines are asked into L2 ahead, as there.
//!
//! Measured against the row kernels they replace (Llama-1B shape requantized,
//! `FOLIO_ISA=avx2`, 2 threads, shared Zen 4, alternating builds): Q4_0 pp256 34.3
//! against 16.2 tok/s, tg32 13.5 against 5.0; IQ4_NL pp256 30.6 against 15.9, tg32 14.8
//! against 5.8. Q5_K's (Q5_K_M: pp512 12.0 against 12.7-13.5, tg64 4.9-5.4 against
//! 6.0-7.4) was slower than `avx2_kquants`' row dot (not yet looked into; register pressure
//! is likely: a sub-block's eight vectors, the fifth-bit plane and two masks), so the AVX2 paths
//! keep Q5_K in rows (`QMatrix::layout_for`) and run this kernel only on tiles laid out
//! for AVX-512.
//!
//! Every function here is `unsafe` because it is compiled for CPU features the caller
//! must have checked (and step `D`'s instruction), and writes through a [`TileOut`]'s
//! pointer (the caller vouches for its rows); slices are indexed with bounds checks.
#![allow(unsafe_code)]

use super::avx2_tiles16::{
    ahead, dword, each_row, half, half_bytes_ps, half_ps, halves, isum, k_mins, launder, one_row,
    shift, store_half,
};
use super::avx512::{tile_blocks, TileOut};
use super::avxvnni::{sums_add, MADD};
use super::quant::*;
use super::tiles16::{BlockIq4Nlx16, BlockQ4_0x16, BlockQ5Kx16};
use std::arch::x86_64::*;

/// The tiles of the 32-weight formats with one scale and four-bit values and no fifth
/// bits (Q4_0, IQ4_NL): the scales and the nibbles (as Q4_0's).
pub trait NibbleTile: bytemuck::Pod + Sync {
    /// The unsigned bytes' sum starts from -128·Σx >> `SUMS_SHIFT` (Q4_0: 4, the
    /// offset 8; IQ4_NL: 0, its levels moved up by 128 on the VNNI steps).
    const SUMS_SHIFT: u32;
    /// Whether the nibbles index IQ4_NL's levels rather than being the value.
    const LEVELS: bool;
    fn d(&self) -> &[u16; 16];
    fn qs(&self) -> &[[u8; 64]; 4];
}

impl NibbleTile for BlockQ4_0x16 {
    const SUMS_SHIFT: u32 = 4;
    const LEVELS: bool = false;
    fn d(&self) -> &[u16; 16] {
        &self.d
    }
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.qs
    }
}

impl NibbleTile for BlockIq4Nlx16 {
    const SUMS_SHIFT: u32 = 0;
    const LEVELS: bool = true;
    fn d(&self) -> &[u16; 16] {
        &self.d
    }
    fn qs(&self) -> &[[u8; 64]; 4] {
        &self.qs
    }
}

/// Σ_k (lane-wise 4-byte dot of the signed bytes `q[k]` with activation bytes 4k..4k+4
/// of `x`), in 32-bit lanes, exactly, with `vpmaddubsw`: |q| times x with q's sign, each
/// vector's 16-bit pairs widened on their own (the module doc's bound).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed_isum(q: &[__m256i; 8], x: &[i8]) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut p = _mm256_setzero_si256();
    for (k, &qk) in q.iter().enumerate() {
        let s = _mm256_sign_epi8(dword(x, k), qk);
        let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(qk, qk), s);
        p = _mm256_add_epi32(p, _mm256_madd_epi16(prod, ones));
    }
    p
}

/// Weight vector k < 8 of half `h` of a tile of nibbles (Q4_0's, Q4_1's, IQ4_NL's
/// layout): weights 4k..4k+4 of each of the half's rows, from `qs[k % 4]`, the low
/// nibbles for k < 4, the high ones after.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[[u8; 64]; 4], h: usize) -> [__m256i; 8] {
    let low4 = _mm256_set1_epi8(0x0F);
    std::array::from_fn(|k| {
        let raw = half(&qs[k % 4], h);
        let nib = if k < 4 {
            raw
        } else {
            _mm256_srli_epi16::<4>(raw)
        };
        _mm256_and_si256(nib, low4)
    })
}

/// Sixteen packed Q4_1 rows × C activation rows: `dot(row r, a[c])` written to `out`
/// for each c, r (the nibbles' sum from zero; the mins' terms, `fma(m, s_x)` per block,
/// in their own sum added at the end, as the AVX-512 kernel and the twin keep them).
///
/// # Safety
/// As [`tile_q4x16`]'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4_1x16<const D: u8, const C: usize>(
    w: &[BlockQ4_1x16],
    a: [&[BlockQ8]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    let zero = _mm256_setzero_si256();
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let b = &w[i];
            let a = launder(a, h);
            if C == 1 && h == 0 {
                ahead(w, i, (0, 1));
            }
            let d = half_ps(&b.d, h);
            let q = nibbles(&b.qs, h);
            each_row!(C, |c| {
                let x = &a[c][i];
                let p = isum!(D, 8, zero, &q, &x.qs);
                let sc = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
            });
        }};
    }
    // The mins, a second pass over the tile's scales (now in L1), per row.
    macro_rules! mins {
        ($acc:expr, $h:expr) => {{
            let h = $h;
            each_row!(C, |c| {
                let mut macc = _mm256_setzero_ps();
                for (b, x) in w[..nb].iter().zip(a[c]) {
                    macc = _mm256_fmadd_ps(half_ps(&b.m, h), _mm256_set1_ps(x.s), macc);
                }
                $acc[c] = _mm256_add_ps($acc[c], macc);
            });
        }};
    }
    // As Q4_0's.
    halves!(C, 1, nb, out, step, mins);
}

/// Sixteen packed Q8_0 rows (offset by 128, as the AVX-512 layout stores them) × C
/// activation rows: `dot(row r, a[c])` written to `out` for each c, r; `sums` holds
/// -128·Σx of each of `a`'s blocks, the start of the VNNI steps' sum of the offset
/// bytes. With `MADD` the offset bytes would saturate `vpmaddubsw` (a pair 2·255·127),
/// so the weights are moved back to signed bytes and taken as |q| times x with q's
/// sign ([`signed_isum`]; a pair at most 2·128·127 = 32512); the integer sum is Σ q·x
/// exactly either way.
///
/// # Safety
/// As [`tile_q4x16`]'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q8_0x16<const D: u8, const C: usize>(
    w: &[BlockQ8_0x16],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    assert!(sums.iter().all(|s| s.len() == nb));
    let flip = _mm256_set1_epi8(i8::MIN);
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let b = &w[i];
            let (a, sums) = (launder(a, h), launder(sums, h));
            if C == 1 && h == 0 {
                ahead(w, i, (0, 1));
            }
            let d = half_ps(&b.d, h);
            let q: [__m256i; 8] = std::array::from_fn(|k| {
                let raw = half(&b.qs[k], h);
                if D == MADD {
                    _mm256_xor_si256(raw, flip)
                } else {
                    raw
                }
            });
            each_row!(C, |c| {
                let x = &a[c][i];
                let p = if D == MADD {
                    signed_isum(&q, &x.qs)
                } else {
                    isum!(D, 8, _mm256_set1_epi32(sums[c][i]), &q, &x.qs)
                };
                let sc = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
            });
        }};
    }
    // Eight weight vectors: as Q4_0's.
    halves!(C, 1, nb, out, step);
}

/// Sixteen packed Q4_0 or IQ4_NL rows × C activation rows: `dot(row r, a[c])` written to
/// `out` for each c, r; `sums` holds -128·Σx of each of `a`'s blocks (the Q8_0 kernel's).
///
/// # Safety
/// The CPU runs this function's features and step `D`'s instruction, and for every
/// c < C, `out.ptr + c·out.stride` is valid for reads and writes of `out.len` floats
/// that nothing else accesses during the call.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4x16<const D: u8, T: NibbleTile, const C: usize>(
    w: &[T],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    assert!(sums.iter().all(|s| s.len() == nb));
    // IQ4_NL's levels, signed for `MADD`'s `vpsignb` form, else moved up by 128.
    let levels = {
        let up = if D == MADD { 0 } else { 0x80 };
        let l: [u8; 16] = IQ4NL_VALUES.map(|v| (v as u8) ^ up);
        // SAFETY: `l` is 16 bytes.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(l.as_ptr() as *const __m128i) })
    };
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let b = &w[i];
            let (a, sums) = (launder(a, h), launder(sums, h));
            if C == 1 && h == 0 {
                ahead(w, i, (0, 1));
            }
            let d = half_ps(b.d(), h);
            // IQ4_NL's levels looked up.
            let q = nibbles(b.qs(), h).map(|nib| {
                if T::LEVELS {
                    _mm256_shuffle_epi8(levels, nib)
                } else {
                    nib
                }
            });
            each_row!(C, |c| {
                let x = &a[c][i];
                let p = if T::LEVELS && D == MADD {
                    signed_isum(&q, &x.qs)
                } else {
                    let init = _mm256_set1_epi32(sums[c][i] >> T::SUMS_SHIFT);
                    isum!(D, 8, init, &q, &x.qs)
                };
                let sc = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
            });
        }};
    }
    // Eight weight vectors: as `avx2_tiles16`'s Q5_0.
    halves!(C, 1, nb, out, step);
}

/// Sixteen packed Q5_K rows × C activation rows (Q8_K), as [`tile_q4x16`] (and with its
/// contract).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q5kx16<const D: u8, const C: usize>(
    w: &[BlockQ5Kx16],
    a: [&[BlockQ8K]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    let (low4, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let zero = _mm256_setzero_si256();
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let (t, b) = (&w[i], &w[i].k4);
            let a = launder(a, h);
            let d = half_ps(&b.d, h);
            // Sub-block j = 2p + e: the low nibbles of vectors 8p.. (e = 0), the high
            // ones (e = 1), and bit k of `qh[j]` moved to bit 4 of vector k; in
            // sub-block order, a constant shift each.
            macro_rules! sub {
                ($p:ident, $e:literal) => {{
                    let j = 2 * $p + $e;
                    if C == 1 && h == 0 {
                        ahead(w, i, (j, 8));
                    }
                    let qh = half(&t.qh[j], h);
                    let q: [__m256i; 8] = std::array::from_fn(|k| {
                        let raw = half(&b.qs[8 * $p + k], h);
                        let raw = if $e == 0 {
                            raw
                        } else {
                            _mm256_srli_epi16::<4>(raw)
                        };
                        let high = _mm256_and_si256(shift(qh, 4 - k as i32), bit4);
                        _mm256_or_si256(_mm256_and_si256(raw, low4), high)
                    });
                    let s = _mm256_mul_ps(d, half_bytes_ps(&b.sc[j], h, false));
                    each_row!(C, |c| {
                        let x = &a[c][i];
                        let p = isum!(D, 4, zero, &q, &x.qs[32 * j..32 * j + 32]);
                        let sc = _mm256_mul_ps(s, _mm256_set1_ps(x.d));
                        $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
                    });
                }};
            }
            for p in 0..4 {
                sub!(p, 0);
                sub!(p, 1);
            }
            // The mins, as Q4_K's.
            k_mins!(C, b, a, i, h, $acc);
        }};
    }
    // As Q4_K's.
    halves!(C, 1, nb, out, step);
}

one_row!(tiles_q4_1x16_one_row, tile_q4_1x16, BlockQ4_1x16, BlockQ8);
one_row!(
    tiles_q8_0x16_one_row,
    tile_q8_0x16,
    BlockQ8_0x16,
    BlockQ8,
    sums
);
one_row!(
    tiles_q4_0x16_one_row,
    tile_q4x16<BlockQ4_0x16>,
    BlockQ4_0x16,
    BlockQ8,
    sums
);
one_row!(
    tiles_iq4nlx16_one_row,
    tile_q4x16<BlockIq4Nlx16>,
    BlockIq4Nlx16,
    BlockQ8,
    sums
);
one_row!(tiles_q5kx16_one_row, tile_q5kx16, BlockQ5Kx16, BlockQ8K);
