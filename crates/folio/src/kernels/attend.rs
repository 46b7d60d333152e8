//! The attention kernels' one entry, [`attend`]: a block of query rows of one sequence
//! (one row: a decode step) continues its online softmax over the same runs of keys,
//! each row up to its own causal limit. Several rows go through the keys tile by tile,
//! so a tile of K/V is fetched from memory once for the whole block and then read from
//! L1 by every row; one row takes all its keys in one call, so the kernel prefetches
//! each page while it reads the one before (and asks for `ahead`).
//!
//! Blocking changes only which rows share a memory pass: each row runs its own keys in
//! order through `attend_row` (`attend_runs.rs`), whose result does not depend on how
//! the keys are split into runs or calls, so every row gets the bits it gets alone.

#[cfg(target_arch = "x86_64")]
use super::avx512_block::Scratch;
use super::{Isa, KvRows, KvRun};
#[cfg(not(target_arch = "x86_64"))]
type Scratch = ();

/// Keys per tile: K and V of 32 keys of one KV head are 8 KiB in f16 (16 KiB in f32),
/// which stay in L1 while every row of the block reads them.
pub const TILE_KEYS: usize = 32;

/// One call into the attention kernels: what [`attend`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Attend<'a> {
    /// The block's queries: per row, the query heads of one KV head, `head_dim` values
    /// each, rows back to back.
    pub q: &'a [f32],
    /// Row `r` reads the first `keys[r]` keys of `runs` (its causal limit).
    pub keys: &'a [usize],
    /// The keys, in order, as runs of rows stored `stride` elements apart.
    pub runs: &'a [KvRun<'a>],
    /// Whole K/V rows to ask for into L2 while computing, spread over the keys read: a
    /// decode step's next piece. Only a one-row block without a cap asks (and only the
    /// AVX-512 kernel spreads them); it never changes a bit.
    pub ahead: &'a [KvRun<'a>],
    /// Elements from one key's row to the next.
    pub stride: usize,
    /// Multiplies every query·key product.
    pub scale: f32,
    /// ≠ 0: scores become `cap · tanh(score)` (the caller has divided `scale` by it, as
    /// ggml's flash attention does). Capped scores run the scalar kernel on every path.
    pub cap: f32,
}

/// Continues the online softmax of a block of query rows over `a.runs`: `state` holds
/// each query's (running max, running sum), `acc` its value accumulator, in `a.q`'s
/// order. Each query gets the bits the scalar kernel gives it alone over its keys, with
/// the path's rounding ([`Isa::f16_attention`]), whatever the block and however the
/// keys are split into runs or calls.
pub fn attend(isa: Isa, a: &Attend, state: &mut [(f32, f32)], acc: &mut [f32]) {
    let rows = a.keys.len();
    if rows == 0 {
        return;
    }
    assert!(state.len().is_multiple_of(rows) && a.q.len() == acc.len());
    assert!(a.q.len().is_multiple_of(rows));
    let total: usize = a.runs.iter().map(|r| r.n).sum();
    let most = a.keys.iter().copied().max().unwrap_or(0).min(total);
    let mut tile = Vec::with_capacity(TILE_KEYS + 1);
    if rows == 1 {
        // One row (a decode step): all its keys in one call, so the kernel prefetches
        // each page while it reads the one before.
        let runs = if most < total {
            slice_runs(a.runs, 0, most, a.stride, &mut tile);
            &tile[..]
        } else {
            a.runs
        };
        let c = Attend { runs, ..*a };
        super::attend_row(isa, isa.f16_attention(), &c, state, acc);
        return;
    }
    block(isa, a, most, state, acc);
}

/// [`attend`] for a block of several rows, over its first `most` keys.
fn block(isa: Isa, a: &Attend, most: usize, state: &mut [(f32, f32)], acc: &mut [f32]) {
    let rows = a.keys.len();
    let (group, width) = (state.len() / rows, a.q.len() / rows);
    let mut tile = Vec::with_capacity(TILE_KEYS + 1);
    // Where the AVX-512 kernel runs, each tile of f16 or 8-bit keys and values is
    // widened to f32 once for the whole block: the same values (the conversion is
    // exact, `q · d` for 8-bit rows) for every row, whose kernel then reads them
    // without converting again.
    let hd = width / group;
    let widen = a.cap == 0.0
        && super::zmm_attention(isa, isa.f16_attention(), hd)
        && a.runs
            .first()
            .is_some_and(|r| matches!(r.k, KvRows::F16(_) | KvRows::Q8 { .. }));
    let (mut k32, mut v32) = (Vec::new(), Vec::new());
    // The AVX-512 block kernel takes head sizes up to 128 (its accumulators' registers).
    let blocked = widen && hd <= 128;
    let (mut ends, mut scratch) = (Vec::with_capacity(rows), Scratch::default());
    #[cfg(target_arch = "x86_64")]
    if blocked {
        scratch.transpose(a.q, hd);
    }
    let mut t0 = 0;
    while t0 < most {
        let t1 = (t0 + TILE_KEYS).min(most);
        slice_runs(a.runs, t0, t1, a.stride, &mut tile);
        if widen {
            widen_tile(&tile, a.stride, hd, &mut k32, &mut v32);
            let (k, v) = (&k32[..], &v32[..]);
            if blocked {
                ends.clear();
                ends.extend(a.keys.iter().map(|&n| n.min(t1).saturating_sub(t0)));
                let tile = Tile { k, v, ends: &ends };
                block_tile(a.q, group, &tile, a.scale, state, acc, &mut scratch);
            } else {
                let wide = [KvRun {
                    k: KvRows::F32(k),
                    v: KvRows::F32(v),
                    n: t1 - t0,
                }];
                let a = Attend {
                    runs: &wide,
                    stride: hd,
                    ..*a
                };
                rows_over_tile(isa, &a, t0, state, acc);
            }
        } else {
            let a = Attend { runs: &tile, ..*a };
            rows_over_tile(isa, &a, t0, state, acc);
        }
        t0 = t1;
    }
}

/// One tile of keys widened to f32 (`k`, `v`: its rows back to back), row `r` of the
/// block reading its first `ends[r]`.
struct Tile<'a> {
    k: &'a [f32],
    v: &'a [f32],
    ends: &'a [usize],
}

/// Every row of a block over one widened tile, by the AVX-512 block kernel (`scratch`
/// holds the block's queries transposed). Only called where that kernel runs
/// (`blocked`).
fn block_tile(
    q: &[f32],
    group: usize,
    t: &Tile,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
    scratch: &mut Scratch,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx512_block::attend_tile;
        let hd = q.len() / state.len();
        let (ends, k, v) = (t.ends, t.k, t.v);
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
    let _ = (q, group, t, scale, state, acc, scratch);
}

/// Every row of a block over one tile of keys (`a.runs`; `t0` is the tile's first
/// key), each up to its own limit.
fn rows_over_tile(isa: Isa, a: &Attend, t0: usize, state: &mut [(f32, f32)], acc: &mut [f32]) {
    let rows = a.keys.len();
    let (group, width) = (state.len() / rows, a.q.len() / rows);
    let t1 = t0 + a.runs.iter().map(|r| r.n).sum::<usize>();
    let mut cut = Vec::with_capacity(a.runs.len());
    for r in 0..rows {
        let end = a.keys[r].min(t1);
        if end <= t0 {
            continue;
        }
        let these = if end == t1 {
            a.runs
        } else {
            slice_runs(a.runs, 0, end - t0, a.stride, &mut cut);
            &cut[..]
        };
        let c = Attend {
            q: &a.q[r * width..(r + 1) * width],
            runs: these,
            ahead: &[],
            ..*a
        };
        let (st, ac) = (r * group..(r + 1) * group, r * width..(r + 1) * width);
        super::attend_row(isa, isa.f16_attention(), &c, &mut state[st], &mut acc[ac]);
    }
}

/// The K and V rows of `runs` (f16 or 8-bit, `hd` values each, `stride` apart) as f32
/// rows back to back in `k` and `v`.
fn widen_tile(runs: &[KvRun], stride: usize, hd: usize, k: &mut Vec<f32>, v: &mut Vec<f32>) {
    k.clear();
    v.clear();
    for run in runs {
        for (rows, out) in [(run.k, &mut *k), (run.v, &mut *v)] {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: only called where the AVX-512 kernel runs, which `detect` checked.
            unsafe {
                match rows {
                    KvRows::Q8 { q, d, .. } => {
                        super::avx512_attend::widen_rows_q8(q, d, run.n, stride, hd, out)
                    }
                    KvRows::F16(x) => super::avx512_attend::widen_rows(x, run.n, stride, hd, out),
                    KvRows::F32(_) => unreachable!("f32 rows are not widened"),
                }
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
