//! Paged attention: every query row of a ragged batch attends over its own sequence's
//! K/V, read page run by page run from a [`KvStorage`] through the pages its
//! [`Batch`] step names, with no dense copy of the history. Causal by position: the row at position `p` reads keys `0..=p`.
//!
//! Work is split into units of (block of rows, KV heads, key chunk): the query heads that
//! share a KV head run together, so each key is loaded once for all of them (and a
//! decode row with enough chunks, or in a step of many rows, runs every KV head in one
//! unit, piece by piece, so each page's rows are read whole, once, in order, the next
//! piece, or the next unit's first, asked for into L2 while this one is computed); up to
//! [`ROW_BLOCK`] rows of one sequence at consecutive positions (a prefill) go through
//! each tile of keys together, so each page is read from memory once per block; and a
//! query's keys are cut into chunks of [`SPLIT_KEYS`] (split-K), so one long decode
//! spreads over every thread.
//! The cut points depend only on the position, never on the batch or the thread count,
//! and each unit's reduction runs keys in order; the chunks' partial softmax states are
//! then combined in chunk order. So a row's output is the same bits whatever else runs
//! in the step, whichever rows share its block and however many threads run it.
//!
//! NOTE: on the scalar and AVX2 paths the arithmetic is that of llama.cpp's CPU flash
//! attention (its default): the query rounded to f16, an online softmax over the keys
//! in order, and the value accumulator kept in f16; up to [`SPLIT_KEYS`] keys there is
//! one chunk and the result is exactly llama.cpp's AVX2 build's. The AVX-512 path, whose
//! matmuls keep no llama.cpp bits anyway, keeps the value accumulator in f32
//! (`Isa::f16_attention`): ~1.45x faster per (query, key) pair (6.8-7.9 against
//! 10.6-12.0 ns at 2k-8k), and as near the exact model (`tests/it/fidelity_f64.rs`).
//! Without the query's f16 rounding too, the largest |Δ logprob| from the exact model
//! rose past llama.cpp's (1.12 against 0.996), so the query keeps it. That path's
//! decode kernel (`kernels::avx512_attend`) holds a group's queries and accumulators in
//! zmm registers; its prefill kernel (`kernels::avx512_block`) runs a whole block of
//! rows over each tile of keys widened to f32 once, scores and softmax sixteen queries
//! to a vector, with the same bits: prefill 4.1-4.5 against 6.4-6.9 ns per pair at 2k-8k
//! on one Zen 4 core, 2.1-2.2 against 3.2-3.8 on two (`benches/attention.rs`, AMD EPYC).

use crate::kernels::pool::WorkList;
use crate::kernels::{self, Isa, ThreadPool};
use crate::kv::{Batch, KvStorage, SeqStep};
use std::sync::Mutex;

/// Keys per split-K chunk.
pub const SPLIT_KEYS: usize = 1024;

/// Attention head layout.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Query rows per block: consecutive positions of one sequence that go through each
/// tile of K/V together (`kernels::attend_block`), so a prefill reads each page once per
/// block instead of once per row (and, on the AVX-512 path, widens each f16 tile once
/// per block). It changes no row's arithmetic. 32 against 16: 6.34-6.54 against
/// 6.62-6.97 ns per pair at 2k-8k, one thread, AMD EPYC avx512 (64: no better).
pub const ROW_BLOCK: usize = 32;

/// One (block of rows, KV heads, key chunk) piece of work: all query heads of KV heads
/// `h0..h1`, for the block's rows `r0..r1` that reach the chunk (those before `r0` end
/// before it). Its partial states start at `off` in the partial buffer: per KV head,
/// per row, per query head of its group.
#[derive(Clone, Copy)]
struct Unit {
    r0: u32,
    r1: u32,
    h0: u32,
    h1: u32,
    k0: u32,
    k1: u32,
    off: usize,
}

/// Keys a unit of several KV heads runs through all of them before going on: the K/V
/// rows of a page hold every KV head side by side, so running the heads together reads
/// whole rows once, in order, instead of a third of each row per pass. While it runs a
/// piece, each head's kernel call asks for a third of the next piece's whole rows into
/// L2 (`kernels::attend_runs_ahead`), spread over its keys, so the next piece is in L2
/// before it starts. Decode at 7.2k tokens of context (AMD EPYC), alternating: 59.4-62.9
/// tok/s with pieces of 128 (57.3-63.3 with 64, 58.9-63.1 with 256, 52.2-56.1 with 512),
/// against 45.2-46.8 with pieces of 512 and no next piece asked for.
const HEADS_TOGETHER_KEYS: usize = 128;

/// Rows in a step from which a decode row runs every KV head in one unit (as a long
/// one does), asking for the next unit's keys while it runs: the rows alone give the
/// threads enough units.
const DECODE_ROWS_TOGETHER: usize = 8;

/// Keys `from..to` of a sequence's step as page runs into `out` (rows of `kv_dim`), each
/// row from element `off` (a KV head's part).
#[allow(clippy::too_many_arguments)]
fn page_runs<'a, S: KvStorage + ?Sized>(
    kv: &'a S,
    step: &SeqStep,
    layer: usize,
    kv_dim: usize,
    from: usize,
    to: usize,
    off: usize,
    out: &mut Vec<kernels::KvRun<'a>>,
) {
    out.clear();
    let mut p = from;
    while p < to {
        let (page, slot) = step.slot(p);
        // The pages after this one that follow it in the pool too: one run where the
        // storage keeps them side by side.
        let (first, last) = (p / step.page_size, (to - 1) / step.page_size);
        let next = |i: usize| step.pages[first + i].0 == page.0.wrapping_add(i as u32);
        let count = 1 + (1..=last - first).take_while(|&i| next(i)).count();
        let (ks, vs) = kv.run_pages(page.0, count, layer, slot);
        let m = (ks.len() / kv_dim).min(to - p);
        out.push(kernels::KvRun {
            k: ks.skip(off),
            v: vs.skip(off),
            n: m,
        });
        p += m;
    }
}

/// How a layer turns query·key products into softmax inputs, and which keys it sees.
#[derive(Debug, Clone, Copy)]
pub struct Scores {
    /// Multiplies every product (1/sqrt(head_dim), or 1 where Q was scaled already).
    pub scale: f32,
    /// Scores become `cap · tanh(score / cap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// A query at position `p` sees keys `p + 1 - w ..= p` only (sliding window).
    pub window: Option<usize>,
}

/// Grouped-query attention of `q` (`rows.len()` rows of `n_heads · head_dim`) into `out`
/// (same shape). `rows[r] = (seq, pos)`: row `r` belongs to sequence `seq` of `batch` and
/// sits at position `pos`, whose K/V (and all before it) are already written to the
/// pages `batch.seqs[seq]` names. Scores scaled by 1/sqrt(head_dim), every key up to
/// the row's own.
#[allow(clippy::too_many_arguments)]
pub fn attention<S: KvStorage + ?Sized>(
    pool: &ThreadPool,
    isa: Isa,
    heads: Heads,
    kv: &S,
    batch: &Batch,
    layer: usize,
    rows: &[(usize, usize)],
    q: &[f32],
    out: &mut [f32],
) {
    let scores = Scores {
        scale: 1.0 / (heads.head_dim as f32).sqrt(),
        softcap: None,
        window: None,
    };
    attention_with(pool, isa, heads, scores, kv, batch, layer, rows, q, out)
}

/// [`attention`] with the layer's own [`Scores`]. With a window each row is a block of
/// its own whose first chunk starts at its window's first key (the later chunks at
/// the fixed cut points), so a row's bits still depend on its position only.
#[allow(clippy::too_many_arguments)]
pub fn attention_with<S: KvStorage + ?Sized>(
    pool: &ThreadPool,
    isa: Isa,
    heads: Heads,
    scores: Scores,
    kv: &S,
    batch: &Batch,
    layer: usize,
    rows: &[(usize, usize)],
    q: &[f32],
    out: &mut [f32],
) {
    let Heads {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
    } = heads;
    let (group, kv_dim, d) = (nh / nkv, nkv * hd, nh * hd);
    // As ggml's flash attention: with a cap, the scale is divided by it before tanh.
    let (scale, cap) = match scores.softcap {
        Some(cap) => (scores.scale / cap, cap),
        None => (scores.scale, 0.0),
    };
    let block_rows = if scores.window.is_some() {
        1
    } else {
        ROW_BLOCK
    };
    // The first key a row at `pos` sees.
    let first = |pos: usize| scores.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    // Each unit leaves, per row and query head of its group, the partial state
    // [max, sum, acc(hd)].
    let stride = group * (hd + 2);
    // Which KV heads a unit covers changes no bits (heads are independent), so it is
    // chosen for speed: for a decode row over pages, one unit per chunk with every head
    // (whole K/V rows read once) where there are enough chunks or rows to keep the
    // threads busy, else one per head.
    let mut units = Vec::new();
    // Each row's block's units (`units[a..b]`).
    let mut block_units = Vec::with_capacity(rows.len());
    let mut off = 0;
    let mut b0 = 0;
    while b0 < rows.len() {
        let first_unit = units.len();
        // A block: up to ROW_BLOCK rows of one sequence at consecutive positions.
        let mut b1 = b0 + 1;
        while b1 < rows.len()
            && b1 - b0 < block_rows
            && rows[b1].0 == rows[b0].0
            && rows[b1].1 == rows[b1 - 1].1 + 1
        {
            b1 += 1;
        }
        let last = rows[b1 - 1].1;
        // With a window the block is one row, whose keys start at `lo`.
        let lo = first(rows[b0].1);
        let n_chunks = last / SPLIT_KEYS - lo / SPLIT_KEYS + 1;
        // Only over pages shorter than a chunk: K/V in one contiguous run (the dense
        // cache) streams best one head at a time, 0.47-0.48 ms against 0.61-0.67 at
        // 8k keys (attention benchmark, AMD EPYC avx512).
        let paged = batch.seqs[rows[b0].0].page_size < SPLIT_KEYS;
        // Enough units either way where the step has many rows (a batch of decodes).
        let many = n_chunks >= pool.parallelism() || rows.len() >= DECODE_ROWS_TOGETHER;
        let per = if b1 - b0 == 1 && paged && many {
            nkv
        } else {
            1
        };
        for h0 in (0..nkv).step_by(per) {
            let h1 = (h0 + per).min(nkv);
            for k0 in (lo - lo % SPLIT_KEYS..=last).step_by(SPLIT_KEYS) {
                // The rows that reach this chunk: a suffix of the block.
                let r0 = (b0..b1).find(|&r| rows[r].1 >= k0).unwrap_or(b1);
                units.push(Unit {
                    r0: r0 as u32,
                    r1: b1 as u32,
                    h0: h0 as u32,
                    h1: h1 as u32,
                    k0: k0.max(lo) as u32,
                    k1: (k0 + SPLIT_KEYS).min(last + 1) as u32,
                    off,
                });
                off += (b1 - r0) * (h1 - h0) * stride;
            }
        }
        block_units.extend((b0..b1).map(|_| (first_unit, units.len())));
        b0 = b1;
    }
    // The work of a unit: the keys its rows read.
    let work = |u: &Unit| -> u64 {
        (u.r0..u.r1)
            .map(|r| (rows[r as usize].1 + 1).min(u.k1 as usize) as u64 - u64::from(u.k0))
            .sum::<u64>()
            * u64::from(u.h1 - u.h0)
    };
    // Contiguous runs of units with about equal keys each.
    let threads = pool.parallelism().min(units.len()).max(1);
    let total: u64 = units.iter().map(work).sum();
    let mut bounds = vec![0usize];
    let mut acc = 0u64;
    for (i, u) in units.iter().enumerate() {
        acc += work(u);
        if bounds.len() < threads && acc * threads as u64 >= total * bounds.len() as u64 {
            bounds.push(i + 1);
        }
    }
    while bounds.len() <= threads {
        bounds.push(units.len());
    }
    let at = |i: usize| units.get(i).map_or(off, |u| u.off);
    let mut partial = vec![0f32; off];
    let mut parts: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(threads);
    let mut rest = &mut partial[..];
    for t in 0..threads {
        let (mine, tail) = rest.split_at_mut(at(bounds[t + 1]) - at(bounds[t]));
        parts.push(Mutex::new(mine));
        rest = tail;
    }
    // Each thread runs its own units from the front; one that runs out takes the others'
    // from the back (a unit's result does not depend on who computes it).
    let lists: Vec<WorkList> = (0..threads)
        .map(|t| WorkList::new(bounds[t + 1] - bounds[t]))
        .collect();
    pool.run(&|t| {
        if t >= threads {
            return;
        }
        let mut qh = vec![Vec::with_capacity(ROW_BLOCK * group * hd); nkv];
        let mut acc = vec![0f32; ROW_BLOCK * nkv * group * hd];
        let mut state = vec![(0f32, 0f32); ROW_BLOCK * nkv * group];
        let mut keys = Vec::with_capacity(ROW_BLOCK);
        let (mut runs, mut ahead) = (Vec::new(), Vec::new());
        let mut unit = |owner: usize, i: usize| {
            let u = &units[bounds[owner] + i];
            let (r0, r1) = (u.r0 as usize, u.r1 as usize);
            let (h0, h1) = (u.h0 as usize, u.h1 as usize);
            let (n, w, nh) = (r1 - r0, group * hd, h1 - h0);
            let step = &batch.seqs[rows[r0].0];
            let f16 = {
                let (page, slot) = step.slot(u.k0 as usize);
                matches!(kv.run(page.0, layer, slot).0, kernels::KvRows::F16(_))
            };
            // The group's query heads are adjacent in the row. With f16 K/V the queries
            // are rounded to f16 too, as llama.cpp does.
            for kh in h0..h1 {
                let qh = &mut qh[kh];
                qh.clear();
                for r in r0..r1 {
                    let qs = &q[r * d + kh * w..r * d + (kh + 1) * w];
                    if f16 {
                        kernels::round_f16_into(isa, qs, qh);
                    } else {
                        qh.extend_from_slice(qs);
                    }
                }
            }
            let (state, acc) = (&mut state[..nh * n * group], &mut acc[..nh * n * w]);
            state.fill((f32::NEG_INFINITY, 0.0));
            acc.fill(0.0);
            // One head at a time over the whole chunk, or, with several heads, every
            // head over each piece of keys in turn.
            let together = nh > 1 && n == 1;
            let piece = if together {
                HEADS_TOGETHER_KEYS
            } else {
                SPLIT_KEYS
            };
            let mut t0 = u.k0 as usize;
            while t0 < u.k1 as usize {
                let t1 = (t0 + piece).min(u.k1 as usize);
                keys.clear();
                keys.extend((r0..r1).map(|r| (rows[r].1 + 1).min(t1).saturating_sub(t0)));
                let heads = qh[h0..h1]
                    .iter()
                    .zip(state.chunks_exact_mut(n * group))
                    .zip(acc.chunks_exact_mut(n * w));
                // A decode row's next piece (its row's keys past this unit's chunk
                // too: the next unit is most likely this thread's), asked for while
                // this one is computed, a share per head.
                let fetch = together && cap == 0.0;
                let t2 = if fetch {
                    (t1 + piece).min(rows[r0].1 + 1)
                } else {
                    t1
                };
                // At the row's last piece, the first piece of this thread's next unit
                // where that is a decode row too (a batch of decodes: each row's keys
                // are elsewhere in the pool, and were read from memory cold).
                let next = (fetch && t2 == t1)
                    .then(|| units[bounds[owner] + i + 1..bounds[owner + 1]].first())
                    .flatten()
                    .filter(|v| v.r1 - v.r0 == 1)
                    .map(|v| {
                        let k1 = (v.k0 as usize + piece).min(v.k1 as usize);
                        (&batch.seqs[rows[v.r0 as usize].0], v.k0 as usize, k1)
                    });
                for (j, ((qk, st), ac)) in heads.enumerate() {
                    // The piece's keys as page runs, then one kernel call over them all.
                    let off = (h0 + j) * hd;
                    page_runs(kv, step, layer, kv_dim, t0, t1, off, &mut runs);
                    if fetch {
                        let (st2, a0, b0) = next.unwrap_or((step, t1, t2));
                        let (a, b) = (a0 + (b0 - a0) * j / nh, a0 + (b0 - a0) * (j + 1) / nh);
                        page_runs(kv, st2, layer, kv_dim, a, b, 0, &mut ahead);
                        let (q, r) = (&qk[..], &runs[..]);
                        kernels::attend_runs_ahead(isa, q, r, &ahead, kv_dim, scale, st, ac);
                    } else {
                        kernels::attend_block(isa, qk, &keys, &runs, kv_dim, scale, cap, st, ac);
                    }
                }
                t0 = t1;
            }
            let mut part = parts[owner].lock().unwrap_or_else(|e| e.into_inner());
            let base = u.off - at(bounds[owner]);
            let out = part[base..base + nh * n * stride].chunks_exact_mut(hd + 2);
            for ((o, st), a) in out.zip(state.iter()).zip(acc.chunks_exact(hd)) {
                o[0] = st.0;
                o[1] = st.1;
                o[2..].copy_from_slice(a);
            }
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
    drop(parts);
    // Combine each (row, head)'s chunks in order, rows split over the threads from a
    // few (a decode batch's rows are otherwise serial).
    let out = &mut out[..rows.len() * d];
    pool.rows_mut(out, d, kernels::matmul::BUILD_ROWS, &|r0, out| {
        let mut mine = Vec::new();
        for (r, out) in (r0..).zip(out.chunks_exact_mut(d)) {
            // The units of row r's block, KV heads by KV heads, each its chunks in order.
            let (mut i, end) = block_units[r];
            while i < end {
                let (h0, h1) = (units[i].h0, units[i].h1);
                let mut j = i;
                while j < end && units[j].h0 == h0 {
                    j += 1;
                }
                for kh in h0 as usize..h1 as usize {
                    // The partial states of row r and KV head kh, chunk by chunk: a unit
                    // holds its heads one after another, each with its rows.
                    mine.clear();
                    mine.extend(units[i..j].iter().filter(|u| u.r0 as usize <= r).map(|u| {
                        let rows_in = (u.r1 - u.r0) as usize;
                        u.off + ((kh - h0 as usize) * rows_in + r - u.r0 as usize) * stride
                    }));
                    for g in 0..group {
                        let h = kh * group + g;
                        let part = |c: usize| &partial[c + g * (hd + 2)..][..hd + 2];
                        let mx = mine
                            .iter()
                            .map(|&c| part(c)[0])
                            .fold(f32::NEG_INFINITY, f32::max);
                        let o = &mut out[h * hd..(h + 1) * hd];
                        o.fill(0.0);
                        let mut sum = 0f32;
                        for &c in &mine {
                            let part = part(c);
                            let w = (part[0] - mx).exp();
                            sum += part[1] * w;
                            o.iter_mut().zip(&part[2..]).for_each(|(y, a)| *y += a * w);
                        }
                        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                        o.iter_mut().for_each(|y| *y *= inv);
                    }
                }
                i = j;
            }
        }
    });
}
