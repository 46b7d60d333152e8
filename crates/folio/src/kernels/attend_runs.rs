//! The attention kernels' one-row entries: a row's query heads (those of one KV head)
//! continue their online softmax over runs of keys, on the path's SIMD kernel
//! (`avx2`, `avx512_attend`) or the scalar twin. The model reaches them only through
//! [`super::attend`] (`attend.rs`); the tests compare each path with the scalar one.

#[cfg(target_arch = "x86_64")]
use super::avx2::{KV_F16, KV_F32, KV_Q8};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512_attend};
use super::{scalar, Attend, Isa};

/// Continues the online softmax of one row's queries (`c.q`: the query heads of one KV
/// head, back to back) over every key of `c.runs` (`c.keys` is not read: a row's
/// limit is its runs' end): `acc` holds each query's accumulator back to back, `state[g]` its (running max, running sum). Each
/// query gets the bits `scalar::attend_runs` gives it alone, however many share the
/// call, with rounding `round` ([`Isa::f16_attention`] in the model; tests compare
/// every kernel with its scalar twin both ways).
pub(crate) fn attend_row(
    isa: Isa,
    round: bool,
    c: &Attend,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let (q, runs, ahead, stride, scale) = (c.q, c.runs, c.ahead, c.stride, c.scale);
    let n = state.len();
    assert!(n > 0 && q.len() == acc.len() && q.len().is_multiple_of(n));
    let hd = q.len() / n;
    if c.cap != 0.0 {
        for ((q, st), acc) in q.chunks_exact(hd).zip(state).zip(acc.chunks_exact_mut(hd)) {
            let st = (&mut st.0, &mut st.1);
            scalar::attend_runs_capped(q, runs, stride, scale, c.cap, st, acc, round);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && simd_head(hd) {
        let kind = runs.first().map_or(KV_F16, |r| avx2::kind_of(&r.k));
        let zmm = zmm_attention(isa, round, hd);
        // As many queries per call as keep their values and accumulators in registers
        // (32 zmm or 16 ymm; the AVX2 kernel spills either way past head size 64).
        let most = match (zmm, hd) {
            (true, 32 | 64) => 3,
            (true, 96) => 2,
            (false, 64) => 4,
            _ => 1,
        };
        let mut g = 0;
        while g < n {
            let k = (n - g).min(most);
            // The first call asks for `ahead`; later ones find it asked for.
            let ahead = if g == 0 { ahead } else { &[] };
            let (q, st, acc) = (
                &q[hd * g..hd * (g + k)],
                &mut state[g..g + k],
                &mut acc[hd * g..hd * (g + k)],
            );
            // Each arm's `unsafe`: the AVX2 path and those above it are only produced
            // by `detect` after checking avx2, fma and f16c, and the AVX-512 path after
            // running one of its instructions.
            macro_rules! zmm {
                ($kind:expr; $(($c:literal, $g:pat) => $gc:literal),*) => {
                    match (hd / 32, k) {
                        $(($c, $g) => {
                            // SAFETY: see above; `zmm` is only set on the AVX-512 path.
                            unsafe { avx512_attend::attend_runs_zmm::<$kind, $c, $gc>(q, runs, ahead, stride, scale, st, acc) }
                        })*
                        _ => unreachable!(),
                    }
                };
            }
            macro_rules! ymm {
                ($kind:expr, $round:expr; $(($n:literal, $g:pat) => $gn:literal),*) => {
                    match (hd / 8, k) {
                        $(($n, $g) => {
                            // SAFETY: see above; this is the AVX2 path or one above it.
                            unsafe { avx2::attend_runs_ymm::<$kind, $round, $n, $gn>(q, runs, stride, scale, st, acc) }
                        })*
                        _ => unreachable!(),
                    }
                };
            }
            macro_rules! zmm_all {
                ($kind:expr) => {
                    zmm!($kind; (1, 1) => 1, (1, 2) => 2, (1, 3) => 3, (2, 1) => 1, (2, 2) => 2,
                        (2, 3) => 3, (3, 1) => 1, (3, 2) => 2, (4, _) => 1, (5, _) => 1,
                        (6, _) => 1, (7, _) => 1, (8, _) => 1)
                };
            }
            macro_rules! ymm_all {
                ($kind:expr, $round:expr) => {
                    ymm!($kind, $round; (8, 1) => 1, (8, 2) => 2, (8, 3) => 3, (8, 4) => 4,
                        (4, _) => 1, (12, _) => 1, (16, _) => 1, (20, _) => 1, (24, _) => 1,
                        (28, _) => 1, (32, _) => 1)
                };
            }
            // Only f16 rows round (f32 and 8-bit ones keep f32 accumulators).
            match (zmm, kind, round) {
                (true, KV_F32, _) => zmm_all!(KV_F32),
                (true, KV_Q8, _) => zmm_all!(KV_Q8),
                (true, _, _) => zmm_all!(KV_F16),
                (false, KV_F32, _) => ymm_all!(KV_F32, false),
                (false, KV_Q8, _) => ymm_all!(KV_Q8, false),
                (false, _, true) => ymm_all!(KV_F16, true),
                (false, _, false) => ymm_all!(KV_F16, false),
            }
            g += k;
        }
        return;
    }
    let _ = (isa, ahead);
    for ((q, st), acc) in q.chunks_exact(hd).zip(state).zip(acc.chunks_exact_mut(hd)) {
        scalar::attend_runs(q, runs, stride, scale, (&mut st.0, &mut st.1), acc, round);
    }
}

/// Whether the SIMD attention kernels take head size `hd`.
pub(crate) fn simd_head(hd: usize) -> bool {
    hd.is_multiple_of(32) && hd <= 256
}

/// Whether [`attend_row`] runs the AVX-512 kernel (`avx512_attend`) for head size
/// `hd` with rounding `round`.
pub(crate) fn zmm_attention(isa: Isa, round: bool, hd: usize) -> bool {
    isa.avx512() && !round && simd_head(hd)
}

/// [`attend_row`] with the path's rounding and nothing asked for ahead (the tests'
/// reference call).
#[cfg(test)]
pub(crate) fn attend_runs(
    isa: Isa,
    q: &[f32],
    runs: &[super::KvRun],
    stride: usize,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let c = Attend {
        q,
        keys: &[],
        from: &[],
        runs,
        ahead: &[],
        stride,
        scale,
        cap: 0.0,
    };
    attend_row(isa, isa.f16_attention(), &c, state, acc)
}
