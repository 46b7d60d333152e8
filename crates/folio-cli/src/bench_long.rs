//! `folio bench --long-figures`: long context. Prefill tok/s of prompts of 512, 2048 and
//! 8000 tokens, and single-sequence decode tok/s after a prompt of 0 (one token), 2048
//! and 8000 tokens, on a paged cache; llama.cpp's `llama-bench` (flash attention on,
//! same threads) in the same rounds when its path is given, the two taking turns. With
//! more than one K/V element type (`--long-kv-dtypes`) each has its own pool and they
//! take turns too; a second table gives each one's figures and its ratio to the first.

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
    /// The K/V element types measured (at least one): the first is the main table's.
    pub dtypes: Vec<KvDtype>,
}

/// One round's figures: pp tok/s per PP, decode tok/s per DEPTH.
type Round = ([f64; 3], [f64; 3]);

pub fn run(report: &mut Report, model: &Model, a: &LongArgs) -> Result<()> {
    let most = PP.iter().chain(&DEPTH).copied().max().unwrap_or(0) + TG + 1;
    let prompt = bench_prompt(model, most);
    let dtypes = if a.dtypes.is_empty() {
        vec![KvDtype::F16]
    } else {
        a.dtypes.clone()
    };
    let mut pools: Vec<_> = dtypes
        .iter()
        .map(|&dtype| {
            let shape = model.pool_shape(most.div_ceil(a.page_size) + 1, a.page_size, dtype);
            let pool = PagedKv::with_shape(shape, most, &model.fingerprint());
            let table = pool.new_table(None);
            (pool, table)
        })
        .collect();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut each: Vec<Vec<Round>> = vec![Vec::new(); dtypes.len()];
    for _ in 0..a.reps {
        for ((pool, table), rounds) in pools.iter_mut().zip(&mut each) {
            let mut seq = pool.seq(table);
            rounds.push(folio_round(model, &mut seq, &prompt)?);
        }
        ours.push(each[0].last().copied().unwrap_or_default());
        if let Some(exe) = &a.llama_bench {
            if let Some(r) = llama_round(exe, a.model_path, a.threads)? {
                theirs.push(r);
            }
        }
    }
    println!();
    println!(
        "Long context (paged cache, page size {}, {} K/V, {} threads; decode: {TG} tokens after the prompt)",
        a.page_size, dtypes[0], a.threads
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
    if dtypes.len() > 1 {
        dtype_table(report, &dtypes, &each);
    }
    Ok(())
}

/// The figures of every K/V element type measured (`each[i]`: `dtypes[i]`'s rounds),
/// medians, with each one's ratio to the first's.
fn dtype_table(report: &mut Report, dtypes: &[KvDtype], each: &[Vec<Round>]) {
    println!();
    println!(
        "Long context by K/V element type (same rounds, taking turns; ratio to {}):",
        dtypes[0]
    );
    let head: Vec<String> = dtypes.iter().map(|d| format!("{d} tok/s")).collect();
    println!("| test          | {} |", head.join(" | "));
    println!("|---------------|{}", "---|".repeat(dtypes.len()));
    let mut rec = serde_json::Map::new();
    let mut notes = Vec::new();
    let mut row = |name: String, pick: &dyn Fn(&Round) -> f64| {
        let all: Vec<Vec<f64>> = each.iter().map(|r| r.iter().map(pick).collect()).collect();
        let first = median(&all[0]);
        let cells: Vec<String> = all
            .iter()
            .map(|v| {
                let m = median(v);
                if std::ptr::eq(v, &all[0]) {
                    format!("{m:.1}")
                } else {
                    format!("{m:.1} ({:.2}x)", m / first)
                }
            })
            .collect();
        println!("| {name:<13} | {} |", cells.join(" | "));
        let mut r = serde_json::Map::new();
        for (d, v) in dtypes.iter().zip(&all) {
            r.insert(d.to_string(), figure(median(v), v));
            notes.push(format!("{name} {d}: {}", rounds(v)));
        }
        rec.insert(name, r.into());
    };
    for (i, n) in PP.iter().enumerate() {
        row(format!("pp{n}"), &|r: &Round| r.0[i]);
    }
    for (i, d) in DEPTH.iter().enumerate() {
        row(format!("tg{TG} @ d{d}"), &|r: &Round| r.1[i]);
    }
    println!(
        "(medians of {} rounds; every round: {})",
        each[0].len(),
        notes.join("; ")
    );
    report.add("long_kv_dtypes", rec.into());
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
