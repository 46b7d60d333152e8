//! `folio bench --batch-figures`: the batched step's figures. Aggregate decode tok/s of
//! B sequences stepping together (B = 1 … 32) with our own B = 1 as the baseline, and
//! llama.cpp's `llama-batched-bench` at the same batch sizes in the same rounds.
//! (Attention through scattered pages vs gather + dense is a kernel micro-benchmark:
//! `cargo bench -p folio --bench attention`.)

use crate::figures::{baseline_output, bench_prompt, median, rounds as round_list, speeds};
use crate::report::{figure, Report};
use anyhow::Result;
use folio::kv::{Batch, Logits, PageTable, PagedKv};
use folio::model::sampler::argmax;
use folio::model::StepLogits;
use folio::rng::SplitMix64;
use folio::Model;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

/// Batch sizes of the aggregate decode figure.
const SIZES: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// The batch whose aggregate decode is set against our own prefill (pp512) measured
/// just before it, in every round: on a machine whose speed swings from one second to
/// the next, the two figures of one round saw the same machine.
const VS_PREFILL: usize = 16;

/// Aggregate decode speed at each batch size, and the attention comparison. The decode
/// figures run in `reps` rounds (every batch size, then llama.cpp's batched figure when
/// `llama` = (its `llama-batched-bench`, the model, threads) is given), so all of them
/// see the same machine; medians are reported.
pub fn run(
    report: &mut Report,
    model: &Model,
    page_size: usize,
    reps: usize,
    llama: Option<(&Path, &Path, usize)>,
) -> Result<()> {
    let reps = reps.max(1);
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len()];
    let mut theirs: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len()];
    let (mut pp, mut vs_pp) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        for (b, r) in SIZES.iter().zip(rounds.iter_mut()) {
            let before = (*b == VS_PREFILL)
                .then(|| prefill(model, page_size))
                .transpose()?;
            r.push(aggregate_decode(model, page_size, *b, 32, 32)?);
            if let (Some(p), Some(d)) = (before, r.last()) {
                pp.push(p);
                vs_pp.push(d / p);
            }
        }
        if let Some((exe, gguf, threads)) = llama {
            for (t, v) in theirs.iter_mut().zip(llama_batched(exe, gguf, threads)?) {
                t.extend(v);
            }
        }
    }
    println!();
    println!(
        "Batched decode (each sequence: its own 32-token prompt, then 32 greedy steps together; medians of {reps} rounds{})",
        if llama.is_some() {
            "; llama.cpp: llama-batched-bench -npp 32 -ntg 32, S_TG"
        } else {
            "; llama.cpp not measured: pass --llama-batched-bench PATH or set FOLIO_LLAMA_BATCHED_BENCH"
        }
    );
    println!("| batch | aggregate tok/s | per sequence tok/s | vs batch 1 | llama.cpp tok/s | folio / llama.cpp | rounds |");
    println!("|-------|-----------------|--------------------|------------|-----------------|-------------------|--------|");
    let meds: Vec<f64> = rounds.iter().map(|r| median(r)).collect();
    let mut rows = Vec::new();
    for (((b, tps), r), t) in SIZES.iter().zip(&meds).zip(&rounds).zip(&theirs) {
        let l = (!t.is_empty()).then(|| median(t));
        println!(
            "| {b:>5} | {tps:>15.1} | {:>18.1} | {:>9.2}x | {:>15} | {:>17} | {}{} |",
            tps / *b as f64,
            tps / meds[0],
            l.map_or("-".into(), |l| format!("{l:.1}")),
            l.map_or("-".into(), |l| format!("{:.2}x", tps / l)),
            round_list(r),
            if t.is_empty() {
                String::new()
            } else {
                format!(" / llama.cpp {}", round_list(t))
            }
        );
        rows.push(json!({"batch": b, "folio": figure(*tps, r),
                         "llama": l.map(|l| figure(l, t))}));
    }
    let ratio = median(&vs_pp);
    println!(
        "batch {VS_PREFILL} against our own pp512 measured just before it in the same round: {ratio:.2}x (median of the rounds' ratios: {}; pp512 tok/s {})",
        vs_pp.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
        round_list(&pp)
    );
    report.add(
        "batch",
        json!({"prompt_tokens": 32, "decode_steps": 32, "sizes": rows,
               "vs_prefill": {"batch": VS_PREFILL, "ratio": ratio, "ratios": vs_pp,
                              "pp512": figure(median(&pp), &pp)}}),
    );
    Ok(())
}

/// Our own prefill tok/s of a 512-token prompt into an empty sequence (`folio bench`'s
/// pp512).
fn prefill(model: &Model, page_size: usize) -> Result<f64> {
    let prompt = bench_prompt(model, 512);
    let shape = model.pool_shape(
        prompt.len().div_ceil(page_size) + 2,
        page_size,
        folio::KvDtype::F16,
    );
    let mut kv = PagedKv::with_shape(shape, prompt.len() + 1, &model.fingerprint());
    let mut table = kv.new_table(None);
    Ok(speeds(model, &mut kv.seq(&mut table), &prompt, 0)?.0)
}

/// llama.cpp's aggregate decode tok/s at each of [`SIZES`] (32-token prompts, 32
/// steps), from one `llama-batched-bench` run now with the same model and threads.
fn llama_batched(exe: &Path, model: &Path, threads: usize) -> Result<Vec<Option<f64>>> {
    let t = threads.to_string();
    let npl = SIZES.map(|b| b.to_string()).join(",");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["-m"])
        .arg(model)
        .args([
            "-c", "4096", "-b", "2048", "-ub", "512", "-npp", "32", "-ntg", "32", "-npl", &npl,
        ])
        .args(["-t", &t, "-tb", &t]);
    let Some(out) = baseline_output(&mut cmd, "llama-batched-bench")? else {
        return Ok(vec![None; SIZES.len()]);
    };
    // The table rows `| PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | ...`.
    let text = String::from_utf8_lossy(&out);
    Ok(SIZES
        .iter()
        .map(|b| {
            text.lines().find_map(|l| {
                let f: Vec<&str> = l.split('|').map(str::trim).collect();
                (f.len() > 8 && f[3] == b.to_string())
                    .then(|| f[8].parse().ok())
                    .flatten()
            })
        })
        .collect())
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
    let shape = model.pool_shape(b * per_seq + 8, page_size, folio::KvDtype::F16);
    let mut kv = PagedKv::with_shape(shape, prompt + steps + 1, &model.fingerprint());
    let mut rng = SplitMix64(b as u64);
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..prompt).map(|_| rng.below(v) as u32).collect())
        .collect();
    let mut tables: Vec<PageTable> = (0..b).map(|_| kv.new_table(None)).collect();
    // One logits buffer for every step, as the engine keeps one.
    let mut logits = StepLogits::new();
    step(model, &mut kv, &mut tables, &prompts, &mut logits)?;
    let t = Instant::now();
    for _ in 0..steps {
        let next: Vec<Vec<u32>> = logits.iter().map(|l| vec![argmax(l)]).collect();
        step(model, &mut kv, &mut tables, &next, &mut logits)?;
    }
    Ok((b * steps) as f64 / t.elapsed().as_secs_f64())
}

/// One batched step: sequence `i` runs `tokens[i]` (slots reserved, computed, committed).
fn step(
    model: &Model,
    kv: &mut PagedKv,
    tables: &mut [PageTable],
    tokens: &[Vec<u32>],
    logits: &mut StepLogits,
) -> Result<()> {
    let mut batch = Batch::default();
    for (t, toks) in tables.iter_mut().zip(tokens) {
        batch.seqs.push(kv.plan(t, toks, Logits::Last)?);
    }
    model.forward_into(&batch, kv.storage(), logits)?;
    for t in tables.iter_mut() {
        kv.commit(t)?;
    }
    Ok(())
}
