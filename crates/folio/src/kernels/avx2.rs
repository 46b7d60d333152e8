//! AVX2 + FMA + F16C kernels, chosen at run time when the CPU has them (see `mod.rs`).
//!
//! Each public function is the twin of one in `scalar.rs` and is compared with it on
//! random data in the tests. Integer parts are exact; float accumulation runs in 8
//! lanes, so results differ from the scalar twin only by summation order.
//!
//! Every function here is `unsafe` only because it is compiled for CPU features the
//! caller must have checked; slices are indexed with bounds checks.
#![allow(unsafe_code)]

use super::avxvnni::sums;
use super::quant::*;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The horizontal sum ggml's float dot products use: halves added, then two hadds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_hadd(v: __m256) -> f32 {
    let t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// 16 bytes of packed nibbles -> 32 bytes: low nibbles then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; loadu has no alignment requirement.
    let x = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32(p: &[i8; 32]) -> __m256i {
    // SAFETY: `p` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load32u(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: the assert above guarantees 32 readable bytes.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// How far ahead (in blocks) the row kernels (GGUF's row-major formats) prefetch
/// weights, in each of their rows.
const PREFETCH_BLOCKS: usize = 8;

/// How far ahead (in blocks) the packed four-row tile kernels prefetch their one stream
/// of weights, on this path and the AVX-512 one: 64 blocks is 5 KB of Q4_1 tiles, 8.5 KB
/// of Q8_0 ones. Decode is bound by how many weight reads are in flight, and the
/// hardware prefetcher alone, or a prefetch a few blocks ahead, keeps too few (4
/// blocks against 64: docs/BENCHMARKS.md).
pub(super) const TILE_PREFETCH_BLOCKS: usize = 64;

/// The blocks a packed 4-row tile kernel runs over: the activations' common length,
/// checked against the tile's.
pub(super) fn tile_blocks<T>(w: &[T], a: &[&[BlockQ8]]) -> usize {
    let nb = a[0].len();
    assert!(w.len() >= nb);
    assert!(a.iter().all(|x| x.len() == nb));
    nb
}

/// Starts loading the `lines` cache lines from the start of `w[at]` (an address past
/// the end is fine: prefetching never faults, whatever the address).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch<T>(w: &[T], at: usize, lines: usize) {
    let p = w.as_ptr().wrapping_add(at) as *const i8;
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l));
    }
}

/// Generates an R×C register-tiled dot-product kernel for a 32-element weight format
/// against 8-bit activations: `out[r][c] = dot(w[r], a[c])`. Each (r, c) pair runs
/// the same instruction sequence whatever R and C are, so a result never depends on
/// how rows were tiled (the batch-invariance that determinism rests on). `D` is the
/// 8-bit dot step (`avxvnni::MADD` or `VEX`: the same sums, so the same bits).
macro_rules! tile_kernel {
    ($name:ident, $blk:ty, signed = $signed:expr, |$b:ident| ($q:expr, $d:expr, $m:expr)) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name<const D: u8, const R: usize, const C: usize>(
            w: [&[$blk]; R],
            a: [&[BlockQ8]; C],
            out: &mut [[f32; C]; R],
        ) {
            let nb = a[0].len();
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut macc = [[0f32; C]; R];
            for i in 0..nb {
                for row in &w {
                    // Prefetch a few blocks ahead: decode streams each weight row once,
                    // and the hardware prefetcher alone leaves the loads waiting.
                    let ahead = row.as_ptr().wrapping_add(i + PREFETCH_BLOCKS) as *const i8;
                    // Prefetching never faults, whatever the address.
                    _mm_prefetch::<_MM_HINT_T0>(ahead);
                }
                let mut wq = [_mm256_setzero_si256(); R];
                let mut wd = [0f32; R];
                let mut wm = [0f32; R];
                for r in 0..R {
                    let $b = &w[r][i];
                    // SAFETY: same CPU features as this function.
                    unsafe {
                        wq[r] = $q;
                        wd[r] = $d;
                        wm[r] = $m;
                    }
                }
                for c in 0..C {
                    let x = &a[c][i];
                    // SAFETY: same CPU features as this function.
                    let av = unsafe { load32(&x.qs) };
                    for r in 0..R {
                        let (u, s) = if $signed {
                            (_mm256_sign_epi8(wq[r], wq[r]), _mm256_sign_epi8(av, wq[r]))
                        } else {
                            (wq[r], av)
                        };
                        // SAFETY: the caller guarantees step D's instruction.
                        let p = unsafe { sums::<D>(u, s) };
                        acc[r][c] = _mm256_fmadd_ps(
                            _mm256_set1_ps(wd[r] * x.d),
                            _mm256_cvtepi32_ps(p),
                            acc[r][c],
                        );
                        // Formats without a min term (the signed ones) skip it: an
                        // infinite `s` (f16 overflow of a huge block) must not make 0·∞.
                        if !$signed {
                            macc[r][c] = wm[r].mul_add(x.s, macc[r][c]);
                        }
                    }
                }
            }
            for r in 0..R {
                for c in 0..C {
                    // SAFETY: same CPU features as this function.
                    out[r][c] = unsafe { hsum(acc[r][c]) } + macc[r][c];
                }
            }
        }
    };
}

tile_kernel!(tile_q4_0, BlockQ4_0, signed = true, |b| (
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8)),
    h2f(b.d),
    0.0
));
tile_kernel!(tile_q4_1, BlockQ4_1, signed = false, |b| (
    nibbles(&b.qs),
    h2f(b.d),
    h2f(b.m)
));
tile_kernel!(tile_q8_0, BlockQ8_0, signed = true, |b| (
    load32(&b.qs),
    h2f(b.d),
    0.0
));

/// Bit j of the little-endian `qh` as 0x10 in byte j (the fifth bit of Q5_0/Q5_1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(qh: &[u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(*qh));
    // Byte j takes byte j / 8 of `qh` (both lanes hold all four), then tests bit j % 8.
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let on = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit), bit);
    _mm256_and_si256(on, _mm256_set1_epi8(0x10))
}

tile_kernel!(tile_q5_0, BlockQ5_0, signed = true, |b| (
    _mm256_sub_epi8(
        _mm256_or_si256(nibbles(&b.qs), fifth_bits(&b.qh)),
        _mm256_set1_epi8(16)
    ),
    h2f(b.d),
    0.0
));
tile_kernel!(tile_q5_1, BlockQ5_1, signed = false, |b| (
    _mm256_or_si256(nibbles(&b.qs), fifth_bits(&b.qh)),
    h2f(b.d),
    h2f(b.m)
));
tile_kernel!(tile_iq4nl, BlockIq4Nl, signed = true, |b| (
    _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i)),
        nibbles(&b.qs)
    ),
    h2f(b.d),
    0.0
));

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut accm = 0f32;
    for (b, x) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        let mut summ = 0i32;
        for c in 0..4 {
            let (sc1, m1) = q4k_scale_min(2 * c, &b.scales);
            let (sc2, m2) = q4k_scale_min(2 * c + 1, &b.scales);
            // SAFETY: same CPU features as this function; slices are 32 bytes long.
            let (q, a1, a2) = unsafe {
                (
                    load32u(&b.qs[c * 32..]),
                    load32u(bytemuck::cast_slice(&x.qs[c * 64..c * 64 + 32])),
                    load32u(bytemuck::cast_slice(&x.qs[c * 64 + 32..c * 64 + 64])),
                )
            };
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a1), _mm256_set1_epi16(sc1 as i16));
            let p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a2), _mm256_set1_epi16(sc2 as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
            let bs = &x.bsums[c * 4..c * 4 + 4];
            summ += m1 as i32 * (bs[0] as i32 + bs[1] as i32)
                + m2 as i32 * (bs[2] as i32 + bs[3] as i32);
        }
        // SAFETY: same CPU features as this function.
        let (d, dmin) = unsafe { (h2f(b.d), h2f(b.dmin)) };
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(sumi), acc);
        accm += dmin * x.d * summ as f32;
    }
    // SAFETY: same CPU features as this function.
    unsafe { hsum(acc) - accm }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut accm = 0f32;
    for (b, x) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            // SAFETY: same CPU features as this function; slices are 32 bytes long.
            let (ql0, ql1, qh) = unsafe {
                (
                    load32u(&b.ql[n * 64..]),
                    load32u(&b.ql[n * 64 + 32..]),
                    load32u(&b.qh[n * 32..]),
                )
            };
            let hbits = |shift: i32| -> __m256i {
                let h = match shift {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), hbits(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), hbits(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hbits(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hbits(6)),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let off = n * 128 + k * 32;
                let s = n * 8 + k * 2;
                // SAFETY: same CPU features as this function; the slice is 32 bytes.
                let av = unsafe { load32u(bytemuck::cast_slice(&x.qs[off..off + 32])) };
                let scv = _mm256_set_m128i(
                    _mm_set1_epi16(b.scales[s + 1] as i16),
                    _mm_set1_epi16(b.scales[s] as i16),
                );
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qk, av), scv);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let summ: i32 = (0..16)
            .map(|s| b.scales[s] as i32 * x.bsums[s] as i32)
            .sum();
        // SAFETY: same CPU features as this function.
        let d = unsafe { h2f(b.d) } * x.d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm += d * 32.0 * summ as f32;
    }
    // SAFETY: same CPU features as this function.
    unsafe { hsum(acc) - accm }
}

/// Generates an f32-activation dot product for a 16/32-bit float weight format.
macro_rules! float_dot {
    ($name:ident, $wt:ty, |$p:ident| $load8:expr, |$v:ident| $scalar:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name(w: &[$wt], x: &[f32]) -> f32 {
            let n = w.len().min(x.len());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let $p = &w[i + 8 * k..i + 8 * k + 8];
                    // SAFETY: both slices hold 8 elements at this offset.
                    unsafe {
                        let wv = $load8;
                        let xv = _mm256_loadu_ps(x[i + 8 * k..i + 8 * k + 8].as_ptr());
                        *a = _mm256_fmadd_ps(wv, xv, *a);
                    }
                }
                i += 32;
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
            // SAFETY: same CPU features as this function.
            let mut sum = unsafe { hsum_hadd(s) };
            for j in i..n {
                let $v = w[j];
                sum += $scalar * x[j];
            }
            sum
        }
    };
}

float_dot!(dot_f32, f32, |p| _mm256_loadu_ps(p.as_ptr()), |v| v);
float_dot!(
    dot_f16,
    u16,
    |p| _mm256_cvtph_ps(_mm_loadu_si128(p.as_ptr() as *const __m128i)),
    |v| f16_to_f32(v)
);
float_dot!(
    dot_bf16,
    u16,
    |p| _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(p.as_ptr() as *const __m128i)),
        16
    )),
    |v| bf16_to_f32(v)
);

/// exp(x) on 8 lanes: the twin of `scalar::exp_poly`, same steps, same roundings.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_poly(x: __m256) -> __m256 {
    use super::scalar::exp_consts::*;
    let bits = |b: u32| _mm256_castsi256_ps(_mm256_set1_epi32(b as i32));
    let shift = _mm256_set1_ps(SHIFT);
    let z = _mm256_fmadd_ps(x, bits(INV_LN2), shift);
    let n = _mm256_sub_ps(z, shift);
    let b = _mm256_fnmadd_ps(n, bits(LN2_LO), _mm256_fnmadd_ps(n, bits(LN2_HI), x));
    let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0), _CMP_GT_OQ);
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(bits(C[4]), b, bits(C[3])),
            u,
            _mm256_fmadd_ps(bits(C[2]), b, bits(C[1])),
        ),
        u,
        _mm256_mul_ps(bits(C[0]), b),
    );
    if _mm256_movemask_ps(big) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0), _CMP_GT_OQ);
    let scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    let normal = _mm256_fmadd_ps(k, j, k);
    let mid = _mm256_blendv_ps(normal, scaled, big);
    _mm256_blendv_ps(mid, _mm256_mul_ps(s1, s1), huge)
}

/// `scalar::rope_rotate` compiled with FMA: the same operations, so the same bits.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn rope_rotate(
    adjacent: bool,
    half: usize,
    head_dim: usize,
    table: &[(f32, f32)],
    row: &mut [f32],
) {
    super::scalar::rope_rotate(adjacent, half, head_dim, table, row)
}

/// Appends `x` rounded to f16 precision (to nearest, ties to even) to `out`, 8 at a
/// time: the twin of `scalar::round_f16_into`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn round_f16_into(x: &[f32], out: &mut Vec<f32>) {
    let start = out.len();
    out.resize(start + x.len(), 0.0);
    let dst = &mut out[start..];
    let mut i = 0;
    while i + 8 <= x.len() {
        // SAFETY: both slices hold 8 elements at offset i.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x[i..].as_ptr()));
            _mm256_storeu_ps(dst[i..i + 8].as_mut_ptr(), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for (d, &v) in dst[i..].iter_mut().zip(&x[i..]) {
        *d = f16_to_f32(f32_to_f16(v));
    }
}

/// `out[i]` = `x[i]` as f16 bits, 8 lanes at a time (F16C's round to nearest even, as
/// the scalar twin); the tail goes through the scalar twin.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn to_f16(x: &[f32], out: &mut [u16]) {
    let n = x.len().min(out.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: both slices hold 8 elements at offset i.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x[i..].as_ptr()));
            _mm_storeu_si128(out[i..i + 8].as_mut_ptr() as *mut __m128i, h);
        }
        i += 8;
    }
    super::scalar::to_f16(&x[i..n], &mut out[i..n]);
}

/// gate = silu(gate) · up, 8 lanes at a time; the tail goes through the scalar twin.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: both slices hold 8 elements at offset i.
        unsafe {
            let gp = gate[i..i + 8].as_mut_ptr();
            let x = _mm256_loadu_ps(gp);
            let e = exp_poly(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(
                gp,
                _mm256_mul_ps(silu, _mm256_loadu_ps(up[i..i + 8].as_ptr())),
            );
        }
        i += 8;
    }
    super::scalar::swiglu(&mut gate[i..n], &up[i..n]);
}

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks: the twin of
/// `scalar::quantize_q8k`, bit for bit (the same product, rounded half to even by
/// `vroundps` where the scalar code calls libm's `rintf`; blocks with a NaN or all
/// zeros go to the scalar code).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    let sign = _mm256_set1_ps(-0.0);
    let load = |s: &[f32]| {
        // SAFETY: callers pass 8 floats.
        unsafe { _mm256_loadu_ps(s[..8].as_ptr()) }
    };
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut m, mut nan) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for c in xs.chunks_exact(8) {
            let v = load(c);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if _mm256_movemask_ps(nan) != 0 || amax == 0.0 {
            super::scalar::quantize_q8k(xs, std::slice::from_mut(blk));
            continue;
        }
        // The first value of largest magnitude, as the scalar scan keeps it.
        let max = xs.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        // Puts 32-bit lanes back in order after the two in-lane packs.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (q, c) in blk.qs.chunks_exact_mut(32).zip(xs.chunks_exact(32)) {
            let r: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(load(&c[8 * k..]), is)))
            });
            // Saturating packs, as `min(127)` (|iscale·v| ≤ 127 already).
            let p = _mm256_packs_epi16(
                _mm256_packs_epi32(r[0], r[1]),
                _mm256_packs_epi32(r[2], r[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, order);
            // SAFETY: `q` is 32 bytes.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, p) };
        }
        for (j, s) in blk.bsums.iter_mut().enumerate() {
            *s = blk.qs[j * 16..j * 16 + 16].iter().map(|&q| q as i16).sum();
        }
        blk.d = 1.0 / iscale;
    }
}

/// Quantizes `x` into 8-bit blocks: the twin of `scalar::quantize_q8`, bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        // SAFETY: `xs` holds 32 floats.
        let v: [__m256; 4] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(xs[8 * k..].as_ptr()) });
        let nan = _mm256_or_ps(
            _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[1], v[1]),
            ),
            _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[2]),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(v[3], v[3]),
            ),
        );
        if _mm256_movemask_ps(nan) != 0 {
            *blk = super::scalar::NAN_Q8;
            continue;
        }
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[k], id)))
        });
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let t = _mm_add_epi32(
            _mm256_castsi256_si128(total),
            _mm256_extracti128_si256(total, 1),
        );
        let t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0b01_00_11_10));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0b10_11_00_01)));
        // Pack 32 i32 to i8 (saturation cannot trigger: |q| <= 127), then undo the
        // lane interleaving of the packs.
        let p16a = _mm256_packs_epi32(q[0], q[1]);
        let p16b = _mm256_packs_epi32(q[2], q[3]);
        let p8 = _mm256_packs_epi16(p16a, p16b);
        let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `blk.qs` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(blk.qs.as_mut_ptr() as *mut __m256i, p8) };
        blk.d = f16_to_f32(f32_to_f16(d));
        blk.s = f16_to_f32(f32_to_f16(d * sum as f32));
    }
}

/// Rounds 8 floats to f16 precision (what storing them as f16 and loading them back does).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_f16(v: __m256) -> __m256 {
    let out: __m256;
    // Written as assembly so that the compiler cannot fold the conversion into a store
    // (`vcvtps2ph` to memory is many times slower than to a register on AMD Zen 4) when
    // it runs short of registers.
    // SAFETY: two register-only instructions of F16C, which this function requires;
    // no memory, stack or flags are touched.
    unsafe {
        std::arch::asm!(
            "vcvtps2ph {h}, {v}, 0",
            "vcvtph2ps {o}, {h}",
            v = in(ymm_reg) v,
            h = out(xmm_reg) _,
            o = lateout(ymm_reg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// `scalar::expf_table` on 8 floats (two halves of four doubles), the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn expf_table(x: __m256) -> __m256 {
    use super::scalar::expf_consts::*;
    let f = |b: u64| _mm256_set1_pd(f64::from_bits(b));
    let (inv, shift) = (f(INV_LN2_N), f(SHIFT));
    let half = |x: __m128| -> __m128 {
        let xd = _mm256_cvtps_pd(x);
        let kr = _mm256_fmadd_pd(inv, xd, shift);
        let ki = _mm256_castpd_si256(kr);
        let r = _mm256_fmsub_pd(inv, xd, _mm256_sub_pd(kr, shift));
        let z = _mm256_fmadd_pd(r, f(C[0]), f(C[1]));
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        // SAFETY: every index is masked to 0..32, TAB's length.
        let t = unsafe { _mm256_i64gather_epi64::<8>(TAB.as_ptr() as *const i64, idx) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let y = _mm256_fmadd_pd(
            z,
            _mm256_mul_pd(r, r),
            _mm256_fmadd_pd(r, f(C[2]), _mm256_set1_pd(1.0)),
        );
        _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
    };
    let e = _mm256_set_m128(
        half(_mm256_extractf128_ps(x, 1)),
        half(_mm256_castps256_ps128(x)),
    );
    // Out of range: 0 below (−∞ included), +∞ above; NaN stays NaN from the arithmetic.
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(f32::from_bits(UNDERFLOW)));
    let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(f32::from_bits(OVERFLOW)));
    _mm256_blendv_ps(
        _mm256_andnot_ps(under, e),
        _mm256_set1_ps(f32::INFINITY),
        over,
    )
}

/// `scalar::expf_table` on 8 floats in memory: the test hook for the SIMD path.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn expf_table_8(x: &[f32; 8], out: &mut [f32; 8]) {
    // SAFETY: both are 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), expf_table(_mm256_loadu_ps(x.as_ptr()))) };
}

/// The horizontal sums of 8 vectors at once, lane k = `hsum_hadd(v[k])` bit for bit:
/// each vector's halves added (low + high), then adjacent pairs, then the two pair sums,
/// the additions ggml's one-vector reduction makes, in a transposed arrangement.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum8(v: &[__m256; 8]) -> __m256 {
    // [v_a's low half + high half | v_b's], i.e. the 4-lane sums of two vectors.
    let halves = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps(a, b, 0x20),
            _mm256_permute2f128_ps(a, b, 0x31),
        )
    };
    let t01 = halves(v[0], v[1]);
    let t23 = halves(v[2], v[3]);
    let t45 = halves(v[4], v[5]);
    let t67 = halves(v[6], v[7]);
    // Lanes (low 128 | high 128): [0,2,4,6 | 1,3,5,7] after two rounds of pair sums.
    let s = _mm256_hadd_ps(_mm256_hadd_ps(t01, t23), _mm256_hadd_ps(t45, t67));
    _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Prefetches `n` rows (`width` bytes each, `stride_bytes` apart) from the start of
/// `rows`, with `_mm_prefetch`'s `HINT` (`_MM_HINT_T0`: into L1; `_MM_HINT_T1`: into L2):
/// the attention kernels start loading a page's rows before they read them (pages are
/// scattered in memory, so the hardware prefetcher would only find each page after a
/// few misses). For 8-bit rows (one byte per element: `stride_bytes` is the stride in
/// elements) the rows' scales too.
#[inline(always)]
pub(super) fn prefetch_rows<const HINT: i32>(
    rows: &super::KvRows,
    n: usize,
    stride_bytes: usize,
    width: usize,
) {
    let base = rows.as_ptr() as *const i8;
    for p in 0..n {
        let row = base.wrapping_add(p * stride_bytes);
        for line in (0..width).step_by(64) {
            // SAFETY: prefetching never faults, whatever the address.
            unsafe { _mm_prefetch::<HINT>(row.wrapping_add(line)) };
        }
    }
    if let (super::KvRows::Q8 { d, hd, .. }, true) = (rows, n > 0) {
        let end = 2 * ((n - 1) * stride_bytes / hd + 1);
        let base = d.as_ptr() as *const i8;
        for line in (0..end).step_by(64) {
            // SAFETY: prefetching never faults, whatever the address.
            unsafe { _mm_prefetch::<HINT>(base.wrapping_add(line)) };
        }
    }
}

/// Stored-row kinds, the attention kernels' `KIND` parameter: f16, f32, or 8-bit with
/// a scale per row ([`super::KvRows::Q8`]).
pub(super) const KV_F16: u8 = 0;
pub(super) const KV_F32: u8 = 1;
pub(super) const KV_Q8: u8 = 2;

/// Bytes per stored element of rows of `KIND`.
pub(super) const fn kind_size(kind: u8) -> usize {
    match kind {
        KV_F32 => 4,
        KV_F16 => 2,
        _ => 1,
    }
}

/// The kind of `rows`.
pub(super) fn kind_of(rows: &super::KvRows) -> u8 {
    match rows {
        super::KvRows::F16(_) => KV_F16,
        super::KvRows::F32(_) => KV_F32,
        super::KvRows::Q8 { .. } => KV_Q8,
    }
}

/// A run's rows as the kernel of `KIND` reads them: the elements, and for 8-bit rows
/// their scales (else null). Panics on rows of another kind, or 8-bit rows whose head
/// size is not `hd`, whose stride is not whole head rows, or whose scales stop short
/// of `n` rows `stride` apart.
#[inline(always)]
pub(super) fn kind_rows<const KIND: u8>(
    r: &super::KvRows,
    n: usize,
    stride: usize,
    hd: usize,
) -> (*const u8, *const u16) {
    match (r, KIND) {
        (super::KvRows::F16(x), KV_F16) => (x.as_ptr() as *const u8, std::ptr::null()),
        (super::KvRows::F32(x), KV_F32) => (x.as_ptr() as *const u8, std::ptr::null()),
        (super::KvRows::Q8 { q, d, hd: h }, KV_Q8) => {
            assert!(*h == hd && stride.is_multiple_of(hd));
            assert!(n == 0 || d.len() > (n - 1) * stride / hd);
            (q.as_ptr() as *const u8, d.as_ptr())
        }
        _ => panic!("K/V rows of another dtype than the kernel's"),
    }
}

/// The scale of row `p` of 8-bit rows (`d`: their scales, `per_row` = stride / head
/// size apart) as f32, in every lane; 1 for other kinds.
///
/// # Safety
/// For `KV_Q8`, `d` holds at least `p * per_row + 1` scales; the CPU runs F16C.
#[inline(always)]
pub(super) unsafe fn row_scale<const KIND: u8>(d: *const u16, p: usize, per_row: usize) -> f32 {
    if KIND == KV_Q8 {
        // SAFETY: the caller's bound.
        unsafe { h2f(*d.add(p * per_row)) }
    } else {
        1.0
    }
}

/// The twin of `scalar::attend_runs` for head size `8 * N` (`N` a multiple of 4: head
/// sizes that are multiples of 32), for `G` queries that share their
/// keys and values (the query heads of one KV head): each key's K and V rows are loaded
/// and converted once for all of them, and their accumulators' dependency chains (an
/// f16 rounding after every key) interleave instead of waiting on one another. Each
/// query gets exactly the operations the single-query scalar twin does, so the same
/// bits. `KIND`: the K/V rows' type (`KV_F16`, `KV_F32`, `KV_Q8`: 8-bit values read as
/// `q · d`, the same exact f32 the scalar twin reads). `ROUND`: the accumulators are rounded
/// to f16 after every step, as llama.cpp's flash attention keeps them (only with f16
/// K/V; else they stay f32). `q` and `acc` hold the G queries' values back to back; `state[g]` is query g's (running max, running sum).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend_runs_ymm<const KIND: u8, const ROUND: bool, const N: usize, const G: usize>(
    q: &[f32],
    runs: &[super::KvRun],
    stride: usize,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let hd = 8 * N;
    assert!(N.is_multiple_of(4) && q.len() == hd * G && acc.len() == hd * G);
    assert!(state.len() == G && stride >= hd);
    let load = |x: &[f32], g: usize, i: usize| {
        let x = &x[hd * g + 8 * i..][..8];
        // SAFETY: `x` is 8 floats.
        unsafe { _mm256_loadu_ps(x.as_ptr()) }
    };
    let qv: [[__m256; N]; G] = std::array::from_fn(|g| std::array::from_fn(|i| load(q, g, i)));
    let mut av: [[__m256; N]; G] =
        std::array::from_fn(|g| std::array::from_fn(|i| load(acc, g, i)));
    // Eight elements of a row from its element 8·i (f16 converted, f32 as they are,
    // 8-bit ones times the row's scale `d`: exact).
    #[inline(always)]
    unsafe fn load8<const KIND: u8>(row: *const u8, i: usize, d: __m256) -> __m256 {
        // SAFETY: the caller passes a row of at least 8·(i + 1) elements of the run's type.
        unsafe {
            match KIND {
                KV_F32 => _mm256_loadu_ps((row as *const f32).add(8 * i)),
                KV_F16 => _mm256_cvtph_ps(_mm_loadu_si128(
                    (row as *const u16).add(8 * i) as *const __m128i
                )),
                _ => {
                    let b = _mm_loadl_epi64(row.add(8 * i) as *const __m128i);
                    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d)
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn round<const ROUND: bool>(v: __m256) -> __m256 {
        if ROUND {
            // SAFETY: same CPU features as the caller.
            unsafe { round_f16(v) }
        } else {
            v
        }
    }
    let size = kind_size(KIND);
    // (max, sum) per query, held locally so the sums' chain stays in registers.
    let mut st: [(f32, f32); G] = std::array::from_fn(|g| state[g]);
    for (ri, run) in runs.iter().enumerate() {
        if run.n == 0 {
            continue;
        }
        if let Some(next) = runs.get(ri + 1) {
            // Pages are scattered in memory: start loading the next run's keys now,
            // the hardware prefetcher would only find them after a few misses. (K and V
            // kept asked for 64 keys ahead, as the AVX-512 kernel does, measured no
            // faster here: this kernel's compute hides the rest.)
            prefetch_rows::<_MM_HINT_T0>(&next.k, next.n, stride * size, hd * size);
        }
        let last = (run.n - 1) * stride + hd;
        assert!(run.k.len() >= last && run.v.len() >= last);
        let ((kp, kd), (vp, vd)) = (
            kind_rows::<KIND>(&run.k, run.n, stride, hd),
            kind_rows::<KIND>(&run.v, run.n, stride, hd),
        );
        let per_row = stride / hd;
        // Scores of up to 16 keys first (independent work the CPU overlaps), then the
        // online softmax over them in key order: the same operations per key as one
        // key at a time, so the same bits.
        let mut scores = [[0f32; 16]; G];
        for g0 in (0..run.n).step_by(16) {
            let g1 = (g0 + 16).min(run.n);
            // Each query's 8-lane partial dot products of 8 keys at a time, then their
            // horizontal sums together (`hsum8`: the same additions as ggml's one-key
            // reduction, so the same bits).
            let mut part = [[_mm256_setzero_ps(); 8]; G];
            for k8 in (g0..g1).step_by(8) {
                let k9 = (k8 + 8).min(g1);
                for (k, p) in (k8..k9).enumerate() {
                    // Row p spans p*stride .. p*stride+hd <= last <= len (asserted).
                    let kr = kp.wrapping_add(p * stride * size);
                    // SAFETY: kr is a whole row of this run and p one of its rows, whose
                    // scale `kind_rows` checked is there (see above).
                    let kv: [__m256; N] = unsafe {
                        let d = _mm256_set1_ps(row_scale::<KIND>(kd, p, per_row));
                        std::array::from_fn(|i| load8::<KIND>(kr, i, d))
                    };
                    for (qg, pg) in qv.iter().zip(part.iter_mut()) {
                        let mut d = [_mm256_setzero_ps(); 4];
                        for i in 0..N {
                            d[i % 4] = _mm256_fmadd_ps(kv[i], qg[i], d[i % 4]);
                        }
                        // ggml's reduction order of the four accumulators.
                        pg[k] = _mm256_add_ps(_mm256_add_ps(d[0], d[2]), _mm256_add_ps(d[1], d[3]));
                    }
                }
                for (pg, sg) in part.iter().zip(scores.iter_mut()) {
                    // SAFETY: same CPU features as this function.
                    let sums = _mm256_mul_ps(unsafe { hsum8(pg) }, _mm256_set1_ps(scale));
                    let mut out = [0f32; 8];
                    // SAFETY: `out` is 8 floats.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sums) };
                    sg[k8 - g0..k9 - g0].copy_from_slice(&out[..k9 - k8]);
                }
            }
            // The running maximum before each key decides which exponential it needs
            // (the rescale of the old terms when it raises the maximum, its own weight
            // otherwise); knowing them all, the exponentials run as vectors.
            let mut e = [[0f32; 16]; G];
            let mut raises = [0u32; G];
            for g in 0..G {
                let mut mx = st[g].0;
                let mut args = [0f32; 16];
                for (k, &s) in scores[g][..g1 - g0].iter().enumerate() {
                    if s > mx {
                        args[k] = mx - s;
                        raises[g] |= 1 << k;
                        mx = s;
                    } else {
                        args[k] = s - mx;
                    }
                }
                for (a, o) in args.chunks_exact(8).zip(e[g].chunks_exact_mut(8)) {
                    // SAFETY: 8 floats each; same CPU features as this function.
                    unsafe {
                        _mm256_storeu_ps(o.as_mut_ptr(), expf_table(_mm256_loadu_ps(a.as_ptr())))
                    };
                }
            }
            for (k, p) in (g0..g1).enumerate() {
                let vr = vp.wrapping_add(p * stride * size);
                // SAFETY: as for K above.
                let dv = _mm256_set1_ps(unsafe { row_scale::<KIND>(vd, p, per_row) });
                let mut vsv = [_mm256_setzero_ps(); G];
                for g in 0..G {
                    let (m, sum) = &mut st[g];
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if raises[g] & (1 << k) != 0 {
                        ms = e[g][k];
                        *m = scores[g][k];
                        let msv = _mm256_set1_ps(ms);
                        for a in av[g].iter_mut() {
                            // SAFETY: same CPU features as this function.
                            *a = unsafe { round::<ROUND>(_mm256_mul_ps(*a, msv)) };
                        }
                    } else {
                        vs = e[g][k];
                    }
                    vsv[g] = _mm256_set1_ps(vs);
                    *sum = sum.mul_add(ms, vs);
                }
                // One V slice at a time, converted once for all the queries.
                #[allow(clippy::needless_range_loop)]
                for i in 0..N {
                    // SAFETY: vr is a whole row of this run (see above).
                    let v = unsafe { load8::<KIND>(vr, i, dv) };
                    for (a, vs) in av.iter_mut().zip(&vsv) {
                        // SAFETY: same CPU features as this function.
                        a[i] = unsafe { round::<ROUND>(_mm256_fmadd_ps(v, *vs, a[i])) };
                    }
                }
            }
        }
    }
    for (s, t) in state.iter_mut().zip(st) {
        *s = t;
    }
    for (g, ag) in av.iter().enumerate() {
        for (i, a) in ag.iter().enumerate() {
            // SAFETY: acc holds hd·G floats.
            unsafe { _mm256_storeu_ps(acc[hd * g + 8 * i..].as_mut_ptr(), *a) };
        }
    }
}

/// Four packed Q4_1 rows × C activation rows: the same arithmetic per (row, column) as
/// `tile_q4_1` (so the same bits), with the scales of four rows converted at once.
///
/// One 32-byte load holds two rows' nibbles (a tile stores its rows back to back), so
/// the low nibbles of both rows are multiplied by the activation's first 16 values
/// (broadcast to both halves) and the high nibbles by its last 16. Lane k of the pair's
/// "low" accumulator is lane k (k < 4) of row 2p's usual accumulator, or lane k - 4 of
/// row 2p+1's; the "high" one holds lanes 4..7 the same way. Every lane sees the same
/// fused multiply-adds in the same order as `tile_q4_1`; the halves are put back
/// together before the horizontal sum. `D` is the 8-bit dot step, as there.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4_1x4<const D: u8, const C: usize>(
    w: &[BlockQ4_1x4],
    a: [&[BlockQ8]; C],
    out: &mut [[f32; C]; 4],
) {
    let nb = tile_blocks(w, &a);
    let low4 = _mm256_set1_epi8(0x0F);
    // Scale lanes of row pair p: d_{2p} in lanes 0..3, d_{2p+1} in lanes 4..7.
    let pair = [
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
    ];
    // acc[p][h][c]: row pair p, low (h = 0) or high (h = 1) nibbles, column c.
    let mut acc = [[[_mm256_setzero_ps(); C]; 2]; 2];
    let mut macc = [_mm256_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS, 2);
        let b = &w[i];
        // SAFETY: `dm` is 8 halves (16 bytes).
        let dm = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(b.dm.as_ptr() as *const __m128i)) };
        let mut dv = [_mm256_setzero_ps(); C];
        for c in 0..C {
            let x = &a[c][i];
            // Lanes 0..3: d_r · d_x, exactly the scalar products of `tile_q4_1`.
            dv[c] = _mm256_mul_ps(dm, _mm256_set1_ps(x.d));
            // Lanes 4..7: fma(m_r, s_x, acc), the min terms.
            macc[c] = _mm256_fmadd_ps(dm, _mm256_set1_ps(x.s), macc[c]);
        }
        for (p, lanes) in pair.iter().enumerate() {
            // SAFETY: qs[2p] and qs[2p + 1] are 32 contiguous bytes (repr(C) arrays).
            let raw = unsafe { _mm256_loadu_si256(b.qs[2 * p].as_ptr() as *const __m256i) };
            let wl = _mm256_and_si256(raw, low4);
            let wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            for c in 0..C {
                let q = a[c][i].qs.as_ptr() as *const __m128i;
                // SAFETY: `qs` is 32 readable bytes: two 16-byte loads.
                let (al, ah) = unsafe {
                    (
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(q)),
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(q.add(1))),
                    )
                };
                let sc = _mm256_permutevar8x32_ps(dv[c], *lanes);
                // SAFETY: the caller guarantees step D's instruction.
                let (pl, ph) = unsafe { (sums::<D>(wl, al), sums::<D>(wh, ah)) };
                acc[p][0][c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(pl), acc[p][0][c]);
                acc[p][1][c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(ph), acc[p][1][c]);
            }
        }
    }
    for c in 0..C {
        let mut m = [0f32; 8];
        // SAFETY: `m` is 8 floats.
        unsafe { _mm256_storeu_ps(m.as_mut_ptr(), macc[c]) };
        for p in 0..2 {
            let (l, h) = (acc[p][0][c], acc[p][1][c]);
            let rows = [
                _mm256_permute2f128_ps(l, h, 0x20),
                _mm256_permute2f128_ps(l, h, 0x31),
            ];
            for (k, v) in rows.into_iter().enumerate() {
                // SAFETY: same CPU features as this function.
                out[2 * p + k][c] = unsafe { hsum(v) } + m[4 + 2 * p + k];
            }
        }
    }
}

/// Four packed Q8_0 rows × C activation rows: the same arithmetic per (row, column) as
/// `tile_q8_0` on GGUF rows (so the same bits, llama.cpp's AVX2 ones), each row's 32
/// weights put back together from the tile's two halves. `D` is the 8-bit dot step,
/// as there.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q8_0x4<const D: u8, const C: usize>(
    w: &[BlockQ8_0x4],
    a: [&[BlockQ8]; C],
    out: &mut [[f32; C]; 4],
) {
    let nb = tile_blocks(w, &a);
    let mut acc = [[_mm256_setzero_ps(); C]; 4];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS, 3);
        let b = &w[i];
        let half = |h: usize| b.qs[h].as_ptr() as *const __m128i;
        // SAFETY: each half is 16 readable bytes.
        let wq: [__m256i; 4] = std::array::from_fn(|r| unsafe {
            _mm256_set_m128i(_mm_loadu_si128(half(4 + r)), _mm_loadu_si128(half(r)))
        });
        // SAFETY: same CPU features as this function.
        let wd: [f32; 4] = std::array::from_fn(|r| unsafe { h2f(b.d[r]) });
        for c in 0..C {
            let x = &a[c][i];
            // SAFETY: same CPU features as this function.
            let av = unsafe { load32(&x.qs) };
            for r in 0..4 {
                let u = _mm256_sign_epi8(wq[r], wq[r]);
                let s = _mm256_sign_epi8(av, wq[r]);
                // SAFETY: the caller guarantees step D's instruction.
                let p = unsafe { sums::<D>(u, s) };
                acc[r][c] = _mm256_fmadd_ps(
                    _mm256_set1_ps(wd[r] * x.d),
                    _mm256_cvtepi32_ps(p),
                    acc[r][c],
                );
            }
        }
    }
    for r in 0..4 {
        for c in 0..C {
            // `+ 0.0`: `tile_q8_0` adds its (zero) min terms, which turns -0 to +0.
            // SAFETY: same CPU features as this function.
            out[r][c] = unsafe { hsum(acc[r][c]) } + 0.0;
        }
    }
}

super::one_row_over_tiles!(
    "avx2,fma,f16c",
    tiles_q4_1x4_one_row<D>,
    tile_q4_1x4,
    BlockQ4_1x4
);
super::one_row_over_tiles!(
    "avx2,fma,f16c",
    tiles_q8_0x4_one_row<D>,
    tile_q8_0x4,
    BlockQ8_0x4
);
