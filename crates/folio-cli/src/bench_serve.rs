//! `folio bench --serve-figures`: the engine under concurrent clients. Output tok/s and
//! TTFT p50/p95 at concurrency 1, 4, 16 and 32, for distinct prompts and for prompts
//! sharing a 1000-token prefix; and the TTFT of a request whose 2000-token prefix is
//! already indexed, as a share of the same request cold.

use anyhow::Result;
use folio::engine::{Engine, EngineConfig, Event, Prompt, Request};
use folio::model::{Model, SamplingParams};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WORDS: &[&str] = &[
    "river", "stone", "lamp", "orchard", "copper", "signal", "harbor", "meadow", "ledger",
    "violet", "engine", "canvas", "thunder", "pepper", "lattice", "quiet", "marble", "falcon",
];

/// `n` tokens of varied text, different for each `seed`.
fn text_tokens(model: &Model, seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut words = String::new();
    let mut toks = Vec::new();
    while toks.len() < n {
        for _ in 0..32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            words.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
            words.push(' ');
        }
        toks = model.tokenizer.encode(&words, false);
    }
    toks.truncate(n);
    toks
}

struct Run {
    output_tok_s: f64,
    ttft_p50: Duration,
    ttft_p95: Duration,
}

/// `clients` threads, each sending its share of `prompts` one after another.
fn run_clients(engine: &Engine, prompts: Vec<Vec<u32>>, clients: usize, max_tokens: usize) -> Run {
    let queue = Arc::new(Mutex::new(prompts));
    let ttfts = Arc::new(Mutex::new(Vec::new()));
    let tokens = Arc::new(Mutex::new(0usize));
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (q, ttfts, tokens, e) =
                (queue.clone(), ttfts.clone(), tokens.clone(), engine.clone());
            std::thread::spawn(move || loop {
                let Some(p) = q.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                    break;
                };
                let mut r = Request::new(Prompt::Tokens(p));
                r.max_tokens = max_tokens;
                r.ignore_eos = true;
                r.sampling = SamplingParams::default();
                let t = Instant::now();
                let Ok(stream) = e.submit(r) else { break };
                let mut first = None;
                let mut n = 0;
                for ev in stream {
                    match ev {
                        Event::Token { .. } => {
                            first.get_or_insert(t.elapsed());
                            n += 1;
                        }
                        Event::Done { .. } | Event::Error(_) => break,
                        Event::PromptLogprobs(_) => {}
                    }
                }
                if let Some(f) = first {
                    ttfts.lock().unwrap_or_else(|e| e.into_inner()).push(f);
                }
                *tokens.lock().unwrap_or_else(|e| e.into_inner()) += n;
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let wall = start.elapsed().as_secs_f64();
    let mut t = ttfts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    t.sort();
    let pct = |p: f64| {
        t.get(((t.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    let n = *tokens.lock().unwrap_or_else(|e| e.into_inner());
    Run {
        output_tok_s: n as f64 / wall,
        ttft_p50: pct(0.5),
        ttft_p95: pct(0.95),
    }
}

const SERVER_BENCH: &str = include_str!("../../../scripts/llama_server_bench.py");

/// llama.cpp's server under the same 16-client load: (distinct, shared) output tok/s.
pub fn llama_server(
    exe: &std::path::Path,
    model: &std::path::Path,
    threads: usize,
) -> Result<Option<(f64, f64)>> {
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", SERVER_BENCH, "--server"])
        .arg(exe)
        .arg("--model")
        .arg(model)
        .args(["--threads", &threads.to_string()]);
    let Some(out) = crate::figures::baseline_output(&mut cmd, "llama-server bench")? else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_slice(&out)?;
    let get = |k: &str| v[k]["output_tok_s"].as_f64();
    for k in ["distinct", "shared"] {
        println!(
            "llama.cpp server, 16 slots, {k}: {:.1} output tok/s, TTFT p50 {:.2} s, p95 {:.2} s",
            get(k).unwrap_or(0.0),
            v[k]["ttft_p50"].as_f64().unwrap_or(0.0),
            v[k]["ttft_p95"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(get("distinct").zip(get("shared")))
}

/// Engine settings of the serving figures.
pub struct ServeArgs {
    pub page_size: usize,
    pub kv_pages: usize,
    pub max_batch_tokens: usize,
    pub kv_dtype: folio::kv::KvDtype,
}

pub fn run(model: Model, cfg: ServeArgs, llama_server: Option<(f64, f64)>) -> Result<()> {
    let ServeArgs {
        page_size,
        kv_pages,
        max_batch_tokens,
        kv_dtype,
    } = cfg;
    let engine = Engine::new(
        model,
        EngineConfig {
            kv_pages,
            page_size,
            max_batch_tokens,
            kv_dtype,
            ..EngineConfig::default()
        },
    )?;
    let m = engine.model();
    let max_tokens = 64;
    println!();
    println!("Serving (in-process engine, greedy, {max_tokens} output tokens per request, 100-token distinct part, max {max_batch_tokens} tokens per step)");
    println!("| prompts                  | clients | requests | output tok/s | TTFT p50 s | TTFT p95 s |");
    println!("|--------------------------|---------|----------|--------------|------------|------------|");
    let mut seed = 1u64;
    let mut at16 = (0.0, 0.0);
    for shared in [false, true] {
        let prefix = if shared {
            text_tokens(m, 999, 1000)
        } else {
            Vec::new()
        };
        for clients in [1usize, 4, 16, 32] {
            let n = if clients == 1 { 3 } else { clients };
            let prompts: Vec<Vec<u32>> = (0..n)
                .map(|_| {
                    seed += 1;
                    let mut p = prefix.clone();
                    p.extend(text_tokens(m, seed, 100));
                    p
                })
                .collect();
            let r = run_clients(&engine, prompts, clients, max_tokens);
            if clients == 16 {
                if shared {
                    at16.1 = r.output_tok_s;
                } else {
                    at16.0 = r.output_tok_s;
                }
            }
            println!(
                "| {:<24} | {clients:>7} | {n:>8} | {:>12.1} | {:>10.2} | {:>10.2} |",
                if shared {
                    "shared 1000-token prefix"
                } else {
                    "distinct"
                },
                r.output_tok_s,
                r.ttft_p50.as_secs_f64(),
                r.ttft_p95.as_secs_f64()
            );
        }
    }
    if let Some((distinct, shared)) = llama_server {
        println!(
            "16 clients vs llama.cpp's server (16 slots): distinct {:.2}x ({:.1} vs {distinct:.1} tok/s), shared prefix {:.2}x ({:.1} vs {shared:.1} tok/s)",
            at16.0 / distinct,
            at16.0,
            at16.1 / shared,
            at16.1
        );
    }

    // Warm-prefix TTFT: the same 2000-token prefix, a new 20-token question.
    let prefix = text_tokens(m, 4242, 2000);
    let ttft = |suffix_seed: u64| -> Result<Duration> {
        let mut p = prefix.clone();
        p.extend(text_tokens(m, suffix_seed, 20));
        let mut r = Request::new(Prompt::Tokens(p));
        r.max_tokens = 1;
        let t = Instant::now();
        let s = engine.submit(r)?;
        for ev in s {
            if let Event::Token { .. } = ev {
                return Ok(t.elapsed());
            }
        }
        anyhow::bail!("no token")
    };
    let cold = ttft(1)?;
    let warm = ttft(2)?;
    println!(
        "2000-token prefix: TTFT cold {:.2} s, warm {:.3} s = {:.1}% of cold",
        cold.as_secs_f64(),
        warm.as_secs_f64(),
        100.0 * warm.as_secs_f64() / cold.as_secs_f64()
    );
    let st = engine.stats()?;
    println!(
        "engine: {} steps, {} preemptions, {} prefix-hit tokens, {} prefilled tokens",
        st.steps, st.preemptions, st.prefix_hit_tokens, st.prefilled_tokens
    );
    Ok(())
}
