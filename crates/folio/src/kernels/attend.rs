//! Prefill attention in query blocks: several query rows of one sequence (each with the
//! query heads of one KV head) go through the same keys tile by tile, so a tile of K/V
//! is fetched from memory once for the whole block and then read from L1 by every row.
//!
//! Blocking changes only which rows share a memory pass: each row runs its own keys in
//! order through [`super::attend_runs`], whose result does not depend on how the keys are
//! split into runs or calls, so every row gets the bits it gets alone.

use super::{Isa, KvRows, KvRun};

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
    let mut cut = Vec::with_capacity(TILE_KEYS + 1);
    let mut t0 = 0;
    while t0 < most {
        let t1 = (t0 + TILE_KEYS).min(most);
        slice_runs(runs, t0, t1, stride, &mut tile);
        for r in 0..rows {
            let end = keys[r].min(t1);
            if end <= t0 {
                continue;
            }
            let these = if end == t1 {
                &tile[..]
            } else {
                slice_runs(&tile, 0, end - t0, stride, &mut cut);
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
        t0 = t1;
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
