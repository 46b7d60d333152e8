//! AVX2 twins of the Q2_K, Q3_K and Q5_K dot products (issue 15's K-quants), beside
//! `avx2.rs` so that neither file grows past a readable size.
//!
//! Unlike the other AVX2 dots, each of these sums a block exactly in 32-bit integers
//! (per-lane partial sums, then one exact horizontal add) and scales the block in the
//! scalar twin's float steps: they give the scalar bits, on every path (tested).
//!
//! Every function here is `unsafe` only because it is compiled for CPU features the
//! caller must have checked; slices are indexed with bounds checks.
#![allow(unsafe_code)]

use super::avx2::{h2f, load32u};
use super::quant::*;
use std::arch::x86_64::*;

/// `set` (a byte value) in every byte of `v` whose bit `mask` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_as(v: __m256i, mask: u8, set: i8) -> __m256i {
    let m = _mm256_set1_epi8(mask as i8);
    let on = _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
    _mm256_and_si256(on, _mm256_set1_epi8(set))
}

/// The exact sum of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// 32 unsigned weights times 32 activations, summed in pairs of sub-blocks of 16 with
/// scale `lo` on the first 16 and `hi` on the last: 8 exact i32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_16s(q: __m256i, a: &[i8], lo: i16, hi: i16) -> __m256i {
    // SAFETY: same CPU features as this function; `load32u` checks the length.
    let av = unsafe { load32u(bytemuck::cast_slice(a)) };
    let sc = _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), sc)
}

/// The four 2-bit fields of 32 bytes (bits 0-1, 2-3, 4-5, 6-7), each as bytes 0..4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn crumbs(q: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_srli_epi16(q, 2), m),
        _mm256_and_si256(_mm256_srli_epi16(q, 4), m),
        _mm256_and_si256(_mm256_srli_epi16(q, 6), m),
    ]
}

/// The twin of `scalar::dot_q2k`, bit for bit (exact integer sums, same float steps).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q2k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            // SAFETY: same CPU features as this function; the slice is 32 bytes.
            let q = unsafe { crumbs(load32u(&b.qs[32 * n..])) };
            for (k, &qk) in q.iter().enumerate() {
                let (s, off) = (8 * n + 2 * k, 128 * n + 32 * k);
                let (lo, hi) = ((b.scales[s] & 0xF) as i16, (b.scales[s + 1] & 0xF) as i16);
                // SAFETY: as above.
                let p = unsafe { scaled_16s(qk, &x.qs[off..off + 32], lo, hi) };
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let summ: i32 = (0..16)
            .map(|s| (b.scales[s] >> 4) as i32 * x.bsums[s] as i32)
            .sum();
        // SAFETY: same CPU features as this function.
        let (sumi, d, dmin) = unsafe { (hsum_i32(sumi), h2f(b.d), h2f(b.dmin)) };
        acc += x.d * (d * sumi as f32 - dmin * summ as f32);
    }
    acc
}

/// The twin of `scalar::dot_q3k`, bit for bit: weights run as q + 4 (unsigned), and
/// 4 · Σ scale · (sub-block sum of activations) comes off the exact integer total.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q3k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let sc = q3k_scales(&b.scales);
        // SAFETY: same CPU features as this function; the slice is 32 bytes.
        let hm = unsafe { load32u(&b.hmask) };
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            // SAFETY: as above.
            let q = unsafe { crumbs(load32u(&b.qs[32 * n..])) };
            for (k, &qk) in q.iter().enumerate() {
                let (s, off) = (8 * n + 2 * k, 128 * n + 32 * k);
                // SAFETY: same CPU features as this function.
                let v = unsafe { _mm256_or_si256(qk, bit_as(hm, 1 << (4 * n + k), 4)) };
                // SAFETY: as above.
                let p =
                    unsafe { scaled_16s(v, &x.qs[off..off + 32], sc[s] as i16, sc[s + 1] as i16) };
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let offset: i32 = (0..16).map(|s| sc[s] as i32 * x.bsums[s] as i32).sum();
        // SAFETY: same CPU features as this function.
        let (sumi, d) = unsafe { (hsum_i32(sumi) - 4 * offset, h2f(b.d)) };
        acc += x.d * d * sumi as f32;
    }
    acc
}

/// The twin of `scalar::dot_q5k`, bit for bit (exact integer sums, same float steps).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        // SAFETY: same CPU features as this function; the slice is 32 bytes.
        let qh = unsafe { load32u(&b.qh) };
        let mut sumi = _mm256_setzero_si256();
        let mut summ = 0i32;
        for c in 0..4 {
            let (sc1, m1) = q4k_scale_min(2 * c, &b.scales);
            let (sc2, m2) = q4k_scale_min(2 * c + 1, &b.scales);
            // SAFETY: as above.
            let (q, h1, h2) = unsafe {
                (
                    load32u(&b.qs[c * 32..]),
                    bit_as(qh, 1 << (2 * c), 0x10),
                    bit_as(qh, 2 << (2 * c), 0x10),
                )
            };
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h1);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h2);
            let (s1, s2) = (sc1 as i16, sc2 as i16);
            // SAFETY: same CPU features as this function; slices are 32 long.
            let (p1, p2) = unsafe {
                (
                    scaled_16s(lo, &x.qs[c * 64..c * 64 + 32], s1, s1),
                    scaled_16s(hi, &x.qs[c * 64 + 32..c * 64 + 64], s2, s2),
                )
            };
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
            let bs = &x.bsums[c * 4..c * 4 + 4];
            summ += m1 as i32 * (bs[0] as i32 + bs[1] as i32)
                + m2 as i32 * (bs[2] as i32 + bs[3] as i32);
        }
        // SAFETY: same CPU features as this function.
        let (sumi, d, dmin) = unsafe { (hsum_i32(sumi), h2f(b.d), h2f(b.dmin)) };
        acc += x.d * (d * sumi as f32 - dmin * summ as f32);
    }
    acc
}
