//! `folio bench --long-figures`: long context. Prefill tok/s of prompts of 512, 2048 and
//! 8000 tokens, and single-sequence decode tok/s after a prompt of 0 (one token), 2048
//! and 8000 tokens, on a paged cache; llama.cpp's `llama-bench` (flash attention on,
//! same threads) in the same rounds when its path is given, the two taking turns.
//! `folio bench --long-kv-dtypes`: decode at depths 2048 and 8000 for several K/V
//! element types ([`compare_dtypes`]), taking turns round by round.

use crate::figures::{baseline_output, bench_prompt, median, rounds};
use crate::report::{figure, Report};
use anyhow::Result;
use folio::kv::{KvDtype, KvSeq, Logits, PagedKv};
use folio::model::sampler::argmax;
use folio::{forward_one, Model};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Prompt lengths of the prefill figures.
pub const PP: [usize; 3] = [512, 2048, 8000];
/// Context depths of the decode figures.
pub const DEPTH: [usize; 3] = [0, 2048, 8000];
/// Tokens decoded at each depth.
const TG: usize = 32;

pub struct LongArgs<'a> {
    pub page_size: usize,
    pub reps: usize,
    pub threads: usize,
    pub model_path: &'a Path,
    /// llama.cpp's `llama-bench`, when measured.
    pub llama_bench: Option<PathBuf>,
    /// The K/V element type of the pool.
    pub dtype: KvDtype,
}

/// One round's figures: pp tok/s per PP, decode tok/s per DEPTH.
type Round = ([f64; 3], [f64; 3]);

pub fn run(report: &mut Report, model: &Model, a: &LongArgs) -> Result<()> {
    let most = PP.iter().chain(&DEPTH).copied().max().unwrap_or(0) + TG + 1;
    let prompt = bench_prompt(model, most);
    let dtype = a.dtype;
    let shape = model.pool_shape(most.div_ceil(a.page_size) + 1, a.page_size, dtype);
    let mut pool = PagedKv::with_shape(shape, most, &model.fingerprint());
    let mut table = pool.new_table(None);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..a.reps {
        let mut seq = pool.seq(&mut table);
        ours.push(folio_round(model, &mut seq, &prompt)?);
        if let Some(exe) = &a.llama_bench {
            if let Some(r) = llama_round(exe, a.model_path, a.threads)? {
                theirs.push(r);
            }
        }
    }
    println!();
    println!(
        "Long context (paged cache, page size {}, {} K/V, {} threads; decode: {TG} tokens after the prompt)",
        a.page_size, dtype, a.threads
    );
    println!("| test          | folio tok/s | llama.cpp tok/s | folio / llama.cpp |");
    println!("|---------------|-------------|-----------------|-------------------|");
    let mut notes = Vec::new();
    let mut rec = serde_json::Map::new();
    let mut row = |name: String, pick: &dyn Fn(&Round) -> f64| {
        let o: Vec<f64> = ours.iter().map(pick).collect();
        let t: Vec<f64> = theirs.iter().map(pick).collect();
        let om = median(&o);
        let (tm, ratio) = if t.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let tm = median(&t);
            (format!("{tm:.1}"), format!("{:.2}x", om / tm))
        };
        println!("| {name:<13} | {om:>11.1} | {tm:>15} | {ratio:>17} |");
        rec.insert(
            name.clone(),
            json!({"folio": figure(om, &o),
                   "llama": (!t.is_empty()).then(|| figure(median(&t), &t))}),
        );
        notes.push(format!(
            "{name}: folio {}{}",
            rounds(&o),
            if t.is_empty() {
                String::new()
            } else {
                format!(" | llama.cpp {}", rounds(&t))
            }
        ));
    };
    for (i, n) in PP.iter().enumerate() {
        row(format!("pp{n}"), &|r: &Round| r.0[i]);
    }
    for (i, d) in DEPTH.iter().enumerate() {
        row(format!("tg{TG} @ d{d}"), &|r: &Round| r.1[i]);
    }
    println!(
        "(medians of {} rounds; every round: {})",
        a.reps,
        notes.join("; ")
    );
    if a.llama_bench.is_none() {
        println!("(llama.cpp not measured: pass --llama-bench PATH or set FOLIO_LLAMA_BENCH)");
    }
    rec.insert(
        "llama_tool".into(),
        json!(a
            .llama_bench
            .as_ref()
            .map(|_| "llama-bench, flash attention on")),
    );
    report.add("long", rec.into());
    Ok(())
}

/// Decode depths of the K/V element type comparison.
const DTYPE_DEPTHS: [usize; 2] = [2048, 8000];

/// `folio bench --long-kv-dtypes`: decode tok/s at depths 2048 and 8000 for each K/V
/// element type in `dtypes` (the first is the baseline of the ratios), each in its own
/// pool. Each (type, depth) sequence is prefilled once; then every round decodes
/// [`TG`] greedy tokens on each of them in turn and truncates back to the depth, so the
/// types take turns round by round on the same machine state. Returns nothing but the
/// printed table and the report's `long_kv_dtypes` section.
pub fn compare_dtypes(
    report: &mut Report,
    model: &Model,
    dtypes: &[KvDtype],
    page_size: usize,
    rounds_n: usize,
) -> Result<()> {
    let most = DTYPE_DEPTHS.iter().sum::<usize>() + 2 * (TG + 1);
    let prompt = bench_prompt(model, most);
    let pages = DTYPE_DEPTHS
        .iter()
        .map(|d| (d + TG + 1).div_ceil(page_size) + 1)
        .sum::<usize>();
    // Per type: its pool, and per depth a table prefilled to it and the first token
    // of its decode.
    let mut setups = Vec::new();
    for &dtype in dtypes {
        let shape = model.pool_shape(pages, page_size, dtype);
        let mut pool = PagedKv::with_shape(shape, most, &model.fingerprint());
        let mut seqs = Vec::new();
        for &d in &DTYPE_DEPTHS {
            let mut t = pool.new_table(None);
            let logits = forward_one(model, &mut pool.seq(&mut t), &prompt[..d], Logits::Last)?;
            seqs.push((t, argmax(&logits), d));
        }
        setups.push((pool, seqs));
    }
    // speeds[type][depth]: tok/s of every round.
    let mut speeds = vec![vec![Vec::new(); DTYPE_DEPTHS.len()]; dtypes.len()];
    for _ in 0..rounds_n {
        for ((pool, seqs), sp) in setups.iter_mut().zip(&mut speeds) {
            for ((t, first, d), s) in seqs.iter_mut().zip(sp.iter_mut()) {
                let mut seq = pool.seq(t);
                seq.truncate(*d);
                let mut next = *first;
                let began = Instant::now();
                for _ in 0..TG {
                    let l = forward_one(model, &mut seq, &[next], Logits::Last)?;
                    next = argmax(&l);
                }
                s.push(TG as f64 / began.elapsed().as_secs_f64());
            }
        }
    }
    println!();
    println!(
        "Decode by K/V element type (paged cache, page size {page_size}, {TG} tokens at each depth; the types take turns round by round; ratio to {}):",
        dtypes[0]
    );
    let head: Vec<String> = dtypes.iter().map(|d| format!("{d} tok/s")).collect();
    println!("| test          | {} |", head.join(" | "));
    println!("|---------------|{}", "---|".repeat(dtypes.len()));
    let mut rec = serde_json::Map::new();
    let mut notes = Vec::new();
    for (i, d) in DTYPE_DEPTHS.iter().enumerate() {
        let name = format!("tg{TG} @ d{d}");
        let first = median(&speeds[0][i]);
        let mut cells = Vec::new();
        let mut r = serde_json::Map::new();
        for (j, dtype) in dtypes.iter().enumerate() {
            let v = &speeds[j][i];
            let m = median(v);
            cells.push(if j == 0 {
                format!("{m:.1}")
            } else {
                format!("{m:.1} ({:.2}x)", m / first)
            });
            r.insert(dtype.to_string(), figure(m, v));
            notes.push(format!("{name} {dtype}: {}", rounds(v)));
        }
        println!("| {name:<13} | {} |", cells.join(" | "));
        rec.insert(name, r.into());
    }
    println!(
        "(medians of {rounds_n} rounds; every round: {})",
        notes.join("; ")
    );
    let bytes: Vec<String> = dtypes
        .iter()
        .map(|&d| format!("{d} {} bytes", model.pool_shape(0, 1, d).page_bytes()))
        .collect();
    println!("(K/V per token: {})", bytes.join(", "));
    report.add("long_kv_dtypes", rec.into());
    Ok(())
}

/// folio's prefill at each PP length, then decode at each depth.
fn folio_round<S: KvSeq>(model: &Model, seq: &mut S, prompt: &[u32]) -> Result<Round> {
    let mut pp = [0f64; 3];
    for (o, &n) in pp.iter_mut().zip(&PP) {
        seq.truncate(0);
        let t = Instant::now();
        forward_one(model, seq, &prompt[..n], Logits::Last)?;
        *o = n as f64 / t.elapsed().as_secs_f64();
    }
    let mut tg = [0f64; 3];
    for (o, &d) in tg.iter_mut().zip(&DEPTH) {
        seq.truncate(0);
        // A prompt of `d` tokens (one at depth 0), then TG greedy steps timed.
        let mut logits = forward_one(model, seq, &prompt[..d.max(1)], Logits::Last)?;
        let t = Instant::now();
        for _ in 0..TG {
            logits = forward_one(model, seq, &[argmax(&logits)], Logits::Last)?;
        }
        *o = TG as f64 / t.elapsed().as_secs_f64();
    }
    Ok((pp, tg))
}

/// One round of llama-bench: pp at each PP length, then tg at each depth (JSON lines).
fn llama_round(exe: &Path, model: &Path, threads: usize) -> Result<Option<Round>> {
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let run = |args: &[String]| -> Result<Option<Vec<serde_json::Value>>> {
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("-m")
            .arg(model)
            .args([
                "-t",
                &threads.to_string(),
                "-fa",
                "1",
                "-r",
                "1",
                "-o",
                "jsonl",
            ])
            .args(args);
        Ok(baseline_output(&mut cmd, "llama-bench")?.map(|out| {
            String::from_utf8_lossy(&out)
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        }))
    };
    let pick = |rows: &[serde_json::Value], key: &str, n: usize, gen: bool| {
        rows.iter()
            .find(|r| {
                r[key].as_u64() == Some(n as u64) && (r["n_gen"].as_u64().unwrap_or(0) > 0) == gen
            })
            .and_then(|r| r["avg_ts"].as_f64())
            .unwrap_or(0.0)
    };
    let s = |x: &str| x.to_string();
    let Some(pp) = run(&[s("-p"), list(&PP), s("-n"), s("0")])? else {
        return Ok(None);
    };
    let Some(tg) = run(&[
        s("-p"),
        s("0"),
        s("-n"),
        TG.to_string(),
        s("-d"),
        list(&DEPTH),
    ])?
    else {
        return Ok(None);
    };
    Ok(Some((
        PP.map(|n| pick(&pp, "n_prompt", n, false)),
        DEPTH.map(|d| pick(&tg, "n_depth", d, true)),
    )))
}
