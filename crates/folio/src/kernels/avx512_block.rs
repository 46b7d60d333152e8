//! AVX-512 prefill attention of a block of query rows over one tile of keys, as three
//! passes over the whole block instead of one kernel call per row: every query's scores,
//! then every query's online-softmax bookkeeping sixteen queries to a vector, then
//! P·V with a tile of queries' accumulators in registers sharing each value row.
//!
//! Each query gets exactly the bits `avx512_attend::attend_runs_zmm` gives it alone
//! (the `attention_block_gives_each_row_its_bits_alone` test holds it to the scalar
//! twin): the passes only regroup per-key operations that were already independent
//! across queries.
//! - Scores: each (query, key) product is the row kernel's: the same products summed
//!   in the same order (its 16-lane partial sums, their fold to 8 lanes and `hsum8`'s
//!   tree), computed with queries in the lanes (the block's queries transposed once),
//!   so no horizontal sums.
//! - Softmax: key by key per query, as the row kernel: a key above the running maximum
//!   scales the sum and accumulator by e^(old − new) and adds its value with weight 1,
//!   any other key adds its value with weight e^(score − max). Lanes are queries, so
//!   the order over keys is each query's own; `expf16` is `expf_table` bit for bit.
//! - P·V: per element, the same multiply and fused multiply-add in key order.
#![allow(unsafe_code)]

use super::attend::Scratch;
use super::avx512_attend::expf16;
use std::arch::x86_64::*;

/// Keys scored together in [`scores`]: each query vector loaded serves this many. 8
/// measured best of 4, 8, 12 and 16 (with 16 LLVM no longer keeps the block in
/// registers; docs/BENCHMARKS.md).
const SCORE_KEYS: usize = 8;

/// The scores of sixteen queries (`qt`: their element `d` at `d * width`) with keys
/// `0..n` of `k` (rows of `32 * C`), each times `scale`, into `out` (key `p`'s sixteen at
/// `p * width`). Each lane's arithmetic is the row kernel's for that (query, key): the
/// 16-lane partial sums `e_l` (elements `32j + l`) and `o_l` (`32j + 16 + l`) fused in
/// order of j, `s_l = e_l + o_l`, folded `s_i + s_(i+8)`, then `hsum8`'s tree.
///
/// # Safety
/// As [`attend_tile`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores<const C: usize>(
    qt: &[f32],
    width: usize,
    k: &[f32],
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = 32 * C;
    assert!(qt.len() >= (hd - 1) * width + 16 && k.len() >= n * hd);
    assert!(n == 0 || out.len() >= (n - 1) * width + 16);
    let scale = _mm512_set1_ps(scale);
    for p0 in (0..n).step_by(SCORE_KEYS) {
        // The last block repeats key n - 1 where it runs past the tile (not stored).
        let rows: [*const f32; SCORE_KEYS] =
            std::array::from_fn(|b| k[(p0 + b).min(n - 1) * hd..].as_ptr());
        // SAFETY: every row pointer starts `hd` floats of `k`, and `qt` holds `hd` rows of
        // `width` ≥ 16 floats (asserted above).
        let total = unsafe {
            let g = |i: usize| {
                let f0 = add(
                    s_l::<C>(qt.as_ptr(), width, &rows, i),
                    s_l::<C>(qt.as_ptr(), width, &rows, i + 8),
                );
                let f1 = add(
                    s_l::<C>(qt.as_ptr(), width, &rows, i + 4),
                    s_l::<C>(qt.as_ptr(), width, &rows, i + 12),
                );
                add(f0, f1)
            };
            let h0 = add(g(0), g(1));
            let h1 = add(g(2), g(3));
            add(h0, h1)
        };
        for (b, t) in total.iter().enumerate().take(n - p0) {
            let o = &mut out[(p0 + b) * width..][..16];
            // SAFETY: `o` is 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_mul_ps(*t, scale)) };
        }
    }
}

/// Lane-wise sums of two blocks of vectors.
#[inline(always)]
fn add(x: [__m512; SCORE_KEYS], y: [__m512; SCORE_KEYS]) -> [__m512; SCORE_KEYS] {
    // SAFETY: only reached from functions that enable AVX-512 F.
    std::array::from_fn(|b| unsafe { _mm512_add_ps(x[b], y[b]) })
}

/// `s_l` of sixteen queries (`qt`, transposed, rows `width` apart) with each key row of
/// `rows`: `e_l + o_l`, each the fused sum over j of elements `32j + l` (`e`) or
/// `32j + 16 + l` (`o`).
///
/// # Safety
/// `qt` holds `32 * C` rows of `width` ≥ 16 floats, each row pointer `32 * C` floats;
/// the CPU runs AVX-512 F.
#[inline(always)]
unsafe fn s_l<const C: usize>(
    qt: *const f32,
    width: usize,
    rows: &[*const f32; SCORE_KEYS],
    l: usize,
) -> [__m512; SCORE_KEYS] {
    // SAFETY: as this function's contract.
    unsafe {
        let zero = _mm512_setzero_ps();
        let (mut ev, mut od) = ([zero; SCORE_KEYS], [zero; SCORE_KEYS]);
        for j in 0..C {
            let (a, b) = (32 * j + l, 32 * j + 16 + l);
            let qa = _mm512_loadu_ps(qt.add(a * width));
            let qb = _mm512_loadu_ps(qt.add(b * width));
            for r in 0..SCORE_KEYS {
                ev[r] = _mm512_fmadd_ps(qa, _mm512_set1_ps(*rows[r].add(a)), ev[r]);
                od[r] = _mm512_fmadd_ps(qb, _mm512_set1_ps(*rows[r].add(b)), od[r]);
            }
        }
        std::array::from_fn(|r| _mm512_add_ps(ev[r], od[r]))
    }
}

/// Continues the online softmax of `ends.len()` rows of `group` queries each (`q`, `acc`:
/// the rows' queries back to back, `32 * C` values each; `state`: each query's (running
/// max, running sum)) over the first `ends[r]` keys of one tile for row `r`: `k` and `v`
/// hold the tile's rows of `32 * C` f32 values back to back. `QT` queries' accumulators
/// stay in registers through P·V (24 of the 32 zmm registers). `scratch` holds the
/// block's queries transposed ([`Scratch::transpose`] with 16 lanes).
///
/// # Safety
/// The CPU must run AVX-512 F, BW, VL and AVX2 + FMA + F16C (checked by `detect`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_tile<const C: usize, const QT: usize>(
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
    if most == 0 {
        return;
    }
    let nv = nq.div_ceil(16);
    let width = 16 * nv;
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

    // Scores, sixteen queries to a vector (the block's queries transposed: `qt`).
    assert!(
        qt.len() == hd * width,
        "Scratch::transpose for this block first"
    );
    for vi in 0..nv {
        // SAFETY: same CPU features as this function.
        unsafe { scores::<C>(&qt[16 * vi..], width, k, most, scale, &mut e[16 * vi..]) };
    }

    // The softmax bookkeeping, sixteen queries per vector: each key's exponential
    // replaces its score, and the keys that raise a query's maximum are marked.
    let one = _mm512_set1_ps(1.0);
    for vi in 0..nv {
        let lanes = (nq - 16 * vi).min(16);
        let (mut mx, mut sum) = ([f32::NEG_INFINITY; 16], [0f32; 16]);
        for (l, s) in state[16 * vi..16 * vi + lanes].iter().enumerate() {
            (mx[l], sum[l]) = *s;
        }
        // SAFETY: 16 floats or ints each.
        let (mut mxv, mut sumv, endv) = unsafe {
            (
                _mm512_loadu_ps(mx.as_ptr()),
                _mm512_loadu_ps(sum.as_ptr()),
                _mm512_loadu_si512(qends[16 * vi..].as_ptr() as *const _),
            )
        };
        for key in 0..most {
            let row = &mut e[key * width + 16 * vi..][..16];
            let active = _mm512_cmpgt_epi32_mask(endv, _mm512_set1_epi32(key as i32));
            // SAFETY: `row` is 16 floats.
            let s = unsafe { _mm512_loadu_ps(row.as_ptr()) };
            let up = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s, mxv) & active;
            let args = _mm512_mask_blend_ps(up, _mm512_sub_ps(s, mxv), _mm512_sub_ps(mxv, s));
            // SAFETY: same CPU features as this function.
            let ex = unsafe { expf16(args) };
            mxv = _mm512_mask_blend_ps(up, mxv, s);
            let ms = _mm512_mask_blend_ps(up, one, ex);
            let vs = _mm512_mask_blend_ps(up, ex, one);
            sumv = _mm512_mask_fmadd_ps(sumv, active, ms, vs);
            // SAFETY: `row` is 16 floats.
            unsafe { _mm512_storeu_ps(row.as_mut_ptr(), ex) };
            raise[key * (nv + 1) + vi] = up;
        }
        // SAFETY: 16 floats each.
        unsafe {
            _mm512_storeu_ps(mx.as_mut_ptr(), mxv);
            _mm512_storeu_ps(sum.as_mut_ptr(), sumv);
        }
        for (l, s) in state[16 * vi..16 * vi + lanes].iter_mut().enumerate() {
            *s = (mx[l], sum[l]);
        }
    }

    // P·V, `QT` queries' accumulators in registers over every key they read.
    let mut t0 = 0;
    while t0 < nq {
        let m = (nq - t0).min(QT);
        // SAFETY: same CPU features as this function.
        unsafe { weigh::<C, QT>(t0, m, qends, v, e, width, raise, nv, &mut acc[t0 * hd..]) };
        t0 += m;
    }
}

/// P·V for queries `t0..t0 + m` (`m` ≤ `QT`): each adds every key it reads (`ends`,
/// per query) of `v` with its weight, the key's exponential in `e` (or 1 where the key
/// raised its maximum, after scaling the accumulator by that exponential).
///
/// # Safety
/// As [`attend_tile`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh<const C: usize, const QT: usize>(
    t0: usize,
    m: usize,
    ends: &[i32],
    v: &[f32],
    e: &[f32],
    width: usize,
    raise: &[u16],
    nv: usize,
    acc: &mut [f32],
) {
    let hd = 32 * C;
    assert!(m <= QT && acc.len() >= m * hd && t0 + m <= width);
    let end: [usize; QT] = std::array::from_fn(|i| if i < m { ends[t0 + i] as usize } else { 0 });
    let most = end.iter().copied().max().unwrap_or(0);
    let fewest = end[..m].iter().copied().min().unwrap_or(0);
    assert!(v.len() >= most * hd && e.len() >= most * width && raise.len() >= most * (nv + 1));
    let load = |x: &[f32], i: usize| {
        let x = &x[16 * i..][..16];
        // SAFETY: `x` is 16 floats.
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    };
    let mut a = [[[_mm512_setzero_ps(); 2]; C]; QT];
    // Indexed loops: LLVM keeps `a` in registers only when it sees constant indices
    // after unrolling.
    #[allow(clippy::needless_range_loop)]
    for i in 0..m {
        for j in 0..C {
            a[i][j] = [load(&acc[i * hd..], 2 * j), load(&acc[i * hd..], 2 * j + 1)];
        }
    }
    let (word, bit) = (t0 / 16, t0 % 16);
    let mask = (1u32 << QT) - 1;
    for key in 0..most {
        let bits = {
            let r = &raise[key * (nv + 1) + word..];
            ((u32::from(r[0]) | (u32::from(r[1]) << 16)) >> bit) & mask
        };
        let ex = &e[key * width + t0..];
        let vr = &v[key * hd..];
        let vv: [[__m512; 2]; C] = std::array::from_fn(|j| [load(vr, 2 * j), load(vr, 2 * j + 1)]);
        let all = key < fewest;
        #[allow(clippy::needless_range_loop)]
        for i in 0..QT {
            if i >= m || !(all || key < end[i]) {
                continue;
            }
            let mut w = ex[i];
            if bits & (1 << i) != 0 {
                let s = _mm512_set1_ps(w);
                for j in 0..C {
                    a[i][j][0] = _mm512_mul_ps(a[i][j][0], s);
                    a[i][j][1] = _mm512_mul_ps(a[i][j][1], s);
                }
                w = 1.0;
            }
            let w = _mm512_set1_ps(w);
            for j in 0..C {
                a[i][j][0] = _mm512_fmadd_ps(vv[j][0], w, a[i][j][0]);
                a[i][j][1] = _mm512_fmadd_ps(vv[j][1], w, a[i][j][1]);
            }
        }
    }
    #[allow(clippy::needless_range_loop)]
    for i in 0..m {
        for j in 0..C {
            for h in 0..2 {
                let o = &mut acc[i * hd + 16 * (2 * j + h)..][..16];
                // SAFETY: `o` is 16 floats.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), a[i][j][h]) };
            }
        }
    }
}
