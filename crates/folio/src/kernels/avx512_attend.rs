//! AVX-512 attention: the twin of `scalar::attend_runs` without f16 rounding of the
//! accumulator (the AVX-512 path's arithmetic, `Isa::f16_attention`), for any head size
//! that is a multiple of 32.
//!
//! The arithmetic is the AVX2 kernel's (`avx2::attend_runs_ymm` with `ROUND = false`),
//! lane for lane, so the bits are the same: one zmm holds two of the AVX2 kernel's
//! 8-lane pieces. The dot product's four 8-lane accumulators of ggml's order sit in two
//! zmm registers (`[d0 | d1]` takes the even 16-element pieces, `[d2 | d3]` the odd
//! ones), their sum `[d0 + d2 | d1 + d3]` folded to 8 lanes is exactly the AVX2
//! kernel's vector before its horizontal sum. The value accumulator's lanes are
//! independent, so 16 at a time are the same as 8 at a time.
//!
//! What changes is the registers: with 32 of them the queries and accumulators of a
//! group (three heads of 64 for the default model) stay in registers for the whole
//! call, where the AVX2 kernel's 16 spill to the stack on every key.
#![allow(unsafe_code)]

use super::avx2::{hsum8, kind_rows, kind_size, prefetch_rows, row_scale, KV_F16, KV_F32};
use super::KvRun;
use std::arch::x86_64::*;

/// How many runs ahead the kernel prefetches K for f32 rows: mostly a prefill tile
/// widened into L1 (`attend_block`), one run, where more would be wasted.
const PREFETCH_RUNS: usize = 1;

/// How many keys ahead of the one it reads the kernel keeps f16 K and V rows asked for,
/// into L2, where the keys come in several runs (pages, which may be scattered, so the
/// hardware prefetcher would only find each page after a few misses) and the caller
/// did not ask for them already (`ahead`, with its previous call: then the kernel asks
/// for nothing of its own). Keys, not runs: the distance stays the same across pages
/// of any size. Into L2, not L1: into L1 the prefetches stall on full miss buffers;
/// and never again for keys the caller asked for (both measured at 7.2k tokens of
/// decode: docs/BENCHMARKS.md, "Design measurements").
const PREFETCH_KEYS: usize = 512;

/// The same for one contiguous run (the dense cache), which the hardware prefetcher
/// streams: a shorter distance, into L1.
const PREFETCH_KEYS_DENSE: usize = 64;

/// The key up to which K and V rows have been asked for: `run`, and `key` within it.
struct Frontier {
    run: usize,
    key: usize,
    /// Whether the keys come in more than one run (pages): prefetch into L2.
    paged: bool,
}

impl Frontier {
    /// A frontier at the first key of `runs`, having asked for nothing yet.
    fn new(runs: &[KvRun]) -> Self {
        Frontier {
            run: 0,
            key: 0,
            paged: runs.len() > 1,
        }
    }

    /// How many keys ahead of the one read it keeps asked for.
    fn distance(&self) -> usize {
        if self.paged {
            PREFETCH_KEYS
        } else {
            PREFETCH_KEYS_DENSE
        }
    }

    /// Asks for the K and V rows of the next `n` keys past the frontier: rows of
    /// `width` bytes, `stride` elements (of `size` bytes) apart.
    #[inline(always)]
    fn advance(&mut self, runs: &[KvRun], mut n: usize, stride: usize, size: usize, width: usize) {
        while n > 0 {
            let Some(run) = runs.get(self.run) else {
                return;
            };
            let m = n.min(run.n - self.key);
            for rows in [run.k, run.v] {
                let rows = rows.skip(self.key * stride);
                if self.paged {
                    prefetch_rows::<_MM_HINT_T1>(&rows, m, stride * size, width);
                } else {
                    prefetch_rows::<_MM_HINT_T0>(&rows, m, stride * size, width);
                }
            }
            self.key += m;
            n -= m;
            if self.key == run.n {
                self.run += 1;
                self.key = 0;
            }
        }
    }
}

/// Sixteen elements of a row from its element `16 * i` (f16 converted, f32 as they
/// are, 8-bit ones times the row's scale `d`: exact).
///
/// # Safety
/// `row` points at a row of at least `16 * (i + 1)` elements of the kernel's type.
#[inline(always)]
unsafe fn load16<const KIND: u8>(row: *const u8, i: usize, d: __m512) -> __m512 {
    // SAFETY: the caller passes a whole row; same CPU features as the callers.
    unsafe {
        match KIND {
            KV_F32 => _mm512_loadu_ps((row as *const f32).add(16 * i)),
            KV_F16 => _mm512_cvtph_ps(_mm256_loadu_si256(
                (row as *const u16).add(16 * i) as *const __m256i
            )),
            _ => {
                let b = _mm_loadu_si128(row.add(16 * i) as *const __m128i);
                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), d)
            }
        }
    }
}

/// Continues the online softmax of `G` queries of head size `32 * C` that share their
/// keys (the query heads of one KV head) over `runs`: the same operations per query as
/// `scalar::attend_runs` with `round = false`, so the same bits. `KIND`: the K/V rows'
/// type (`avx2::KV_F16`, `KV_F32`, `KV_Q8`). `q` and `acc` hold the G queries' values back to back;
/// `state[g]` is query g's (running max, running sum).
///
/// # Safety
/// The CPU must run AVX-512 F and AVX2 + FMA + F16C (checked by `detect`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn attend_runs_zmm<const KIND: u8, const C: usize, const G: usize>(
    q: &[f32],
    runs: &[KvRun],
    ahead: &[KvRun],
    stride: usize,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let hd = 32 * C;
    assert!(q.len() == hd * G && acc.len() == hd * G && state.len() == G && stride >= hd);
    let load = |x: &[f32], g: usize, i: usize| {
        let x = &x[hd * g + 16 * i..][..16];
        // SAFETY: `x` is 16 floats.
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    };
    // Element 16·i.. of each query, and of each accumulator: 2C vectors per query.
    let qv: [[[__m512; 2]; C]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|j| [load(q, g, 2 * j), load(q, g, 2 * j + 1)])
    });
    let mut av: [[[__m512; 2]; C]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|j| [load(acc, g, 2 * j), load(acc, g, 2 * j + 1)])
    });
    let size = kind_size(KIND);
    let mut st: [(f32, f32); G] = std::array::from_fn(|g| state[g]);
    // `ahead`'s whole rows, asked for in step with the keys read: after `seen` of
    // `total` keys, `seen · later / total` of its `later` keys.
    let mut next = Frontier::new(ahead);
    next.paged = true;
    let total: usize = runs.iter().map(|r| r.n).sum();
    let later: usize = ahead.iter().map(|r| r.n).sum();
    // This call's own keys: asked for ahead of the reads unless they are pages whose
    // caller asked for them with its previous call (`ahead`).
    let mut front = Frontier::new(runs);
    let own = !(KIND == KV_F32 || (front.paged && later > 0));
    if own {
        front.advance(runs, front.distance(), stride, size, hd * size);
    }
    let (mut seen, mut asked) = (0, 0);
    for (ri, run) in runs.iter().enumerate() {
        if KIND == KV_F32 {
            if let Some(next) = runs.get(ri + PREFETCH_RUNS) {
                prefetch_rows::<_MM_HINT_T0>(&next.k, next.n, stride * size, hd * size);
            }
        }
        if run.n == 0 {
            continue;
        }
        let last = (run.n - 1) * stride + hd;
        assert!(run.k.len() >= last && run.v.len() >= last);
        let ((kp, kd), (vp, vd)) = (
            kind_rows::<KIND>(&run.k, run.n, stride, hd),
            kind_rows::<KIND>(&run.v, run.n, stride, hd),
        );
        let per_row = stride / hd;
        let mut scores = [[0f32; 16]; G];
        for g0 in (0..run.n).step_by(16) {
            let g1 = (g0 + 16).min(run.n);
            if own {
                front.advance(runs, g1 - g0, stride, size, hd * size);
            }
            seen += g1 - g0;
            if later > 0 {
                let want = (seen * later).div_ceil(total);
                next.advance(ahead, want - asked, stride, size, stride * size);
                asked = want;
            }
            // Each query's 8-lane partial dot products of 8 keys at a time, then their
            // horizontal sums together, as the AVX2 kernel.
            let mut part = [[_mm256_setzero_ps(); 8]; G];
            for k8 in (g0..g1).step_by(8) {
                let k9 = (k8 + 8).min(g1);
                for (k, p) in (k8..k9).enumerate() {
                    // Row p spans p*stride .. p*stride+hd <= last <= len (asserted).
                    let kr = kp.wrapping_add(p * stride * size);
                    // SAFETY: kr is a whole row of this run and p one of its rows, whose
                    // scale `kind_rows` checked is there (see above).
                    let kv: [[__m512; 2]; C] = unsafe {
                        let d = _mm512_set1_ps(row_scale::<KIND>(kd, p, per_row));
                        std::array::from_fn(|j| {
                            [
                                load16::<KIND>(kr, 2 * j, d),
                                load16::<KIND>(kr, 2 * j + 1, d),
                            ]
                        })
                    };
                    for (qg, pg) in qv.iter().zip(part.iter_mut()) {
                        // [d0 | d1] over the even pieces, [d2 | d3] over the odd ones.
                        let (mut e, mut o) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                        for j in 0..C {
                            e = _mm512_fmadd_ps(kv[j][0], qg[j][0], e);
                            o = _mm512_fmadd_ps(kv[j][1], qg[j][1], o);
                        }
                        let s = _mm512_add_ps(e, o);
                        let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s));
                        pg[k] = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(high));
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
            // The exponentials each key needs, given the running maximum before it
            // (as the AVX2 kernel). Written out in both kernels: shared as a helper, it
            // made the register-starved AVX2 kernel slower (docs/BENCHMARKS.md).
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
                // SAFETY: 16 floats each; same CPU features as this function.
                unsafe {
                    _mm512_storeu_ps(e[g].as_mut_ptr(), expf16(_mm512_loadu_ps(args.as_ptr())))
                };
            }
            // The accumulators in registers for these keys (held in memory, `av`,
            // while the scores and exponentials above use the registers).
            let mut a = av;
            let mut sums: [(f32, f32); G] = st;
            for (k, p) in (g0..g1).enumerate() {
                let vr = vp.wrapping_add(p * stride * size);
                // SAFETY: as for K above.
                let dv = _mm512_set1_ps(unsafe { row_scale::<KIND>(vd, p, per_row) });
                let mut vsv = [_mm512_setzero_ps(); G];
                for g in 0..G {
                    let (m, sum) = &mut sums[g];
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if raises[g] & (1 << k) != 0 {
                        ms = e[g][k];
                        *m = scores[g][k];
                        let msv = _mm512_set1_ps(ms);
                        #[allow(clippy::needless_range_loop)]
                        for j in 0..C {
                            a[g][j][0] = _mm512_mul_ps(a[g][j][0], msv);
                            a[g][j][1] = _mm512_mul_ps(a[g][j][1], msv);
                        }
                    } else {
                        vs = e[g][k];
                    }
                    vsv[g] = _mm512_set1_ps(vs);
                    *sum = sum.mul_add(ms, vs);
                }
                // Indexed loops: LLVM keeps `a` in registers only when it sees constant
                // indices after unrolling.
                #[allow(clippy::needless_range_loop)]
                for j in 0..C {
                    // SAFETY: vr is a whole row of this run (see above).
                    let (v0, v1) = unsafe {
                        (
                            load16::<KIND>(vr, 2 * j, dv),
                            load16::<KIND>(vr, 2 * j + 1, dv),
                        )
                    };
                    for g in 0..G {
                        a[g][j][0] = _mm512_fmadd_ps(v0, vsv[g], a[g][j][0]);
                        a[g][j][1] = _mm512_fmadd_ps(v1, vsv[g], a[g][j][1]);
                    }
                }
            }
            av = a;
            st = sums;
        }
    }
    for (s, t) in state.iter_mut().zip(st) {
        *s = t;
    }
    for (g, ag) in av.iter().enumerate() {
        for (j, a) in ag.iter().enumerate() {
            for (h, a) in a.iter().enumerate() {
                // SAFETY: acc holds hd·G floats.
                unsafe { _mm512_storeu_ps(acc[hd * g + 16 * (2 * j + h)..].as_mut_ptr(), *a) };
            }
        }
    }
}

/// `expf_table` (glibc's `expf`, `scalar::expf_table`) on 16 lanes, bit for bit: the
/// same f64 steps per lane as the AVX2 twin, with the 32-entry table read by two
/// two-register permutes and a blend where the AVX2 kernel gathers (a gather is slow
/// on Zen 4).
///
/// # Safety
/// The CPU must run AVX-512 F (checked by `detect`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn expf16(x: __m512) -> __m512 {
    use super::scalar::expf_consts::*;
    let f = |b: u64| _mm512_set1_pd(f64::from_bits(b));
    let (inv, shift) = (f(INV_LN2_N), f(SHIFT));
    let tab = |i: usize| _mm512_loadu_si512(TAB[8 * i..].as_ptr() as *const _);
    let (t0, t1, t2, t3) = (tab(0), tab(1), tab(2), tab(3));
    let half = |x: __m256| -> __m256 {
        let xd = _mm512_cvtps_pd(x);
        let kr = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(kr);
        let r = _mm512_fmsub_pd(inv, xd, _mm512_sub_pd(kr, shift));
        let z = _mm512_fmadd_pd(r, f(C[0]), f(C[1]));
        // TAB[ki % 32]: bits 0-3 pick one of 16 entries of a register pair, bit 4 the pair.
        let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        let low = _mm512_permutex2var_epi64(t0, idx, t1);
        let high = _mm512_permutex2var_epi64(t2, idx, t3);
        let upper = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, low, high);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let y = _mm512_fmadd_pd(
            z,
            _mm512_mul_pd(r, r),
            _mm512_fmadd_pd(r, f(C[2]), _mm512_set1_pd(1.0)),
        );
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    };
    let lo = half(_mm512_castps512_ps256(x));
    let hi = half(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(x),
    )));
    let e = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ));
    // Out of range: 0 below (−∞ included), +∞ above; NaN stays NaN from the arithmetic.
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(f32::from_bits(UNDERFLOW)));
    let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(f32::from_bits(OVERFLOW)));
    _mm512_mask_blend_ps(
        over,
        _mm512_maskz_mov_ps(!under, e),
        _mm512_set1_ps(f32::INFINITY),
    )
}

/// `expf16` on 16 floats in memory: the test hook.
///
/// # Safety
/// The CPU must run AVX-512 F (checked by `detect`).
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn expf16_mem(x: &[f32; 16], out: &mut [f32; 16]) {
    // SAFETY: both are 16 floats.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), expf16(_mm512_loadu_ps(x.as_ptr()))) };
}

/// Appends `n` rows of `width` 8-bit values (one head row each), `stride` apart from the
/// start of `q` (row p's scale `d[p · stride / width]`), to `out` as f32 `q · d` (exact:
/// what the kernels read).
///
/// # Safety
/// The CPU must run AVX-512 F (checked by `detect`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn widen_rows_q8(
    q: &[i8],
    d: &[u16],
    n: usize,
    stride: usize,
    width: usize,
    out: &mut Vec<f32>,
) {
    assert!(width.is_multiple_of(16) && stride.is_multiple_of(width));
    assert!(n == 0 || (q.len() >= (n - 1) * stride + width && d.len() > (n - 1) * stride / width));
    out.reserve(n * width);
    for p in 0..n {
        let row = &q[p * stride..][..width];
        // SAFETY: same CPU features as this function.
        let s = _mm512_set1_ps(unsafe { super::avx2::h2f(d[p * stride / width]) });
        for c in row.chunks_exact(16) {
            // SAFETY: `c` is 16 bytes; `out` has room for the 16 floats (reserved).
            unsafe {
                let b = _mm_loadu_si128(c.as_ptr() as *const __m128i);
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
                let len = out.len();
                _mm512_storeu_ps(out.as_mut_ptr().add(len), v);
                out.set_len(len + 16);
            }
        }
    }
}

/// Appends `n` rows of `width` f16 values, `stride` apart from the start of `rows`, to
/// `out` as f32 (exact: every f16 is an f32).
///
/// # Safety
/// The CPU must run AVX-512 F (checked by `detect`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn widen_rows(rows: &[u16], n: usize, stride: usize, width: usize, out: &mut Vec<f32>) {
    assert!(width.is_multiple_of(16) && (n == 0 || rows.len() >= (n - 1) * stride + width));
    out.reserve(n * width);
    for p in 0..n {
        let row = &rows[p * stride..][..width];
        for c in row.chunks_exact(16) {
            // SAFETY: `c` is 16 halves; `out` has room for the 16 floats (reserved).
            unsafe {
                let v = _mm512_cvtph_ps(_mm256_loadu_si256(c.as_ptr() as *const __m256i));
                let len = out.len();
                _mm512_storeu_ps(out.as_mut_ptr().add(len), v);
                out.set_len(len + 16);
            }
        }
    }
}
