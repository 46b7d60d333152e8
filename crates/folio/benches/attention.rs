//! Attention for one decode query (the default model's shape: 9 query heads over 3 KV
//! heads of 64, pages of a 30-layer pool) at 512, 2k and 8k tokens of context, with
//! the same K/V read four ways:
//! through scattered pages (two sequences' pages interleaved), through pages in order,
//! gathered into a contiguous copy first and then dense (what a gather-based engine
//! does each step), and from a contiguous cache. Caches are evicted before every call,
//! as a real decode step finds them, and the four variants run in rotation so drift
//! hits all alike; each figure is the best of 30.
//!
//! Then prefill: a block of query rows at the end of a long context (every row of the
//! block at its own position, causal), as a long prompt's last chunk runs it; the figure
//! is the time per (query head, key) pair, best of 5, with folio's arithmetic (f32
//! value accumulators) and with llama.cpp's (`--llama-arithmetic`: on the scalar and
//! AVX2 paths the accumulators are rounded to f16 after every key) taking turns.
//!
//! `cargo bench -p folio --bench attention [-- --threads N]`

use folio::internals::Cpu;
use folio::kv::{BasicCache, Batch, KvSeq, KvStorage, Logits, PageTable, PagedKv, SeqStep};
use folio::model::{attention, AttentionStep, Heads, Scores};
use folio::rng::SplitMix64;
use std::time::Instant;

const HEADS: Heads = Heads {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
};
const PAGE: usize = 16;
/// Layers of the paged pools, as the default model's: the arena's chunks are
/// `[layer][K | V][page]…`, so a pool's memory and the distance between one layer's
/// runs of two chunks are the model's.
const LAYERS: usize = 30;

/// Layer 0's attention of `rows` over `kv` through `batch`'s pages.
fn step<'a>(
    kv: &'a dyn KvStorage,
    batch: &'a Batch,
    rows: &'a [(usize, usize)],
) -> AttentionStep<'a> {
    AttentionStep {
        heads: HEADS,
        scores: Scores::plain(HEADS.head_dim),
        kv,
        batch,
        layer: 0,
        rows,
    }
}

/// One position's K/V written into `kv` through `t`'s planned slot.
fn fill(kv: &mut PagedKv, t: &mut PageTable, p: usize, k: &[f32], v: &[f32]) {
    let step = kv.plan(t, &[0], Logits::None).expect("pool sized");
    let (page, slot) = step.slot(p);
    kv.storage().write(page.0, 0, slot, k, v);
    kv.commit(t).expect("commit");
}

/// Copies the K/V of `from`'s pages into `to`, position by position, run by run.
fn gather(arena: &folio::kv::KvArena, from: &Batch, to: &mut BasicCache, kvd: usize) {
    let step = &from.seqs[0];
    let (k, v) = to.layer_mut(0);
    let mut p = 0;
    while p < step.start {
        let (page, slot) = step.slot(p);
        let (ks, vs) = arena.run(page.0, 0, slot);
        let n = (ks.len() / kvd).min(step.start - p);
        k[p * kvd..(p + n) * kvd].copy_from_slice(&ks.raw()[..n * kvd]);
        v[p * kvd..(p + n) * kvd].copy_from_slice(&vs.raw()[..n * kvd]);
        p += n;
    }
}

/// A step reading `pages` of `page_size` slots up to position `end`.
fn reader(pages: Vec<folio::kv::PageId>, page_size: usize, end: usize) -> Batch {
    Batch::one(SeqStep {
        tokens: Vec::new(),
        start: end,
        pages,
        page_size,
        logits: Logits::None,
    })
}

fn main() {
    let threads = std::env::args()
        .skip_while(|a| a != "--threads")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let cpu = Cpu::new(threads).expect("threads");
    let kvd = HEADS.n_kv_heads * HEADS.head_dim;
    let d = HEADS.n_heads * HEADS.head_dim;
    println!("attention, one decode query per layer pass (9 heads over 3 KV heads, head 64), {threads} threads, kernels {}", folio::machine::isa_name());
    println!("| context | paged, scattered pages ms | paged, pages in order ms | dense, contiguous ms | gather + dense ms | in order / dense | gather+dense / scattered |");
    println!("|---------|---------------------------|--------------------------|----------------------|-------------------|------------------|--------------------------|");
    for ctx in [512usize, 2048, 8192] {
        let mut rng = SplitMix64(ctx as u64);
        let mut kv = PagedKv::new(2 * ctx.div_ceil(PAGE) + 2, PAGE, LAYERS, kvd, ctx, b"bench");
        let mut tables = [kv.new_table(None), kv.new_table(None)];
        let mut solo = PagedKv::new(ctx.div_ceil(PAGE) + 1, PAGE, LAYERS, kvd, ctx, b"bench");
        let mut alone = solo.new_table(None);
        let mut dense = BasicCache::new(1, kvd, ctx);
        dense.reserve(&vec![0; ctx], Logits::None).expect("sized");
        for p in 0..ctx {
            let k: Vec<f32> = (0..kvd).map(|_| rng.signed_f32()).collect();
            let v: Vec<f32> = (0..kvd).map(|_| rng.signed_f32()).collect();
            for t in tables.iter_mut() {
                fill(&mut kv, t, p, &k, &v);
            }
            fill(&mut solo, &mut alone, p, &k, &v);
            dense.write(0, 0, p, &k, &v);
        }
        dense.commit().expect("sized");
        let mut gathered = BasicCache::new(1, kvd, ctx);
        let q: Vec<f32> = (0..d).map(|_| rng.signed_f32()).collect();
        let rows = [(0usize, ctx - 1)];
        let mut out = vec![0f32; d];
        let scattered = reader(tables[0].pages(), PAGE, ctx);
        let in_order = reader(alone.pages(), PAGE, ctx);
        let contiguous = reader(vec![folio::kv::PageId(0)], ctx, ctx);
        let mut junk = vec![0u64; 64 << 17];
        let mut evict = || {
            for (i, x) in junk.iter_mut().enumerate().step_by(8) {
                *x = x.wrapping_add(i as u64);
            }
            std::hint::black_box(&junk);
        };
        let mut best = [f64::MAX; 4];
        let att = |kv: &dyn KvStorage, batch: &Batch, out: &mut [f32]| {
            let at = step(kv, batch, &rows);
            attention(&cpu, &at, &q, out)
        };
        for _ in 0..30 {
            for (i, best) in best.iter_mut().enumerate() {
                evict();
                let t = Instant::now();
                match i {
                    0 => att(kv.storage(), &scattered, &mut out),
                    1 => att(solo.storage(), &in_order, &mut out),
                    2 => {
                        // What a gather-based engine does each step: copy the history
                        // into a contiguous buffer (reused), then dense attention.
                        gather(kv.storage(), &scattered, &mut gathered, kvd);
                        att(&gathered, &contiguous, &mut out)
                    }
                    _ => att(&dense, &contiguous, &mut out),
                }
                *best = best.min(t.elapsed().as_secs_f64());
            }
        }
        let [scat, ord, gath, den] = best;
        println!(
            "| {ctx:>7} | {:>25.3} | {:>24.3} | {:>20.3} | {:>17.3} | {:>15.2}x | {:>23.2}x |",
            scat * 1e3,
            ord * 1e3,
            den * 1e3,
            gath * 1e3,
            ord / den,
            gath / scat
        );
    }
    let mut llama = Cpu::new(threads).expect("threads");
    llama.llama_arithmetic();
    prefill(&cpu, &llama);
}

/// Time per (query head, key) pair of a prefill block: `rows` consecutive query rows
/// ending at position `ctx - 1`, over pages in order.
fn prefill(cpu: &Cpu, llama: &Cpu) {
    let kvd = HEADS.n_kv_heads * HEADS.head_dim;
    let d = HEADS.n_heads * HEADS.head_dim;
    println!();
    println!(
        "prefill block, every row causal at its own position, kernels {}",
        folio::machine::isa_name()
    );
    println!("| context | rows | ms | ns per (query head, key) pair | llama.cpp's arithmetic: ns per pair | llama.cpp's / folio's |");
    println!("|---------|------|----|-------------------------------|-------------------------------------|-----------------------|");
    for (ctx, rows) in [(2048usize, 256usize), (8192, 256)] {
        let mut rng = SplitMix64(ctx as u64 + 1);
        let mut solo = PagedKv::new(ctx.div_ceil(PAGE) + 1, PAGE, LAYERS, kvd, ctx, b"bench");
        let mut alone = solo.new_table(None);
        for p in 0..ctx {
            let k: Vec<f32> = (0..kvd).map(|_| rng.signed_f32()).collect();
            let v: Vec<f32> = (0..kvd).map(|_| rng.signed_f32()).collect();
            fill(&mut solo, &mut alone, p, &k, &v);
        }
        let q: Vec<f32> = (0..d * rows).map(|_| rng.signed_f32()).collect();
        let list: Vec<(usize, usize)> = (ctx - rows..ctx).map(|p| (0, p)).collect();
        let pairs: usize = list.iter().map(|r| r.1 + 1).sum::<usize>() * HEADS.n_heads;
        let mut out = vec![0f32; d * rows];
        let b = reader(alone.pages(), PAGE, ctx);
        let (mut best, mut best_llama) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            for (c, best) in [(cpu, &mut best), (llama, &mut best_llama)] {
                let t = Instant::now();
                let at = step(solo.storage(), &b, &list);
                attention(c, &at, &q, &mut out);
                *best = best.min(t.elapsed().as_secs_f64());
            }
        }
        println!(
            "| {ctx:>7} | {rows:>4} | {:>6.2} | {:>29.3} | {:>35.3} | {:>21.2} |",
            best * 1e3,
            best * 1e9 / pairs as f64,
            best_llama * 1e9 / pairs as f64,
            best_llama / best
        );
    }
}
