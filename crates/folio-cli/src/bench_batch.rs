//! `folio bench --batch-figures`: the batched step's figures. Aggregate decode tok/s of
//! B sequences stepping together (B = 1 … 32) with our own B = 1 as the baseline, and
//! attention time for one decode query per sequence read through scattered pages vs
//! gathered into a contiguous copy first vs already contiguous.

use anyhow::Result;
use folio::kernels::{self, ThreadPool};
use folio::kv::{PageTable, PagedKv};
use folio::model::{
    attention, sampler::argmax, BasicCache, Heads, KvBatch, KvCache, Logits, Model, Step,
};
use folio::rng::SplitMix64;
use std::path::Path;
use std::time::Instant;

/// Batch sizes of the aggregate decode figure.
const SIZES: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// Aggregate decode speed at each batch size, and the attention comparison. The decode
/// figures run in `reps` rounds (every batch size, then llama.cpp's batched figure when
/// `llama` = (its `llama-batched-bench`, the model, threads) is given), so all of them
/// see the same machine; medians are reported.
pub fn run(
    model: &Model,
    page_size: usize,
    reps: usize,
    llama: Option<(&Path, &Path, usize)>,
) -> Result<()> {
    let reps = reps.max(1);
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len()];
    let mut theirs = Vec::new();
    for _ in 0..reps {
        for (b, r) in SIZES.iter().zip(rounds.iter_mut()) {
            r.push(aggregate_decode(model, page_size, *b, 32, 32)?);
        }
        if let Some((exe, gguf, threads)) = llama {
            theirs.extend(llama_batched(exe, gguf, threads)?);
        }
    }
    println!();
    println!(
        "Batched decode (each sequence: its own 32-token prompt, then 32 greedy steps together; medians of {reps} rounds)"
    );
    println!("| batch | aggregate tok/s | per sequence tok/s | vs batch 1 | rounds |");
    println!("|-------|-----------------|--------------------|------------|--------|");
    let meds: Vec<f64> = rounds.iter().map(|r| crate::bench::median(r)).collect();
    for ((b, tps), r) in SIZES.iter().zip(&meds).zip(&rounds) {
        println!(
            "| {b:>5} | {tps:>15.1} | {:>18.1} | {:>9.2}x | {} |",
            tps / *b as f64,
            tps / meds[0],
            crate::bench::rounds(r)
        );
    }
    if !theirs.is_empty() {
        let at16 = meds[SIZES.iter().position(|&b| b == 16).expect("16 is a size")];
        let l = crate::bench::median(&theirs);
        println!(
            "batch 16: {at16:.1} tok/s = {:.2}x llama.cpp's batched figure ({l:.1} tok/s; rounds {})",
            at16 / l,
            crate::bench::rounds(&theirs)
        );
    }

    println!();
    println!("Attention, one decode query per layer pass (9 heads over 3 KV heads, head 64)");
    println!("| context | paged, scattered pages ms | paged, pages in order ms | dense, contiguous ms | gather + dense ms | in order / dense | gather+dense / scattered |");
    println!("|---------|---------------------------|--------------------------|----------------------|-------------------|------------------|--------------------------|");
    let c = &model.config;
    let heads = Heads {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
    };
    let pool = ThreadPool::new(model.threads());
    for ctx in [512usize, 2048, 8192] {
        let t = attention_times(&pool, heads, page_size, ctx);
        println!(
            "| {ctx:>7} | {:>25.3} | {:>24.3} | {:>20.3} | {:>17.3} | {:>15.2}x | {:>23.2}x |",
            t.scattered * 1e3,
            t.in_order * 1e3,
            t.dense * 1e3,
            t.gather * 1e3,
            t.in_order / t.dense,
            t.gather / t.scattered
        );
    }
    Ok(())
}

/// llama.cpp's aggregate decode tok/s of 16 sequences (32-token prompts, 32 steps),
/// from its `llama-batched-bench` run now with the same model and threads.
fn llama_batched(exe: &Path, model: &Path, threads: usize) -> Result<Option<f64>> {
    let t = threads.to_string();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["-m"])
        .arg(model)
        .args([
            "-c", "4096", "-b", "2048", "-ub", "512", "-npp", "32", "-ntg", "32", "-npl", "16",
        ])
        .args(["-t", &t, "-tb", &t]);
    let Some(out) = crate::bench::baseline_output(&mut cmd, "llama-batched-bench")? else {
        return Ok(None);
    };
    // The table row `| PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | ...`.
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().find_map(|l| {
        let f: Vec<&str> = l.split('|').map(str::trim).collect();
        (f.len() > 8 && f[3] == "16")
            .then(|| f[8].parse().ok())
            .flatten()
    }))
}

/// Tokens per second of `b` sequences decoding `steps` tokens in lockstep.
fn aggregate_decode(
    model: &Model,
    page_size: usize,
    b: usize,
    prompt: usize,
    steps: usize,
) -> Result<f64> {
    let v = model.config.vocab as u64;
    let per_seq = (prompt + steps).div_ceil(page_size) + 1;
    let mut kv = model.new_paged(b * per_seq + 8, page_size, prompt + steps + 1);
    let mut rng = SplitMix64(b as u64);
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..prompt).map(|_| rng.below(v) as u32).collect())
        .collect();
    let mut tables: Vec<PageTable> = (0..b).map(|_| kv.new_table(None)).collect();
    let pre: Vec<Step> = prompts
        .iter()
        .map(|p| Step {
            tokens: p,
            want: Logits::Last,
        })
        .collect();
    let mut logits = model.forward_batch(&mut kv.batch(tables.iter_mut().collect()), &pre)?;
    let t = Instant::now();
    for _ in 0..steps {
        let next: Vec<[u32; 1]> = logits.iter().map(|l| [argmax(l)]).collect();
        let st: Vec<Step> = next
            .iter()
            .map(|n| Step {
                tokens: n,
                want: Logits::Last,
            })
            .collect();
        logits = model.forward_batch(&mut kv.batch(tables.iter_mut().collect()), &st)?;
    }
    Ok((b * steps) as f64 / t.elapsed().as_secs_f64())
}

/// Attention timings of one decode query (best of many calls), seconds.
struct AttnTimes {
    /// Paged, the sequence's pages alternating with another sequence's.
    scattered: f64,
    /// Paged, the sequence's pages allocated in order.
    in_order: f64,
    /// Gather the scattered pages into a contiguous copy, then dense attention.
    gather: f64,
    /// Dense attention over a contiguous cache holding the same K/V.
    dense: f64,
}

fn attention_times(pool: &ThreadPool, heads: Heads, ps: usize, ctx: usize) -> AttnTimes {
    let kvd = heads.n_kv_heads * heads.head_dim;
    let d = heads.n_heads * heads.head_dim;
    let mut rng = SplitMix64(ctx as u64);
    // The same K/V in three places: scattered pages, in-order pages, a contiguous cache.
    let mut kv = PagedKv::new(2 * ctx.div_ceil(ps) + 2, ps, 1, kvd, ctx, b"bench");
    let mut tables = [kv.new_table(None), kv.new_table(None)];
    let mut solo = PagedKv::new(ctx.div_ceil(ps) + 1, ps, 1, kvd, ctx, b"bench");
    let mut alone = solo.new_table(None);
    let mut dense = BasicCache::new(1, kvd, ctx);
    dense.begin(&vec![0; ctx]).expect("sized");
    for p in 0..ctx {
        let k: Vec<f32> = (0..kvd).map(|_| rng.signed_f32()).collect();
        let v: Vec<f32> = (0..kvd).map(|_| rng.signed_f32()).collect();
        for t in tables.iter_mut() {
            kv.seq_begin(t, &[0]).expect("pool sized for both");
            kv.seq_write(t, 0, p, &k, &v).expect("in the table");
        }
        solo.seq_begin(&mut alone, &[0]).expect("sized");
        solo.seq_write(&alone, 0, p, &k, &v).expect("in the table");
        dense.write(0, p, &k, &v).expect("sized");
    }
    dense.finish().expect("sized");
    let q: Vec<f32> = (0..d).map(|_| rng.signed_f32()).collect();
    let rows = [(0usize, ctx - 1)];
    let mut out = vec![0f32; d];
    let isa = kernels::isa();
    let reps = 30;
    // Between calls the weights of a whole forward step stream through the caches, so a
    // decode step finds its K/V in memory, not in cache: evict before every call.
    let mut junk = vec![0u64; 64 << 17];
    let mut evict = || {
        for (i, x) in junk.iter_mut().enumerate().step_by(8) {
            *x = x.wrapping_add(i as u64);
        }
        std::hint::black_box(&junk);
    };
    let [t0, _] = &mut tables;
    let scattered = kv.batch(vec![t0]);
    let in_order = solo.batch(vec![&mut alone]);
    let mut gathered = BasicCache::new(1, kvd, ctx);
    gathered.begin(&vec![0; ctx]).expect("sized");
    gathered.finish().expect("sized");
    // The four variants in rotation, best time of each (caches evicted before each):
    // the machine's drift and its neighbours' load hit all four alike.
    let mut best = [f64::MAX; 4];
    for _ in 0..reps {
        evict();
        let t = Instant::now();
        attention(pool, isa, heads, &scattered, 0, &rows, &q, &mut out);
        best[0] = best[0].min(t.elapsed().as_secs_f64());
        evict();
        let t = Instant::now();
        attention(pool, isa, heads, &in_order, 0, &rows, &q, &mut out);
        best[1] = best[1].min(t.elapsed().as_secs_f64());
        evict();
        let t = Instant::now();
        // What a gather-based engine does each step: copy the history contiguous (into
        // a reused buffer), then run dense attention over the copy.
        {
            let (k, v) = gathered.layer_mut(0);
            let mut p = 0;
            while p < ctx {
                let (ks, vs) = scattered.kv_run(0, 0, p);
                let n = (ks.len() / kvd).min(ctx - p);
                k[p * kvd..(p + n) * kvd].copy_from_slice(&ks.raw()[..n * kvd]);
                v[p * kvd..(p + n) * kvd].copy_from_slice(&vs.raw()[..n * kvd]);
                p += n;
            }
            let mut refs = [&mut gathered];
            let batch: &mut [&mut BasicCache] = &mut refs;
            attention(pool, isa, heads, &*batch, 0, &rows, &q, &mut out);
        }
        best[2] = best[2].min(t.elapsed().as_secs_f64());
        evict();
        let t = Instant::now();
        {
            let mut refs = [&mut dense];
            let batch: &mut [&mut BasicCache] = &mut refs;
            attention(pool, isa, heads, &*batch, 0, &rows, &q, &mut out);
        }
        best[3] = best[3].min(t.elapsed().as_secs_f64());
    }
    AttnTimes {
        scattered: best[0],
        in_order: best[1],
        gather: best[2],
        dense: best[3],
    }
}
