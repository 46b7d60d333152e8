//! How one layer's attention over a step is cut into work: blocks of rows, units of
//! (block, KV heads, key chunk), each thread's share of the units, the partial states'
//! places, and the keys a decode unit asks for ahead. Pure functions of the rows, their
//! sequences' page sizes, the head layout, the window and the thread count: no kernel
//! and no K/V here, so the rules are unit-tested on their own.
//!
//! The cut points of a row's keys depend only on its position ([`SPLIT_KEYS`], and the
//! window's first key): never on the batch, the block or the threads. That is what
//! makes a row's output the same bits whatever else runs in the step.

use super::{HEADS_TOGETHER_KEYS, ROW_BLOCK, SPLIT_KEYS};

/// Rows in a step from which a decode row runs every KV head in one unit (as a long
/// one does), asking for the next unit's keys while it runs: the rows alone give the
/// threads enough units.
const DECODE_ROWS_TOGETHER: usize = 8;

/// One (block of rows, KV heads, key chunk) piece of work: all query heads of KV heads
/// `h0..h1`, for the block's rows `r0..r1` that reach the chunk (those before `r0` end
/// before it; with a window, those from `r1` on start after it), keys `k0..k1` (each
/// row from its own first key, [`first_key`], where that is later). Its partial states start at `off` in the partial buffer:
/// per KV head, per row, per query head of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unit {
    pub r0: u32,
    pub r1: u32,
    pub h0: u32,
    pub h1: u32,
    pub k0: u32,
    pub k1: u32,
    pub off: usize,
}

impl Unit {
    /// Rows of the unit.
    pub fn rows(&self) -> usize {
        (self.r1 - self.r0) as usize
    }

    /// KV heads of the unit.
    pub fn heads(&self) -> usize {
        (self.h1 - self.h0) as usize
    }
}

/// What the plan is cut from besides the rows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub n_kv_heads: usize,
    /// Floats of one query head's partial state: [max, sum, acc(head_dim)].
    pub state: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// A query at position `p` sees keys `p + 1 - w ..= p` only.
    pub window: Option<usize>,
    /// Threads that run the units.
    pub threads: usize,
}

/// The first key a row at `pos` sees: 0, or the start of its window.
pub(super) fn first_key(window: Option<usize>, pos: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// A layer's attention work for one step.
#[derive(Debug)]
pub(super) struct Plan {
    pub units: Vec<Unit>,
    /// Each row's block's units (`units[a..b]`).
    pub block_units: Vec<(usize, usize)>,
    /// Floats of partial state all units leave.
    pub partial_len: usize,
    /// Thread `t` owns `units[bounds[t]..bounds[t + 1]]`.
    pub bounds: Vec<usize>,
    /// The window the rows see keys through ([`Shape::window`]).
    pub window: Option<usize>,
}

impl Plan {
    /// The plan for `rows` (`rows[r] = (seq, pos)`; a sequence's rows at consecutive
    /// positions are adjacent), sequence `s` stored in pages of `page_size(s)` slots.
    pub fn new(rows: &[(usize, usize)], page_size: impl Fn(usize) -> usize, s: Shape) -> Self {
        let (units, block_units, partial_len) = units(rows, page_size, s);
        let bounds = split(&units, rows, s.threads);
        Plan {
            units,
            block_units,
            partial_len,
            bounds,
            window: s.window,
        }
    }

    /// Threads that get units (`bounds.len() - 1`).
    pub fn threads(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Thread `t`'s units.
    pub fn owned(&self, t: usize) -> &[Unit] {
        &self.units[self.bounds[t]..self.bounds[t + 1]]
    }

    /// Where thread `t`'s partial states start (its units' are contiguous).
    pub fn partial_start(&self, t: usize) -> usize {
        let i = self.bounds[t];
        self.units.get(i).map_or(self.partial_len, |u| u.off)
    }

    /// The keys (sequence, from, to) the `i`th unit of thread `owner`, a one-row
    /// unit running its KV heads together over pieces of [`HEADS_TOGETHER_KEYS`], asks
    /// for while it computes the piece ending at `t1`: its row's next piece (past its
    /// chunk too), or at its row's last piece the first piece of the owner's next unit
    /// where that is one row too (a batch of decodes: each row's keys are elsewhere in
    /// the pool, and were read from memory cold). An empty range where neither is.
    pub fn ahead(&self, rows: &[(usize, usize)], owner: usize, i: usize, t1: usize) -> Ahead {
        let u = &self.owned(owner)[i];
        let (seq, pos) = rows[u.r0 as usize];
        let t2 = (t1 + HEADS_TOGETHER_KEYS).min(pos + 1);
        if t2 > t1 {
            return Ahead {
                seq,
                from: t1,
                to: t2,
            };
        }
        let next = self.owned(owner).get(i + 1).filter(|v| v.rows() == 1);
        match next {
            Some(v) => Ahead {
                seq: rows[v.r0 as usize].0,
                from: v.k0 as usize,
                to: (v.k0 as usize + HEADS_TOGETHER_KEYS).min(v.k1 as usize),
            },
            None => Ahead {
                seq,
                from: t1,
                to: t1,
            },
        }
    }
}

/// Keys of one sequence a unit asks for ahead ([`Plan::ahead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ahead {
    pub seq: usize,
    pub from: usize,
    pub to: usize,
}

/// The units of every block, each row's block's units, and the partial states' length.
/// Which KV heads a unit covers changes no bits (heads are independent), so it is
/// chosen for speed: for a decode row over pages, one unit per chunk with every head
/// (whole K/V rows read once) where there are enough chunks or rows to keep the
/// threads busy, else one per head.
fn units(
    rows: &[(usize, usize)],
    page_size: impl Fn(usize) -> usize,
    s: Shape,
) -> (Vec<Unit>, Vec<(usize, usize)>, usize) {
    let first = |pos: usize| first_key(s.window, pos);
    let stride = s.group * s.state;
    let mut units = Vec::new();
    let mut block_units = Vec::with_capacity(rows.len());
    let mut off = 0;
    let mut b0 = 0;
    while b0 < rows.len() {
        let first_unit = units.len();
        let b1 = block_end(rows, b0, ROW_BLOCK);
        let last = rows[b1 - 1].1;
        // The block's first row's keys start at `lo`, the others' (with a window) later.
        let lo = first(rows[b0].1);
        let n_chunks = last / SPLIT_KEYS - lo / SPLIT_KEYS + 1;
        // Only over pages shorter than a chunk: K/V in one contiguous run (the dense
        // cache) streams best one head at a time (measured: docs/BENCHMARKS.md,
        // attention).
        let paged = page_size(rows[b0].0) < SPLIT_KEYS;
        // Enough units either way where the step has many rows (a batch of decodes).
        let many = n_chunks >= s.threads || rows.len() >= DECODE_ROWS_TOGETHER;
        let per = if b1 - b0 == 1 && paged && many {
            s.n_kv_heads
        } else {
            1
        };
        for h0 in (0..s.n_kv_heads).step_by(per) {
            let h1 = (h0 + per).min(s.n_kv_heads);
            for k0 in (lo - lo % SPLIT_KEYS..=last).step_by(SPLIT_KEYS) {
                // The rows that reach this chunk: those that end in it or later, and
                // (with a window) start before its end.
                let k1 = (k0 + SPLIT_KEYS).min(last + 1);
                let r0 = (b0..b1).find(|&r| rows[r].1 >= k0).unwrap_or(b1);
                let r1 = (r0..b1).find(|&r| first(rows[r].1) >= k1).unwrap_or(b1);
                units.push(Unit {
                    r0: r0 as u32,
                    r1: r1 as u32,
                    h0: h0 as u32,
                    h1: h1 as u32,
                    k0: k0.max(lo) as u32,
                    k1: k1 as u32,
                    off,
                });
                off += (r1 - r0) * (h1 - h0) * stride;
            }
        }
        block_units.extend((b0..b1).map(|_| (first_unit, units.len())));
        b0 = b1;
    }
    (units, block_units, off)
}

/// The end of the block that starts at row `b0`: up to `most` rows of one sequence at
/// consecutive positions.
fn block_end(rows: &[(usize, usize)], b0: usize, most: usize) -> usize {
    let mut b1 = b0 + 1;
    while b1 < rows.len()
        && b1 - b0 < most
        && rows[b1].0 == rows[b0].0
        && rows[b1].1 == rows[b1 - 1].1 + 1
    {
        b1 += 1;
    }
    b1
}

/// The keys a unit's rows read, times its heads: its work.
fn work(u: &Unit, rows: &[(usize, usize)]) -> u64 {
    (u.r0..u.r1)
        .map(|r| (rows[r as usize].1 + 1).min(u.k1 as usize) as u64 - u64::from(u.k0))
        .sum::<u64>()
        * u64::from(u.h1 - u.h0)
}

/// Contiguous runs of units with about equal work each, one per thread (at most one
/// per unit): thread `t` owns `units[bounds[t]..bounds[t + 1]]`.
fn split(units: &[Unit], rows: &[(usize, usize)], threads: usize) -> Vec<usize> {
    let threads = threads.min(units.len()).max(1);
    let total: u64 = units.iter().map(|u| work(u, rows)).sum();
    let mut bounds = vec![0usize];
    let mut acc = 0u64;
    for (i, u) in units.iter().enumerate() {
        acc += work(u, rows);
        if bounds.len() < threads && acc * threads as u64 >= total * bounds.len() as u64 {
            bounds.push(i + 1);
        }
    }
    while bounds.len() <= threads {
        bounds.push(units.len());
    }
    bounds
}
