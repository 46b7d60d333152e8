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

use super::{Isa, KvRows, KvRun};

/// Keys per tile: K and V of 32 keys of one KV head are 8 KiB in f16 (16 KiB in f32),
/// which stay in L1 while every row of the block reads them.
pub const TILE_KEYS: usize = 32;

/// One call into the attention kernels: what [`attend`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Attend<'a> {
    /// The block's queries: per row, the query heads of one KV head, `head_dim` values
    /// each, rows back to back.
    pub q: &'a [f32],
    /// Row `r` reads the first `keys[r]` keys of `runs` (its causal limit)...
    pub keys: &'a [usize],
    /// ... from key `from[r]` on (the start of its window), or from the first where
    /// `from` is empty.
    pub from: &'a [usize],
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
/// order. `round`: f16 value accumulators ([`Isa::f16_attention`]; the caller passes
/// it only where the path has them). Each query gets the bits the scalar kernel gives
/// it alone over its keys, with that rounding, whatever the block and however the keys
/// are split into runs or calls.
pub fn attend(isa: Isa, round: bool, a: &Attend, state: &mut [(f32, f32)], acc: &mut [f32]) {
    let rows = a.keys.len();
    if rows == 0 {
        return;
    }
    assert!(state.len().is_multiple_of(rows) && a.q.len() == acc.len());
    assert!(a.q.len().is_multiple_of(rows));
    let total: usize = a.runs.iter().map(|r| r.n).sum();
    let most = a.keys.iter().copied().max().unwrap_or(0).min(total);
    let mut tile = Vec::with_capacity(TILE_KEYS + 1);
    if a.from.iter().any(|&f| f > 0) {
        later_starts(isa, round, a, most, state, acc);
        return;
    }
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
        super::attend_row(isa, round, &c, state, acc);
        return;
    }
    block(isa, round, a, most, state, acc);
}

/// [`attend`] for rows that start at different keys (windows): each row alone over its
/// keys before the last row's first, then the block over the rest (each row's keys in
/// order either way, so the same bits as one call per row).
fn later_starts(
    isa: Isa,
    round: bool,
    a: &Attend,
    most: usize,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let rows = a.keys.len();
    assert_eq!(a.from.len(), rows, "a start per row");
    let (group, width) = (state.len() / rows, a.q.len() / rows);
    let common = a.from.iter().copied().max().unwrap_or(0).min(most);
    let mut runs = Vec::new();
    for r in 0..rows {
        let (from, to) = (a.from[r], a.keys[r].min(common));
        if from < to {
            slice_runs(a.runs, from, to, a.stride, &mut runs);
            let one = Attend {
                q: &a.q[r * width..(r + 1) * width],
                keys: &[],
                from: &[],
                runs: &runs,
                ahead: &[],
                ..*a
            };
            let (st, ac) = (r * group..(r + 1) * group, r * width..(r + 1) * width);
            super::attend_row(isa, round, &one, &mut state[st], &mut acc[ac]);
        }
    }
    let keys: Vec<usize> = a
        .keys
        .iter()
        .map(|&k| k.min(most).saturating_sub(common))
        .collect();
    slice_runs(a.runs, common, most, a.stride, &mut runs);
    let rest = Attend {
        keys: &keys,
        from: &[],
        runs: &runs,
        ahead: &[],
        ..*a
    };
    attend(isa, round, &rest, state, acc);
}

/// Which kernel takes a block's tiles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blocked {
    /// Each row alone over each tile (`attend_row`).
    Rows,
    /// The tiles widened to f32 once for the block, then each row alone over them.
    WidenedRows,
    /// The tiles widened, then the AVX-512 block kernel (`avx512_block`).
    Zmm,
    /// The tiles widened, then the AVX2 block kernel (`avx2_block`).
    Ymm,
}

impl Blocked {
    /// The kernel for a block on path `isa` with rounding `round`, head size `hd`, over
    /// keys like `runs`' first (all of a call's runs have one kind) and scores capped
    /// unless `cap` is 0.
    fn pick(isa: Isa, round: bool, hd: usize, runs: &[KvRun], cap: f32) -> Blocked {
        let narrow = runs
            .first()
            .is_some_and(|r| matches!(r.k, KvRows::F16(_) | KvRows::Q8 { .. }));
        if cap != 0.0 || !narrow {
            return Blocked::Rows;
        }
        if super::zmm_attention(isa, round, hd) {
            // The AVX-512 block kernel takes head sizes up to 128 (its accumulators'
            // registers).
            return if hd <= 128 {
                Blocked::Zmm
            } else {
                Blocked::WidenedRows
            };
        }
        if isa.avx2() && !round && super::simd_head(hd) {
            return Blocked::Ymm;
        }
        Blocked::Rows
    }
}

/// [`attend`] for a block of several rows, over its first `most` keys.
fn block(
    isa: Isa,
    round: bool,
    a: &Attend,
    most: usize,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let rows = a.keys.len();
    let (group, width) = (state.len() / rows, a.q.len() / rows);
    let hd = width / group;
    let mut tile = Vec::with_capacity(TILE_KEYS + 1);
    // Where a block kernel runs, each tile of f16 or 8-bit keys and values is widened
    // to f32 once for the whole block: the same values (the conversion is exact, `q · d`
    // for 8-bit rows) for every row, whose kernel then reads them without converting
    // again.
    let kernel = Blocked::pick(isa, round, hd, a.runs, a.cap);
    let (mut k32, mut v32) = (Vec::new(), Vec::new());
    let (mut ends, mut scratch) = (Vec::with_capacity(rows), Scratch::default());
    match kernel {
        Blocked::Zmm => scratch.transpose(a.q, hd, 16),
        Blocked::Ymm => scratch.transpose_by_vector(a.q, hd, 8),
        _ => {}
    }
    let mut t0 = 0;
    while t0 < most {
        let t1 = (t0 + TILE_KEYS).min(most);
        slice_runs(a.runs, t0, t1, a.stride, &mut tile);
        if kernel == Blocked::Rows {
            let a = Attend { runs: &tile, ..*a };
            rows_over_tile(isa, round, &a, t0, state, acc);
        } else {
            widen_tile(kernel, &tile, a.stride, hd, &mut k32, &mut v32);
            let (k, v) = (&k32[..], &v32[..]);
            if kernel == Blocked::WidenedRows {
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
                rows_over_tile(isa, round, &a, t0, state, acc);
            } else {
                ends.clear();
                ends.extend(a.keys.iter().map(|&n| n.min(t1).saturating_sub(t0)));
                let tile = Tile { k, v, ends: &ends };
                block_tile(kernel, a.q, group, &tile, a.scale, state, acc, &mut scratch);
            }
        }
        t0 = t1;
    }
}

/// Scratch a block keeps across its tiles: its queries transposed; the (query, key)
/// scores, then their exponentials, with queries padded to whole vectors
/// (`[key][query]`); which keys raise each query's maximum (one mask per key and
/// vector, and a zero word after); each query's key count in this tile.
#[derive(Default)]
pub(super) struct Scratch {
    pub qt: Vec<f32>,
    pub e: Vec<f32>,
    pub raise: Vec<u16>,
    pub ends: Vec<i32>,
}

impl Scratch {
    /// Takes a block's queries (`q`: `hd` values each, back to back) transposed, for
    /// every tile of the block: element `d` of query `i` at `d * width + i`, `width`
    /// the query count padded to whole vectors of `lanes` (padding lanes 0).
    pub fn transpose(&mut self, q: &[f32], hd: usize, lanes: usize) {
        let nq = q.len() / hd;
        let width = lanes * nq.div_ceil(lanes);
        self.qt.clear();
        self.qt.resize(hd * width, 0.0);
        for (i, row) in q.chunks_exact(hd).enumerate() {
            for (d, &x) in row.iter().enumerate() {
                self.qt[d * width + i] = x;
            }
        }
    }

    /// Takes a block's queries transposed vector by vector: the `lanes` queries of
    /// vector `v` as `hd` vectors in a row, element `d` of query `v * lanes + l` at
    /// `(v * hd + d) * lanes + l` (padding lanes 0): a kernel reads a vector's elements
    /// at fixed offsets from one pointer.
    pub fn transpose_by_vector(&mut self, q: &[f32], hd: usize, lanes: usize) {
        let nq = q.len() / hd;
        self.qt.clear();
        self.qt.resize(hd * lanes * nq.div_ceil(lanes), 0.0);
        for (i, row) in q.chunks_exact(hd).enumerate() {
            let (v, l) = (i / lanes, i % lanes);
            for (d, &x) in row.iter().enumerate() {
                self.qt[(v * hd + d) * lanes + l] = x;
            }
        }
    }
}

/// One tile of keys widened to f32 (`k`, `v`: its rows back to back), row `r` of the
/// block reading its first `ends[r]`.
struct Tile<'a> {
    k: &'a [f32],
    v: &'a [f32],
    ends: &'a [usize],
}

/// Every row of a block over one widened tile, by the block kernel `kernel` (`scratch`
/// holds the block's queries transposed). Only called where that kernel runs.
#[allow(clippy::too_many_arguments)]
fn block_tile(
    kernel: Blocked,
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
        use super::avx2_block as ymm;
        use super::avx512_block as zmm;
        let hd = q.len() / state.len();
        let (ends, k, v, s) = (t.ends, t.k, t.v, scratch);
        // SAFETY: `Blocked::Zmm` is picked only where `detect` ran the AVX-512 path,
        // `Blocked::Ymm` only on the AVX2 path or one above it.
        unsafe {
            match (kernel, hd / 32) {
                // (head size / 32, queries whose accumulators fit in registers).
                (Blocked::Zmm, 1) => {
                    zmm::attend_tile::<1, 12>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Zmm, 2) => {
                    zmm::attend_tile::<2, 6>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Zmm, 3) => {
                    zmm::attend_tile::<3, 4>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Zmm, 4) => {
                    zmm::attend_tile::<4, 3>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 1) => {
                    ymm::attend_tile::<1>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 2) => {
                    ymm::attend_tile::<2>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 3) => {
                    ymm::attend_tile::<3>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 4) => {
                    ymm::attend_tile::<4>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 5) => {
                    ymm::attend_tile::<5>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 6) => {
                    ymm::attend_tile::<6>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 7) => {
                    ymm::attend_tile::<7>(q, group, ends, k, v, scale, state, acc, s)
                }
                (Blocked::Ymm, 8) => {
                    ymm::attend_tile::<8>(q, group, ends, k, v, scale, state, acc, s)
                }
                _ => unreachable!("head size {hd}: no block kernel"),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kernel, q, group, t, scale, state, acc, scratch);
}

/// Every row of a block over one tile of keys (`a.runs`; `t0` is the tile's first
/// key), each up to its own limit.
fn rows_over_tile(
    isa: Isa,
    round: bool,
    a: &Attend,
    t0: usize,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
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
            from: &[],
            ..*a
        };
        let (st, ac) = (r * group..(r + 1) * group, r * width..(r + 1) * width);
        super::attend_row(isa, round, &c, &mut state[st], &mut acc[ac]);
    }
}

/// The K and V rows of `runs` (f16 or 8-bit, `hd` values each, `stride` apart) as f32
/// rows back to back in `k` and `v`, by the widening of `kernel`'s path.
fn widen_tile(
    kernel: Blocked,
    runs: &[KvRun],
    stride: usize,
    hd: usize,
    k: &mut Vec<f32>,
    v: &mut Vec<f32>,
) {
    k.clear();
    v.clear();
    for run in runs {
        for (rows, out) in [(run.k, &mut *k), (run.v, &mut *v)] {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `kernel` is a widening one only where its path runs, which
            // `detect` checked (AVX-512 for `Zmm` and `WidenedRows`, AVX2 for `Ymm`).
            unsafe {
                use super::{avx2_block as ymm, avx512_attend as zmm};
                let n = run.n;
                match (rows, kernel == Blocked::Ymm) {
                    (KvRows::Q8 { q, d, .. }, false) => {
                        zmm::widen_rows_q8(q, d, n, stride, hd, out)
                    }
                    (KvRows::Q8 { q, d, .. }, true) => ymm::widen_rows_q8(q, d, n, stride, hd, out),
                    (KvRows::F16(x), false) => zmm::widen_rows(x, n, stride, hd, out),
                    (KvRows::F16(x), true) => ymm::widen_rows(x, n, stride, hd, out),
                    (KvRows::F32(_), _) => unreachable!("f32 rows are not widened"),
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (kernel, rows, out);
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
