//! AVX2 prefill attention of a block of query rows over one tile of keys: the three
//! passes of the AVX-512 block kernel (`avx512_block`) with eight queries to a vector.
//! Every query's scores, then every query's online-softmax bookkeeping, then P·V with a
//! query's accumulators in registers over the tile's value rows. Only for f32 value
//! accumulators (`round` off: folio's own arithmetic); llama.cpp's f16 ones keep the
//! row kernel.
//!
//! Each query gets exactly the bits `avx2::attend_runs_ymm` (with `ROUND = false`)
//! gives it alone (the `attention_block_gives_each_row_its_bits_alone` test holds it to
//! the scalar twin): the passes only regroup per-key operations that were already
//! independent across queries.
//! - Scores: each (query, key) product is the row kernel's: its four 8-lane partial
//!   sums (elements `8i + l` with `i ≡ c mod 4`, fused in order of i), their sum
//!   `(d0 + d2) + (d1 + d3)`, then `hsum8`'s tree over the lanes, times the scale,
//!   computed with queries in the lanes (the block's queries transposed once), so no
//!   horizontal sums.
//! - Softmax: key by key per query, as the row kernel: a key above the running maximum
//!   scales the sum and accumulator by e^(old − new) and adds its value with weight 1,
//!   any other key adds its value with weight e^(score − max), `expf_table` both.
//! - P·V: per element, the same multiply and fused multiply-add in key order.
#![allow(unsafe_code)]

use super::attend::Scratch;
use super::avx2::expf_table;
use std::arch::x86_64::*;

/// The scores of eight queries (`qv`: their element `d`'s eight values at `8 d`)
/// with keys `0..n` of `k` (rows of `32 * C`), each times `scale`, into `out` (key
/// `p`'s eight at `p * width`), with the row kernel's arithmetic (module doc).
///
/// # Safety
/// As [`attend_tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores<const C: usize>(
    qv: &[f32],
    k: &[f32],
    n: usize,
    scale: f32,
    out: &mut [f32],
    width: usize,
) {
    let hd = 32 * C;
    assert!(qv.len() >= 8 * hd && k.len() >= n * hd);
    assert!(n == 0 || out.len() >= (n - 1) * width + 8);
    let scale = _mm256_set1_ps(scale);
    for p in 0..n {
        // SAFETY: `qv` holds `8 hd` floats and key p's row `hd` (asserted above).
        let total = unsafe {
            let (q, row) = (qv.as_ptr(), k.as_ptr().add(p * hd));
            let lane = |l: usize| lane_sum::<C>(q, row, l);
            // `hsum8`'s tree: ((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7)).
            let x = _mm256_add_ps(lane(0), lane(4));
            let x = _mm256_add_ps(x, _mm256_add_ps(lane(1), lane(5)));
            let y = _mm256_add_ps(lane(2), lane(6));
            let y = _mm256_add_ps(y, _mm256_add_ps(lane(3), lane(7)));
            _mm256_add_ps(x, y)
        };
        let o = &mut out[p * width..][..8];
        // SAFETY: `o` is 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_mul_ps(total, scale)) };
    }
}

/// Lane `l` of the row kernel's combined partial sum, `(d0 + d2) + (d1 + d3)`, for
/// eight queries (`q`: element `e`'s eight values at `8 e`) with one key `row`: `d_c`
/// the fused sum over `i ≡ c (mod 4)`, in order, of element `8i + l`'s product.
///
/// # Safety
/// `q` holds `8 * 32 * C` floats and `row` `32 * C`; the CPU runs AVX2 and FMA.
#[inline(always)]
unsafe fn lane_sum<const C: usize>(q: *const f32, row: *const f32, l: usize) -> __m256 {
    // SAFETY: as this function's contract.
    unsafe {
        let mut d = [_mm256_setzero_ps(); 4];
        for j in 0..C {
            for (c, d) in d.iter_mut().enumerate() {
                let e = 8 * (4 * j + c) + l;
                *d = _mm256_fmadd_ps(
                    _mm256_loadu_ps(q.add(8 * e)),
                    _mm256_broadcast_ss(&*row.add(e)),
                    *d,
                );
            }
        }
        _mm256_add_ps(_mm256_add_ps(d[0], d[2]), _mm256_add_ps(d[1], d[3]))
    }
}

/// Continues the online softmax of `ends.len()` rows of `group` queries each (`q`, `acc`:
/// the rows' queries back to back, `32 * C` values each; `state`: each query's (running
/// max, running sum)) over the first `ends[r]` keys of one tile for row `r`: `k` and `v`
/// hold the tile's rows of `32 * C` f32 values back to back. `scratch` holds the block's
/// queries transposed ([`Scratch::transpose_by_vector`] with 8 lanes).
///
/// # Safety
/// The CPU must run AVX2, FMA and F16C (checked by `detect`).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_tile<const C: usize>(
    q: &[f32],
    group: usize,
    ends: &[usize],
    k: &[f32],
    v: &[f32],
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
    scratch: &mut Scratch,
) {
    let hd = 32 * C;
    let nq = ends.len() * group;
    let most = ends.iter().copied().max().unwrap_or(0);
    assert!(q.len() == nq * hd && acc.len() == nq * hd && state.len() == nq);
    assert!(k.len() >= most * hd && v.len() >= most * hd);
    // A tile's keys that raise a query's maximum fit in one 64-bit mask.
    assert!(most <= 64, "a tile of {most} keys");
    if most == 0 {
        return;
    }
    let nv = nq.div_ceil(8);
    let width = 8 * nv;
    let Scratch {
        qt,
        e,
        raise,
        ends: qends,
    } = scratch;
    e.resize(most * width, 0.0);
    raise.clear();
    raise.resize(most * (nv + 1), 0);
    qends.clear();
    qends.extend((0..width).map(|i| ends.get(i / group).map_or(0, |&n| n as i32)));

    // Scores, eight queries to a vector (the block's queries transposed: `qt`).
    assert!(
        qt.len() == hd * width,
        "Scratch::transpose_by_vector for this block (8 lanes) first"
    );
    for vi in 0..nv {
        let qv = &qt[8 * hd * vi..];
        // SAFETY: same CPU features as this function.
        unsafe { scores::<C>(qv, k, most, scale, &mut e[8 * vi..], width) };
    }

    // The softmax bookkeeping, eight queries per vector: each key's exponential
    // replaces its score, and the keys that raise a query's maximum are marked.
    let one = _mm256_set1_ps(1.0);
    for vi in 0..nv {
        let lanes = (nq - 8 * vi).min(8);
        let (mut mx, mut sum) = ([f32::NEG_INFINITY; 8], [0f32; 8]);
        for (l, s) in state[8 * vi..8 * vi + lanes].iter().enumerate() {
            (mx[l], sum[l]) = *s;
        }
        // SAFETY: 8 floats or ints each.
        let (mut mxv, mut sumv, endv) = unsafe {
            (
                _mm256_loadu_ps(mx.as_ptr()),
                _mm256_loadu_ps(sum.as_ptr()),
                _mm256_loadu_si256(qends[8 * vi..].as_ptr() as *const __m256i),
            )
        };
        for key in 0..most {
            let row = &mut e[key * width + 8 * vi..][..8];
            let active =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(endv, _mm256_set1_epi32(key as i32)));
            // SAFETY: `row` is 8 floats.
            let s = unsafe { _mm256_loadu_ps(row.as_ptr()) };
            let up = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(s, mxv), active);
            let args = _mm256_blendv_ps(_mm256_sub_ps(s, mxv), _mm256_sub_ps(mxv, s), up);
            // SAFETY: same CPU features as this function.
            let ex = unsafe { expf_table(args) };
            mxv = _mm256_blendv_ps(mxv, s, up);
            let ms = _mm256_blendv_ps(one, ex, up);
            let vs = _mm256_blendv_ps(ex, one, up);
            sumv = _mm256_blendv_ps(sumv, _mm256_fmadd_ps(sumv, ms, vs), active);
            // SAFETY: `row` is 8 floats.
            unsafe { _mm256_storeu_ps(row.as_mut_ptr(), ex) };
            raise[key * (nv + 1) + vi] = _mm256_movemask_ps(up) as u16;
        }
        // SAFETY: 8 floats each.
        unsafe {
            _mm256_storeu_ps(mx.as_mut_ptr(), mxv);
            _mm256_storeu_ps(sum.as_mut_ptr(), sumv);
        }
        for (l, s) in state[8 * vi..8 * vi + lanes].iter_mut().enumerate() {
            *s = (mx[l], sum[l]);
        }
    }

    // P·V, query by query, a slice of its head at a time with the slice's
    // accumulators in registers over every key the query reads.
    for (i, a) in acc.chunks_exact_mut(hd).enumerate() {
        let end = qends[i] as usize;
        // The keys that raise query i's maximum, one bit each (a tile is ≤ 64 keys).
        let (word, bit) = (i / 8, i % 8);
        let raised = (0..end).fold(0u64, |m, key| {
            m | (u64::from((raise[key * (nv + 1) + word] >> bit) & 1) << key)
        });
        let ex = &e[i..];
        let mut at = 0;
        while at < hd {
            // SAFETY: same CPU features as this function.
            unsafe {
                if hd - at >= 64 {
                    weigh::<8>(hd, at, end, raised, v, ex, width, a);
                    at += 64;
                } else {
                    weigh::<4>(hd, at, end, raised, v, ex, width, a);
                    at += 32;
                }
            }
        }
    }
}

/// P·V for one query over slice `at..at + 8 W` of its head (`acc`: its accumulator,
/// `hd` values): it adds each of its first `end` keys' value rows of `v` with the key's
/// weight, its exponential in `ex` (key `p`'s at `p * width`), or 1 where the key
/// raised its maximum (bit `p` of `raised`), after scaling the accumulator by that
/// exponential.
///
/// # Safety
/// As [`attend_tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh<const W: usize>(
    hd: usize,
    at: usize,
    end: usize,
    raised: u64,
    v: &[f32],
    ex: &[f32],
    width: usize,
    acc: &mut [f32],
) {
    assert!(at + 8 * W <= hd && acc.len() == hd && end <= 64);
    assert!(end == 0 || (v.len() >= end * hd && ex.len() > (end - 1) * width));
    let (vp, ep) = (v.as_ptr().wrapping_add(at), ex.as_ptr());
    // Key p < end reads `v[p * hd + at..][..8 W]` and `ex[p * width]`, both in bounds
    // (asserted above).
    let row = |p: usize, j: usize| {
        // SAFETY: see above (j < W).
        unsafe { _mm256_loadu_ps(vp.add(p * hd + 8 * j)) }
    };
    let weight = |p: usize| {
        // SAFETY: see above.
        unsafe { _mm256_broadcast_ss(&*ep.add(p * width)) }
    };
    // SAFETY: `acc` holds `hd` floats.
    let mut a: [__m256; W] =
        std::array::from_fn(|j| unsafe { _mm256_loadu_ps(acc.as_ptr().add(at + 8 * j)) });
    let one = _mm256_set1_ps(1.0);
    assert!(end == 64 || raised >> end == 0, "raised keys are read keys");
    let (mut p, mut rest) = (0, raised);
    while p < end {
        let stop = if rest == 0 {
            end
        } else {
            rest.trailing_zeros() as usize
        };
        for q in p..stop {
            let w = weight(q);
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(row(q, j), w, *a);
            }
        }
        if stop == end {
            break;
        }
        // Key `stop` raised the maximum: the old terms scale by its exponential, and
        // its value comes in with weight 1.
        let s = weight(stop);
        for (j, a) in a.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(row(stop, j), one, _mm256_mul_ps(*a, s));
        }
        rest &= rest - 1;
        p = stop + 1;
    }
    for (j, a) in a.iter().enumerate() {
        // SAFETY: `acc` holds `hd` floats.
        unsafe { _mm256_storeu_ps(acc.as_mut_ptr().add(at + 8 * j), *a) };
    }
}

/// Appends `n` rows of `width` 8-bit values (one head row each), `stride` apart from the
/// start of `q` (row p's scale `d[p · stride / width]`), to `out` as f32 `q · d` (exact:
/// what the kernels read).
///
/// # Safety
/// The CPU must run AVX2 and F16C (checked by `detect`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_rows_q8(
    q: &[i8],
    d: &[u16],
    n: usize,
    stride: usize,
    width: usize,
    out: &mut Vec<f32>,
) {
    assert!(width.is_multiple_of(8) && stride.is_multiple_of(width));
    assert!(n == 0 || (q.len() >= (n - 1) * stride + width && d.len() > (n - 1) * stride / width));
    out.reserve(n * width);
    for p in 0..n {
        let row = &q[p * stride..][..width];
        // SAFETY: same CPU features as this function.
        let s = _mm256_set1_ps(unsafe { super::avx2::h2f(d[p * stride / width]) });
        for c in row.chunks_exact(8) {
            // SAFETY: `c` is 8 bytes; `out` has room for the 8 floats (reserved).
            unsafe {
                let b = _mm_loadl_epi64(c.as_ptr() as *const __m128i);
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
                let len = out.len();
                _mm256_storeu_ps(out.as_mut_ptr().add(len), v);
                out.set_len(len + 8);
            }
        }
    }
}

/// Appends `n` rows of `width` f16 values, `stride` apart from the start of `rows`, to
/// `out` as f32 (exact: every f16 is an f32).
///
/// # Safety
/// The CPU must run AVX2 and F16C (checked by `detect`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_rows(rows: &[u16], n: usize, stride: usize, width: usize, out: &mut Vec<f32>) {
    assert!(width.is_multiple_of(8) && (n == 0 || rows.len() >= (n - 1) * stride + width));
    out.reserve(n * width);
    for p in 0..n {
        let row = &rows[p * stride..][..width];
        for c in row.chunks_exact(8) {
            // SAFETY: `c` is 8 halves; `out` has room for the 8 floats (reserved).
            unsafe {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(c.as_ptr() as *const __m128i));
                let len = out.len();
                _mm256_storeu_ps(out.as_mut_ptr().add(len), v);
                out.set_len(len + 8);
            }
        }
    }
}
