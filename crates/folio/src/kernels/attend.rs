//! Prefill attention in query blocks: several query rows of one sequence (each with the
//! query heads of one KV head) go through the same keys tile by tile, so a tile of K/V
//! is fetched from memory once for the whole block and then read from L1 by every row.
//!
//! Blocking changes only which rows share a memory pass: each row runs its own keys in
//! order through [`super::attend_runs`], whose result does not depend on how the keys are
//! split into runs or calls, so every row gets the bits it gets alone.

#[cfg(target_arch = "x86_64")]
use super::avx512_block::Scratch;
use super::{Isa, KvRows, KvRun};
#[cfg(not(target_arch = "x86_64"))]
type Scratch = ();

/// Keys per tile: K and V of 32 keys of one KV head are 8 KiB in f16 (16 KiB in f32),
/// which stay in L1 while every row of the block reads them.
pub const TILE_KEYS: usize = 32;

/// Continues the online softmax of a block of query rows over the same runs of keys:
/// row `r` reads the first `keys[r]` keys of `runs` (its causal limit). `q` and `acc`
/// hold the rows back to back, each `state.len() / keys.len()` queries (the query heads
/// of one KV head) of `head_dim` values; `state` holds each query's (running max,
/// running sum) in the same order. Each query gets the bits `attend_runs` gives it
/// alone over its keys, whatever the block. `cap` ≠ 0 soft-caps the scores
/// ([`super::attend_runs_capped`]).
#[allow(clippy::too_many_arguments)]
pub fn attend_block(
    isa: Isa,
    q: &[f32],
    keys: &[usize],
    runs: &[KvRun],
    stride: usize,
    scale: f32,
    cap: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let rows = keys.len();
    if rows == 0 {
        return;
    }
    assert!(state.len().is_multiple_of(rows) && q.len() == acc.len());
    assert!(q.len().is_multiple_of(rows));
    let (group, width) = (state.len() / rows, q.len() / rows);
    let total: usize = runs.iter().map(|r| r.n).sum();
    let most = keys.iter().copied().max().unwrap_or(0).min(total);
    let mut tile = Vec::with_capacity(TILE_KEYS + 1);
    if rows == 1 {
        // One row (a decode step): all its keys in one call, so the kernel prefetches
        // each page while it reads the one before.
        slice_runs(runs, 0, most, stride, &mut tile);
        super::attend_runs_capped(isa, q, &tile, stride, scale, cap, state, acc);
        return;
    }
    // Where the AVX-512 kernel runs, each tile of f16 keys and values is widened to f32
    // once for the whole block: the same values (the conversion is exact) for every
    // row, whose kernel then reads them without converting again.
    let hd = width / group;
    let widen = cap == 0.0
        && super::zmm_attention(isa, isa.f16_attention(), hd)
        && runs.first().is_some_and(|r| matches!(r.k, KvRows::F16(_)));
    let (mut k32, mut v32) = (Vec::new(), Vec::new());
    // The AVX-512 block kernel takes head sizes up to 128 (its accumulators' registers).
    let blocked = widen && hd <= 128;
    let (mut ends, mut scratch) = (Vec::with_capacity(rows), Scratch::default());
    #[cfg(target_arch = "x86_64")]
    if blocked {
        scratch.transpose(q, hd);
    }
    let mut t0 = 0;
    while t0 < most {
        let t1 = (t0 + TILE_KEYS).min(most);
        slice_runs(runs, t0, t1, stride, &mut tile);
        if widen {
            widen_tile(&tile, stride, hd, &mut k32, &mut v32);
            let (k, v) = (&k32[..], &v32[..]);
            if blocked {
                ends.clear();
                ends.extend(keys.iter().map(|&n| n.min(t1).saturating_sub(t0)));
                block_tile(q, group, &ends, k, v, scale, state, acc, &mut scratch);
            } else {
                let wide = [KvRun {
                    k: KvRows::F32(k),
                    v: KvRows::F32(v),
                    n: t1 - t0,
                }];
                rows_over_tile(isa, q, keys, &wide, hd, scale, cap, t0, state, acc);
            }
        } else {
            rows_over_tile(isa, q, keys, &tile, stride, scale, cap, t0, state, acc);
        }
        t0 = t1;
    }
}

/// Every row of a block over one tile of keys widened to f32 (`k`, `v`: its rows back to
/// back), row `r` over its first `ends[r]`, by the AVX-512 block kernel (`scratch` holds
/// the block's queries transposed). Only called where that kernel runs (`blocked`).
#[allow(clippy::too_many_arguments)]
fn block_tile(
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
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx512_block::attend_tile;
        let hd = q.len() / state.len();
        // SAFETY: `blocked` is set only where `detect` ran the AVX-512 path.
        unsafe {
            // (head size / 32, queries whose accumulators fit in registers).
            match hd / 32 {
                1 => attend_tile::<1, 12>(q, group, ends, k, v, scale, state, acc, scratch),
                2 => attend_tile::<2, 6>(q, group, ends, k, v, scale, state, acc, scratch),
                3 => attend_tile::<3, 4>(q, group, ends, k, v, scale, state, acc, scratch),
                4 => attend_tile::<4, 3>(q, group, ends, k, v, scale, state, acc, scratch),
                _ => unreachable!("head size {hd}: not `blocked`"),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (q, group, ends, k, v, scale, state, acc, scratch);
}

/// Every row of a block over one tile of keys (`t0` is the tile's first key), each up
/// to its own limit.
#[allow(clippy::too_many_arguments)]
fn rows_over_tile(
    isa: Isa,
    q: &[f32],
    keys: &[usize],
    tile: &[KvRun],
    stride: usize,
    scale: f32,
    cap: f32,
    t0: usize,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let rows = keys.len();
    let (group, width) = (state.len() / rows, q.len() / rows);
    let t1 = t0 + tile.iter().map(|r| r.n).sum::<usize>();
    let mut cut = Vec::with_capacity(tile.len());
    for r in 0..rows {
        let end = keys[r].min(t1);
        if end <= t0 {
            continue;
        }
        let these = if end == t1 {
            tile
        } else {
            slice_runs(tile, 0, end - t0, stride, &mut cut);
            &cut[..]
        };
        super::attend_runs_capped(
            isa,
            &q[r * width..(r + 1) * width],
            these,
            stride,
            scale,
            cap,
            &mut state[r * group..(r + 1) * group],
            &mut acc[r * width..(r + 1) * width],
        );
    }
}

/// The K and V rows of `runs` (f16, `hd` values each, `stride` apart) as f32 rows back
/// to back in `k` and `v`.
fn widen_tile(runs: &[KvRun], stride: usize, hd: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) {
    k.clear();
    v.clear();
    for run in runs {
        for (rows, out) in [(run.k, &mut *k), (run.v, &mut *v)] {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: only called where the AVX-512 kernel runs, which `detect` checked.
            unsafe {
                super::avx512_attend::widen_rows(rows.raw(), run.n, stride, hd, out)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (rows, out);
        }
    }
}

/// Keys `from..to` of `runs` (counted across them in order) as runs of their own.
fn slice_runs<'a>(
    runs: &[KvRun<'a>],
    from: usize,
    to: usize,
    stride: usize,
    out: &mut Vec<KvRun<'a>>,
) {
    out.clear();
    let mut start = 0;
    for run in runs {
        if start >= to {
            break;
        }
        let (a, b) = (from.max(start), to.min(start + run.n));
        if a < b {
            let skip = |x: KvRows<'a>| {
                if a > start {
                    x.skip((a - start) * stride)
                } else {
                    x
                }
            };
            out.push(KvRun {
                k: skip(run.k),
                v: skip(run.v),
                n: b - a,
            });
        }
        start += run.n;
    }
}
