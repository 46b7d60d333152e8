//! `folio bench`: prefill (ppN) and decode (tgN) speed on one sequence, the machine's
//! read bandwidth as the decode ceiling, and llama.cpp's figures measured in the same
//! run (through llama-cpp-python, when installed) with the ratios.

use crate::figures::{bench_prompt, median, rounds, speeds};
use crate::opts::KvKind;
use crate::opts::ModelArgs;
use crate::report::{figure, Report};
use anyhow::{Context, Result};
use folio::kv::{BasicCache, KvSeq, Logits, PagedKv};
use folio::model::sampler::argmax;
use folio::{forward_one, Model};
use serde_json::json;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length of the prefill test.
    #[arg(long, default_value_t = 512)]
    pub pp: usize,
    /// Tokens generated in the decode test.
    #[arg(long, default_value_t = 128)]
    pub tg: usize,
    /// Rounds of the tests: each round runs folio's prefill and decode, then llama.cpp's,
    /// so both see the same machine; the medians over rounds are reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub reps: u64,
    /// Skip the llama.cpp baseline.
    #[arg(long)]
    pub no_llama: bool,
    /// Python interpreter with llama-cpp-python [default: $FOLIO_LLAMA_PYTHON, else python3].
    #[arg(long)]
    pub llama_python: Option<String>,
    /// Also print the paged cache's figures: slot waste, sequences per KV budget, fork
    /// time at 1k and 32k tokens, and a 2000-token prefill cold vs with its prefix indexed.
    #[arg(long)]
    pub kv_figures: bool,
    /// Also print the batched step's figures: aggregate decode tok/s at batch 1-32 and
    /// paged vs gather+dense attention time at 512, 2k and 8k tokens of context.
    #[arg(long)]
    pub batch_figures: bool,
    /// Also print what structured output costs: decode tok/s of JSON-schema requests
    /// vs the same requests unconstrained, alone and 16 at once, and compile times.
    #[arg(long)]
    pub grammar_figures: bool,
    /// llama.cpp's `llama-batched-bench` binary [default: $FOLIO_LLAMA_BATCHED_BENCH]:
    /// run in the same invocation for its aggregate decode figure at batch 16.
    #[arg(long, value_name = "PATH")]
    pub llama_batched_bench: Option<std::path::PathBuf>,
    /// Also print speculative decoding's figures: decode tok/s with drafts against
    /// without, on replays whose answers repeat their input and on free chat, one
    /// request at a time and 16 at once (the same tokens checked).
    #[arg(long)]
    pub spec_figures: bool,
    /// Also print serving figures over HTTP (`folio serve` in its own process): output
    /// tok/s and TTFT p50/p95 at 1, 16 and 32 concurrent clients (distinct prompts, and
    /// sharing a 1000-token prefix), warm vs cold TTFT for a 2000-token prefix, peak
    /// RSS; llama.cpp's server under the same client and loads with --llama-server.
    #[arg(long)]
    pub serve_figures: bool,
    /// Also print decode and prefill under contention, alternating with the quiet
    /// figures round by round: with one competing CPU-bound process, and with one
    /// thread more than the cores.
    #[arg(long)]
    pub contention: bool,
    /// Also print long-context figures: prefill tok/s at 512, 2048 and 8000 tokens and
    /// decode tok/s at depths 0, 2048 and 8000, beside llama.cpp's `llama-bench` (see
    /// --llama-bench) in the same rounds.
    #[arg(long)]
    pub long_figures: bool,
    /// Also print decode tok/s at depths 2048 and 8000 with --kv-dtype's K/V and these
    /// element types (comma-separated: f16, f32, q8_0), each in its own pool, taking
    /// turns round by round (3 × --reps rounds), with the ratios to --kv-dtype's.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub long_kv_dtypes: Vec<crate::opts::KvDtypeArg>,
    /// llama.cpp's `llama-bench` binary [default: $FOLIO_LLAMA_BENCH]: measured with
    /// --long-figures in the same rounds as folio.
    #[arg(long, value_name = "PATH")]
    pub llama_bench: Option<std::path::PathBuf>,
    /// Most token rows in one engine step (decode tokens plus prefill chunks).
    #[arg(long, default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// llama.cpp's `llama-server` binary [default: $FOLIO_LLAMA_SERVER]: driven with
    /// --serve-figures by the same HTTP client under the same loads as folio's server.
    #[arg(long, value_name = "PATH")]
    pub llama_server: Option<std::path::PathBuf>,
    /// Every figure set: --long-figures, --batch-figures, --kv-figures,
    /// --grammar-figures, --spec-figures and --serve-figures (not --contention).
    #[arg(long)]
    pub all: bool,
    /// Also write the figures as JSON to PATH, with the machine and the command
    /// (`scripts/bench_plots.py` turns it into plots and docs/BENCHMARKS.md).
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
}

/// The one sequence pp/tg run on, of the kind `--kv` chose.
enum OneSeq {
    Basic(BasicCache),
    Paged(Box<PagedKv>, folio::kv::PageTable),
}

const LLAMA_BENCH: &str = include_str!("../../../scripts/llama_bench.py");

pub fn run(mut a: Args) -> Result<()> {
    if a.all {
        a.long_figures = true;
        a.batch_figures = true;
        a.kv_figures = true;
        a.grammar_figures = true;
        a.serve_figures = true;
        a.spec_figures = true;
    }
    let mut report = Report::default();
    // Load time from a warm page cache, as llama.cpp's rounds find the file.
    warm_page_cache(&a.model.path()?);
    let began = std::time::Instant::now();
    let (model, profile) = a.model.load_profiled()?;
    let load_s = began.elapsed().as_secs_f64();
    // After the load: what the weights and the tokenizer hold, before any pool.
    let loaded = folio::machine::resident_memory();
    // The CPU threads asked for: llama.cpp's and the bandwidth probe's (the GPU
    // backend drives its device from one host thread, which `model.threads()` says).
    let threads = match a.model.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let reps = a.reps as usize;
    println!(
        "folio bench: {} | {} cpu threads | kernels {} | kv {:?} | backend {}",
        a.model.path()?.display(),
        threads,
        folio::machine::isa_name(),
        a.model.kv,
        model.backend().describe()
    );

    let prompt = bench_prompt(&model, a.pp);
    // One sequence of up to --ctx tokens, contiguous or in a pool of pages.
    let ctx = a.model.ctx.min(model.config.context_length);
    let dtype = a.model.kv_dtype.dtype();
    let mut seq = match a.model.kv {
        KvKind::Basic => {
            let c = &model.config;
            let (kvd, hd) = (c.kv_dim(), c.head_dim);
            OneSeq::Basic(BasicCache::with_dtype(c.n_layers, kvd, hd, ctx, dtype))
        }
        KvKind::Paged => {
            let pages = a.model.pool_pages(&model, a.model.page_size, 2 * ctx)?;
            let shape = model.pool_shape(pages, a.model.page_size, dtype);
            let pool = PagedKv::with_shape(shape, ctx, &model.fingerprint());
            let table = pool.new_table(None);
            OneSeq::Paged(Box::new(pool), table)
        }
    };
    let llama_bench = if a.no_llama {
        None
    } else {
        LlamaBench::find(&a)?
    };
    // Machines shared with neighbours swing by 15% and more from one second to the
    // next, so folio and llama.cpp take turns, round by round.
    let (mut pps, mut tgs, mut llama) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let (pp, tg) = match &mut seq {
            OneSeq::Basic(c) => speeds(&model, c, &prompt, a.tg)?,
            OneSeq::Paged(pool, t) => speeds(&model, &mut pool.seq(t), &prompt, a.tg)?,
        };
        pps.push(pp);
        tgs.push(tg);
        if let Some(l) = &llama_bench {
            llama.push(l.round(&a, threads)?);
        }
    }
    // Before the bandwidth probe (its buffer would be the peak).
    let ran = folio::machine::resident_memory();
    let (pp, tg) = (median(&pps), median(&tgs));
    let bw = folio::machine::read_bandwidth(threads)?;
    let limit = bw / model.bytes_per_token() as f64;

    println!();
    println!("| test   | folio tok/s | llama.cpp tok/s | folio / llama.cpp |");
    println!("|--------|-------------|-----------------|-------------------|");
    let l_pps: Vec<f64> = llama.iter().map(|l| l.0).collect();
    let l_tgs: Vec<f64> = llama.iter().map(|l| l.1).collect();
    let l_loads: Vec<f64> = llama.iter().map(|l| l.2).collect();
    let llama = (!llama.is_empty()).then(|| (median(&l_pps), median(&l_tgs), median(&l_loads)));
    let row = |name: String, ours: f64, theirs: Option<f64>| {
        let (t, r) = match theirs {
            Some(v) => (format!("{v:.1}"), format!("{:.2}x", ours / v)),
            None => ("-".into(), "-".into()),
        };
        println!("| {name:<6} | {ours:>11.1} | {t:>15} | {r:>17} |");
    };
    row(format!("pp{}", a.pp), pp, llama.as_ref().map(|l| l.0));
    row(format!("tg{}", a.tg), tg, llama.as_ref().map(|l| l.1));
    println!(
        "(medians of {reps} rounds; folio pp {} | tg {}{})",
        rounds(&pps),
        rounds(&tgs),
        llama
            .map(|_| format!(
                " | llama.cpp via llama-cpp-python, flash attention on, same threads: pp {} | tg {}",
                rounds(&l_pps),
                rounds(&l_tgs)
            ))
            .unwrap_or_default()
    );
    println!();
    println!(
        "read bandwidth {:.1} GB/s; weights read per token {:.1} MB -> decode ceiling {:.0} tok/s; folio reaches {:.0}% of it{}",
        bw / 1e9,
        model.bytes_per_token() as f64 / 1e6,
        limit,
        100.0 * tg / limit,
        llama
            .as_ref()
            .map(|l| format!(", llama.cpp {:.0}%", 100.0 * l.1 / limit))
            .unwrap_or_default()
    );
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    if let (Some((steady, load_peak)), Some((_, peak))) = (loaded, ran) {
        println!(
            "memory: load {load_s:.2} s{}; resident after load {:.0} MiB (peak while loading {:.0} MiB); peak through pp{} and tg{} {:.0} MiB (llama.cpp's: scripts/memory.sh)",
            llama
                .map(|l| format!(" (llama.cpp {:.2} s, median of its rounds; both from a warm page cache)", l.2))
                .unwrap_or_default(),
            mib(steady),
            mib(load_peak),
            a.pp,
            a.tg,
            mib(peak)
        );
    }
    report.add(
        "single",
        json!({
            "load_s": load_s,
            "llama_load_s": llama.map(|l| figure(l.2, &l_loads)),
            "rss_after_load_mib": loaded.map(|m| mib(m.0)),
            "rss_peak_load_mib": loaded.map(|m| mib(m.1)),
            "rss_peak_mib": ran.map(|m| mib(m.1)),
            "pp": {"tokens": a.pp, "folio": figure(pp, &pps),
                   "llama": llama.map(|l| figure(l.0, &l_pps))},
            "tg": {"tokens": a.tg, "folio": figure(tg, &tgs),
                   "llama": llama.map(|l| figure(l.1, &l_tgs))},
            "weights_bytes_per_token": model.bytes_per_token(),
            "decode_ceiling_tok_s": limit,
            "llama_tool": llama.map(|_| "llama-cpp-python (flash attention on)"),
        }),
    );
    if a.long_figures {
        let path = a.model.path()?;
        crate::bench_long::run(
            &mut report,
            &model,
            &crate::bench_long::LongArgs {
                page_size: a.model.page_size,
                reps,
                threads,
                model_path: &path,
                llama_bench: llama_tool(&a, &a.llama_bench, "FOLIO_LLAMA_BENCH"),
                dtype: a.model.kv_dtype.dtype(),
            },
        )?;
    }
    if !a.long_kv_dtypes.is_empty() {
        let dtypes: Vec<_> = std::iter::once(&a.model.kv_dtype)
            .chain(&a.long_kv_dtypes)
            .map(|d| d.dtype())
            .collect();
        crate::bench_long::compare_dtypes(
            &mut report,
            &model,
            &dtypes,
            a.model.page_size,
            3 * reps,
        )?;
    }
    if a.contention {
        crate::bench_contention::run(&a.model, &prompt, a.tg, reps)?;
    }
    if a.grammar_figures {
        crate::bench_grammar::run(&mut report, a.model.load()?, a.model.page_size, reps)?;
    }
    if a.spec_figures {
        crate::bench_spec::run_figures(&mut report, &a.model, reps)?;
    }
    if a.kv_figures {
        kv_figures(&mut report, &model, &a)?;
    }
    if a.batch_figures {
        let exe = llama_tool(&a, &a.llama_batched_bench, "FOLIO_LLAMA_BATCHED_BENCH");
        let path = a.model.path()?;
        let llama = exe.as_deref().map(|e| (e, path.as_path(), threads));
        crate::bench_batch::run(&mut report, &model, a.model.page_size, reps, llama)?;
    }
    if a.serve_figures {
        let pages = a.model.pool_pages(&model, a.model.page_size, 200_000)?;
        drop(model);
        crate::bench_serve::run(
            &mut report,
            crate::bench_serve::ServeArgs {
                model: a.model.path()?,
                threads,
                page_size: a.model.page_size,
                kv_pages: pages,
                max_batch_tokens: a.max_batch_tokens,
                llama_server: llama_tool(&a, &a.llama_server, "FOLIO_LLAMA_SERVER"),
            },
        )?;
    }
    crate::opts::print_profile(&a.model, profile.as_ref());
    if let Some(path) = &a.json {
        report.write(path, crate::report::machine(threads, bw))?;
    }
    Ok(())
}

/// A llama.cpp tool to measure in the same run: the flag, else the environment
/// variable, unless `--no-llama`.
fn llama_tool(
    a: &Args,
    flag: &Option<std::path::PathBuf>,
    env: &str,
) -> Option<std::path::PathBuf> {
    if a.no_llama {
        return None;
    }
    flag.clone()
        .or_else(|| std::env::var_os(env).map(Into::into))
}

/// The paged cache's figures, each next to its contiguous baseline.
fn kv_figures(report: &mut Report, model: &Model, a: &Args) -> Result<()> {
    let c = &model.config;
    let ps = a.model.page_size;
    let max_ctx = c.context_length;
    let dtype = a.model.kv_dtype.dtype();
    let token_bytes = model.pool_shape(0, 1, dtype).page_bytes();
    let pool = |pages: usize, max_tokens: usize| {
        PagedKv::with_shape(
            model.pool_shape(pages, ps, dtype),
            max_tokens,
            &model.fingerprint(),
        )
    };
    // A mixed workload: 256 sequences of 1..=2048 tokens (fixed generator).
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let lens: Vec<usize> = (0..256)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % 2048) as usize
        })
        .collect();
    let used: usize = lens.iter().sum();
    let paged: usize = lens.iter().map(|l| l.div_ceil(ps) * ps).sum();
    let contiguous = lens.len() * max_ctx;
    println!();
    println!(
        "KV cache figures (page size {ps}, model context {max_ctx}, {} bytes of K/V per token)",
        token_bytes
    );
    println!(
        "- slots wasted, 256 sequences of 1-2048 tokens: paged {:.2}% ({:.2} pages per sequence) | contiguous max-context preallocation {:.1}%",
        100.0 * (paged - used) as f64 / paged as f64,
        (paged - used) as f64 / ps as f64 / lens.len() as f64,
        100.0 * (contiguous - used) as f64 / contiguous as f64
    );
    let budget: usize = 1 << 30;
    let fit_contig = budget / (max_ctx * token_bytes);
    let budget_pages = budget / (ps * token_bytes);
    let mut pages = 0;
    let fit_paged = lens
        .iter()
        .cycle()
        .take_while(|l| {
            pages += l.div_ceil(ps);
            pages <= budget_pages
        })
        .count();
    println!(
        "- sequences in a 1 GiB KV budget (same lengths): paged {fit_paged} | contiguous {fit_contig} ({:.1}x)",
        fit_paged as f64 / fit_contig.max(1) as f64
    );
    let per_seq_paged = paged as f64 * token_bytes as f64 / lens.len() as f64;
    let per_seq_contig = (max_ctx * token_bytes) as f64;
    println!(
        "- KV bytes per sequence (same lengths, mean {:.0} tokens): paged {:.2} MiB | contiguous {:.2} MiB ({:.1}x less)",
        used as f64 / lens.len() as f64,
        per_seq_paged / (1 << 20) as f64,
        per_seq_contig / (1 << 20) as f64,
        per_seq_contig / per_seq_paged
    );
    let mut figures = json!({
        "page_size": ps,
        "model_context": max_ctx,
        "token_bytes": token_bytes,
        "sequences": lens.len(),
        "mean_tokens": used as f64 / lens.len() as f64,
        "slots_wasted_pct": {"paged": 100.0 * (paged - used) as f64 / paged as f64,
                             "contiguous": 100.0 * (contiguous - used) as f64 / contiguous as f64},
        "bytes_per_sequence": {"paged": per_seq_paged, "contiguous": per_seq_contig},
        "sequences_per_gib": {"paged": fit_paged, "contiguous": fit_contig},
    });
    // Fork cost: a table of n tokens, forked 200 times (each fork released again).
    for n in [1024usize, 32 * 1024] {
        let mut kv = pool(n.div_ceil(ps) + 4, usize::MAX);
        let mut t = kv.new_table(None);
        // Pages reserved and committed as a computed sequence's would be (their K/V
        // does not matter to a fork).
        let tokens: Vec<u32> = (0..n as u32).map(|i| i % 1000).collect();
        kv.plan(&mut t, &tokens, Logits::None)?;
        kv.commit(&mut t)?;
        let reps = 200;
        let start = Instant::now();
        for _ in 0..reps {
            let f = kv.fork(&mut t)?;
            kv.release(f)?;
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / reps as f64;
        println!(
            "- fork at {n} tokens of context: {us:.2} µs ({} committed pages shared through one fork group, no per-page reference)",
            t.num_pages()
        );
        figures[format!("fork_us_at_{n}")] = json!(us);
    }
    // Prefill of a 2000-token prompt, cold, then as a new request whose prefix is indexed.
    let prompt = bench_prompt(model, 2000);
    let mut kv = pool(2 * 2048usize.div_ceil(ps) + 4, 4096);
    // The same prompt twice, each in a new table: the second finds the first's pages.
    // TTFT: prefix lookup, prefill of the rest, and the first token picked.
    let mut run = || -> Result<(f64, usize)> {
        let mut t = kv.new_table(None);
        let start = Instant::now();
        let mut seq = kv.seq(&mut t);
        let hit = seq.reuse_prefix(&prompt);
        let logits = forward_one(model, &mut seq, &prompt[hit..], Logits::Last)?;
        std::hint::black_box(argmax(&logits));
        Ok((start.elapsed().as_secs_f64(), hit))
    };
    let (cold, _) = run()?;
    let (warm, hit) = run()?;
    println!(
        "- 2000-token prompt: cold TTFT {:.0} ms | warm (prefix indexed) TTFT {:.1} ms, {hit} tokens from cache = {:.1}% of cold",
        cold * 1e3,
        warm * 1e3,
        100.0 * warm / cold
    );
    figures["ttft_2000_tokens_s"] = json!({"cold": cold, "warm": warm, "cached_tokens": hit});
    report.add("kv", figures);
    Ok(())
}

/// Reads `path` through once (into a small buffer: nothing stays resident), so that a
/// load after it finds the file in the page cache. Best effort: an unreadable file is
/// left to the load to report.
fn warm_page_cache(path: &std::path::Path) {
    use std::io::Read;
    if let Ok(mut f) = std::fs::File::open(path) {
        let mut buf = vec![0u8; 8 << 20];
        while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
    }
}

/// llama.cpp's prefill/decode baseline: an interpreter with llama-cpp-python and the
/// bench script written out once for all rounds (removed when dropped).
struct LlamaBench {
    python: String,
    script: std::path::PathBuf,
}

impl LlamaBench {
    /// None (with a note) when the interpreter has no llama_cpp module.
    fn find(a: &Args) -> Result<Option<Self>> {
        let python = a
            .llama_python
            .clone()
            .or_else(|| std::env::var("FOLIO_LLAMA_PYTHON").ok())
            .unwrap_or_else(|| "python3".into());
        let has = std::process::Command::new(&python)
            .args(["-c", "import llama_cpp"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has {
            println!("(llama.cpp baseline skipped: `{python}` has no llama_cpp module; set FOLIO_LLAMA_PYTHON)");
            return Ok(None);
        }
        let script =
            std::env::temp_dir().join(format!("folio_llama_bench_{}.py", std::process::id()));
        std::fs::write(&script, LLAMA_BENCH)?;
        Ok(Some(Self { python, script }))
    }

    /// One round of llama.cpp's (pp, tg) tok/s and its load time in seconds.
    fn round(&self, a: &Args, threads: usize) -> Result<(f64, f64, f64)> {
        let out = std::process::Command::new(&self.python)
            .arg(&self.script)
            .arg(a.model.path()?)
            .args([threads, a.pp, a.tg, 1].map(|v| v.to_string()))
            .output()
            .context("running the llama.cpp baseline")?;
        anyhow::ensure!(
            out.status.success(),
            "llama.cpp baseline failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or(""))
            .context("parsing the llama.cpp baseline's output")?;
        Ok((
            v["pp_tok_s"].as_f64().unwrap_or(0.0),
            v["tg_tok_s"].as_f64().unwrap_or(0.0),
            v["load_s"].as_f64().unwrap_or(0.0),
        ))
    }
}

impl Drop for LlamaBench {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.script);
    }
}
