//! Running a [`Plan`]'s units: each thread takes its own units from the front, then
//! the others' from the back (a unit's result does not depend on who computes it),
//! and leaves each unit's partial softmax states in its place of the partial buffer.
//! A unit's keys go to the kernels through [`kernels::attend`] as page runs, whole
//! chunk at a time, or (a decode row running its KV heads together) piece by piece
//! with the next piece asked for ahead.

use super::plan::{first_key, Plan, Unit};
use super::{AttentionStep, HEADS_TOGETHER_KEYS, ROW_BLOCK, SPLIT_KEYS};
use crate::kernels::pool::WorkList;
use crate::kernels::{self, Attend, Cpu, KvRun};
use crate::kv::{KvStorage, SeqStep};
use std::sync::Mutex;

/// Runs every unit of `plan` on `cpu`'s threads; `partial` gets each unit's states.
pub(super) fn run_units(
    cpu: &Cpu,
    at: &AttentionStep,
    plan: &Plan,
    q: &[f32],
    scale: Scale,
    partial: &mut [f32],
) {
    let threads = plan.threads();
    let mut parts: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(threads);
    let mut rest = partial;
    for t in 0..threads {
        let len = plan.partial_start(t + 1) - plan.partial_start(t);
        let (mine, tail) = rest.split_at_mut(len);
        parts.push(Mutex::new(mine));
        rest = tail;
    }
    let lists: Vec<WorkList> = (0..threads)
        .map(|t| WorkList::new(plan.owned(t).len()))
        .collect();
    cpu.pool().run(&|t| {
        if t >= threads {
            return;
        }
        let mut w = Worker::new(cpu, at, plan, q, scale);
        let mut unit = |owner: usize, i: usize| {
            w.unit(owner, i);
            let u = &plan.owned(owner)[i];
            let mut part = parts[owner].lock().unwrap_or_else(|e| e.into_inner());
            let base = u.off - plan.partial_start(owner);
            w.store(u, &mut part[base..]);
        };
        while let Some(i) = lists[t].pop_front() {
            unit(t, i);
        }
        for o in (1..threads).map(|o| (t + o) % threads) {
            while let Some(i) = lists[o].pop_back() {
                unit(o, i);
            }
        }
    });
}

/// The scores' scale and cap as the kernels take them ([`Attend::scale`],
/// [`Attend::cap`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scale {
    pub scale: f32,
    pub cap: f32,
}

/// One thread's buffers and what it reads.
struct Worker<'a> {
    cpu: &'a Cpu,
    at: &'a AttentionStep<'a>,
    plan: &'a Plan,
    q: &'a [f32],
    scale: Scale,
    /// Each KV head's queries for the unit's rows (rounded to f16 over f16 K/V, rotated
    /// over 8-bit K/V).
    qh: Vec<Vec<f32>>,
    /// Whether the unit's K/V is 8-bit, stored rotated (`kernels::kv_rows`): its
    /// queries are rotated the same way and its accumulators rotated back.
    rotated: bool,
    acc: Vec<f32>,
    state: Vec<(f32, f32)>,
    keys: Vec<usize>,
    from: Vec<usize>,
    runs: Vec<KvRun<'a>>,
    ahead: Vec<KvRun<'a>>,
}

impl<'a> Worker<'a> {
    fn new(
        cpu: &'a Cpu,
        at: &'a AttentionStep<'a>,
        plan: &'a Plan,
        q: &'a [f32],
        scale: Scale,
    ) -> Self {
        let h = at.heads;
        let group = h.n_heads / h.n_kv_heads;
        Worker {
            cpu,
            at,
            plan,
            q,
            scale,
            qh: vec![Vec::with_capacity(ROW_BLOCK * group * h.head_dim); h.n_kv_heads],
            rotated: false,
            acc: vec![0f32; ROW_BLOCK * h.n_heads * h.head_dim],
            state: vec![(0f32, 0f32); ROW_BLOCK * h.n_heads],
            keys: Vec::with_capacity(ROW_BLOCK),
            from: Vec::with_capacity(ROW_BLOCK),
            runs: Vec::new(),
            ahead: Vec::new(),
        }
    }

    /// Runs thread `owner`'s `i`th unit into `self.state` and `self.acc`.
    fn unit(&mut self, owner: usize, i: usize) {
        let (u, at) = (self.plan.owned(owner)[i], self.at);
        let (rows, h) = (at.rows, at.heads);
        let (r0, r1, h0, h1) = (u.r0 as usize, u.r1 as usize, u.h0 as usize, u.h1 as usize);
        let (n, nh) = (r1 - r0, h1 - h0);
        let group = h.n_heads / h.n_kv_heads;
        let w = group * h.head_dim;
        let step = &at.batch.seqs[rows[r0].0];
        self.queries(step, &u);
        let state = &mut self.state[..nh * n * group];
        let acc = &mut self.acc[..nh * n * w];
        state.fill((f32::NEG_INFINITY, 0.0));
        acc.fill(0.0);
        // One head at a time over the whole chunk, or, with several heads, every head
        // over each piece of keys in turn.
        let together = nh > 1 && n == 1;
        let piece = if together {
            HEADS_TOGETHER_KEYS
        } else {
            SPLIT_KEYS
        };
        let fetch = together && self.scale.cap == 0.0;
        let kv_dim = h.n_kv_heads * h.head_dim;
        let mut t0 = u.k0 as usize;
        while t0 < u.k1 as usize {
            let t1 = (t0 + piece).min(u.k1 as usize);
            // Each row's keys of the piece: from its first (with a window, rows after
            // the block's first start later) to its position.
            self.keys.clear();
            (self.keys).extend((r0..r1).map(|r| (rows[r].1 + 1).min(t1).saturating_sub(t0)));
            self.from.clear();
            if let Some(w) = self.plan.window {
                let first = |r: usize| first_key(Some(w), rows[r].1);
                (self.from).extend((r0..r1).map(|r| first(r).max(t0) - t0));
            }
            let ahead = fetch.then(|| self.plan.ahead(rows, owner, i, t1));
            let heads = (self.qh[h0..h1].iter())
                .zip(state.chunks_exact_mut(n * group))
                .zip(acc.chunks_exact_mut(n * w));
            for (j, ((q, st), ac)) in heads.enumerate() {
                // The piece's keys as page runs, then one kernel call over them all.
                let off = (h0 + j) * h.head_dim;
                page_runs(at, step, t0..t1, off, &mut self.runs);
                self.ahead.clear();
                if let Some(a) = ahead {
                    // A share of the keys asked for ahead per head.
                    let len = a.to - a.from;
                    let (x, y) = (a.from + len * j / nh, a.from + len * (j + 1) / nh);
                    page_runs(at, &at.batch.seqs[a.seq], x..y, 0, &mut self.ahead);
                }
                let call = Attend {
                    q,
                    from: &self.from,
                    keys: &self.keys,
                    runs: &self.runs,
                    ahead: &self.ahead,
                    stride: kv_dim,
                    scale: self.scale.scale,
                    cap: self.scale.cap,
                };
                self.cpu.attend(&call, st, ac);
            }
            t0 = t1;
        }
    }

    /// Each of the unit's KV heads' query heads for its rows (adjacent in the row),
    /// rounded to f16 over f16 K/V, as llama.cpp does; rotated as the K rows are over
    /// 8-bit K/V (`(Hq)·(Hk) = q·k`).
    fn queries(&mut self, step: &SeqStep, u: &Unit) {
        let h = self.at.heads;
        let w = h.n_heads / h.n_kv_heads * h.head_dim;
        let d = h.n_heads * h.head_dim;
        let (f16, q8) = {
            let (page, slot) = step.slot(u.k0 as usize);
            let rows = self.at.kv.run(page.0, self.at.layer, slot).0;
            (
                matches!(rows, kernels::KvRows::F16(_)),
                matches!(rows, kernels::KvRows::Q8 { .. }),
            )
        };
        self.rotated = q8;
        for kh in u.h0 as usize..u.h1 as usize {
            let qh = &mut self.qh[kh];
            qh.clear();
            for r in u.r0 as usize..u.r1 as usize {
                let qs = &self.q[r * d + kh * w..r * d + (kh + 1) * w];
                if f16 {
                    kernels::round_f16_into(self.cpu.isa(), qs, qh);
                } else {
                    qh.extend_from_slice(qs);
                }
            }
            if q8 {
                kernels::rotate_heads(qh, h.head_dim);
            }
        }
    }

    /// The unit's partial states, [max, sum, acc] per (KV head, row, query head), from
    /// the start of `out`; over 8-bit K/V the accumulators rotated back (`Σ p·Hv =
    /// H Σ p·v`, `H` its own inverse).
    fn store(&self, u: &Unit, out: &mut [f32]) {
        let hd = self.at.heads.head_dim;
        let n = u.heads() * u.rows() * (self.at.heads.n_heads / self.at.heads.n_kv_heads);
        let out = out[..n * (hd + 2)].chunks_exact_mut(hd + 2);
        for ((o, st), a) in out.zip(&self.state[..n]).zip(self.acc.chunks_exact(hd)) {
            o[0] = st.0;
            o[1] = st.1;
            o[2..].copy_from_slice(a);
            if self.rotated {
                kernels::rotate_heads(&mut o[2..], hd);
            }
        }
    }
}

/// Keys `range` of a sequence's step as page runs into `out` (rows of `kv_dim`), each
/// row from element `off` (a KV head's part).
fn page_runs<'a>(
    at: &AttentionStep<'a>,
    step: &SeqStep,
    range: std::ops::Range<usize>,
    off: usize,
    out: &mut Vec<KvRun<'a>>,
) {
    let kv: &'a dyn KvStorage = at.kv;
    let kv_dim = at.heads.n_kv_heads * at.heads.head_dim;
    let (from, to) = (range.start, range.end);
    out.clear();
    let mut p = from;
    while p < to {
        let (page, slot) = step.slot(p);
        // The pages after this one that follow it in the pool too: one run where the
        // storage keeps them side by side.
        let (first, last) = (p / step.page_size, (to - 1) / step.page_size);
        let next = |i: usize| step.pages[first + i].0 == page.0.wrapping_add(i as u32);
        let count = 1 + (1..=last - first).take_while(|&i| next(i)).count();
        let (ks, vs) = kv.run_pages(page.0, count, at.layer, slot);
        let m = (ks.len() / kv_dim).min(to - p);
        out.push(KvRun {
            k: ks.skip(off),
            v: vs.skip(off),
            n: m,
        });
        p += m;
    }
}
