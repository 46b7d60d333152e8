//! `folio bench --serve-figures`: folio's HTTP server and, when given, llama.cpp's
//! (`llama-server`), each started as its own process on loopback and driven by the
//! same client over the same OpenAI route (`/v1/completions`, streamed, token-id
//! prompts, greedy, `ignore_eos`) under the same loads: 1, 16 and 32 concurrent
//! clients, with distinct 100-token prompts and with prompts sharing a 1000-token
//! prefix; each load runs on folio, then on llama.cpp, before the next. Then each
//! server's TTFT of an 1100-token prompt cold vs with its prefix cached (llama.cpp's
//! slots hold 1200 tokens), and each
//! server's peak RSS.

use crate::report::Report;
use anyhow::{bail, Context, Result};
use folio::Model;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tokens of the prefix whose TTFT is measured cold and warm.
const PREFIX: usize = 1100;

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

/// What the serving figures run.
pub struct ServeArgs {
    pub model: PathBuf,
    pub threads: usize,
    pub page_size: usize,
    pub kv_pages: usize,
    pub max_batch_tokens: usize,
    pub llama_server: Option<PathBuf>,
}

/// A server process; killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn folio(a: &ServeArgs) -> Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["serve", "--port", "0", "--ctx", "4096"])
            .arg("--model")
            .arg(&a.model)
            .args(["--threads", &a.threads.to_string()])
            .args(["--page-size", &a.page_size.to_string()])
            .args(["--kv-pages", &a.kv_pages.to_string()])
            .args(["--max-batch-tokens", &a.max_batch_tokens.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().context("the server's stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("folio serve did not say where it listens: {line:?}"))?;
        Ok(Self {
            name: "folio",
            child,
            addr,
        })
    }

    fn llama(exe: &Path, a: &ServeArgs, slots: usize) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(exe)
            .arg("-m")
            .arg(&a.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-np", &slots.to_string(), "-c", &(slots * 1200).to_string()])
            .args(["-t", &a.threads.to_string(), "-tb", &a.threads.to_string()])
            .arg("--no-webui")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let s = Self {
            name: "llama.cpp",
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let end = Instant::now() + Duration::from_secs(120);
        while Instant::now() < end {
            if get_status(s.addr, "/health").is_ok_and(|st| st == 200) {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("llama-server did not become healthy in 120 s")
    }

    /// Peak resident memory so far (Linux), in MiB.
    fn peak_rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kb: f64 = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    }
}

fn get_status(addr: SocketAddr, path: &str) -> Result<u16> {
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status")
}

/// Sends one streamed completion; returns (time to the first text, text chunks).
fn stream_one(addr: SocketAddr, body: &Value) -> Result<(Duration, usize)> {
    let body = body.to_string();
    let t = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    let (mut first, mut chunks, mut line) = (None, 0, String::new());
    r.read_line(&mut line)?;
    if !line.contains(" 200 ") {
        bail!("the server answered {}", line.trim());
    }
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data)?;
        if v.get("error").is_some() {
            bail!("the stream failed: {v}");
        }
        if v["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty())
        {
            first.get_or_insert(t.elapsed());
            chunks += 1;
        }
    }
    Ok((first.context("no text came")?, chunks))
}

struct Load {
    output_tok_s: f64,
    ttft_p50: f64,
    ttft_p95: f64,
    /// Every request's TTFT, ascending.
    ttfts: Vec<f64>,
}

/// `clients` threads sending `prompts` (each `max_tokens` long, greedy, ignore_eos)
/// one after another.
fn drive(
    addr: SocketAddr,
    prompts: &[Vec<u32>],
    clients: usize,
    max_tokens: usize,
) -> Result<Load> {
    let queue = Arc::new(Mutex::new(prompts.to_vec()));
    let ttfts = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (q, ttfts) = (queue.clone(), ttfts.clone());
            std::thread::spawn(move || -> Result<()> {
                loop {
                    let Some(p) = q.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                        return Ok(());
                    };
                    let body = json!({"prompt": p, "max_tokens": max_tokens, "stream": true,
                        "temperature": 0, "ignore_eos": true, "cache_prompt": true});
                    let (ttft, _) = stream_one(addr, &body)?;
                    ttfts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(ttft.as_secs_f64());
                }
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    let wall = start.elapsed().as_secs_f64();
    let mut t = ttfts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    t.sort_by(f64::total_cmp);
    let pct = |p: f64| t[((t.len() as f64 * p).ceil() as usize).clamp(1, t.len()) - 1];
    Ok(Load {
        output_tok_s: (prompts.len() * max_tokens) as f64 / wall,
        ttft_p50: pct(0.5),
        ttft_p95: pct(0.95),
        ttfts: t,
    })
}

pub fn run(report: &mut Report, a: ServeArgs) -> Result<()> {
    let model = Model::load(&a.model, 1)?;
    let max_tokens = 64;
    let folio = Server::folio(&a)?;
    let llama = match &a.llama_server {
        Some(exe) => match Server::llama(exe, &a, 32) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("llama.cpp's server could not start ({e:#}); folio's figures alone");
                None
            }
        },
        None => None,
    };
    let mut servers = vec![&folio];
    servers.extend(llama.as_ref());
    println!();
    println!(
        "Serving over HTTP: /v1/completions, streamed, greedy, {max_tokens} output tokens per request, {} threads; folio at {}{}",
        a.threads,
        folio.addr,
        match &llama {
            Some(l) => format!(", llama.cpp's server (32 slots of 1200 tokens) at {}", l.addr),
            None => " (no llama.cpp server: set FOLIO_LLAMA_SERVER to compare)".into(),
        }
    );
    println!("| prompts                  | clients | server    | output tok/s | TTFT p50 s | TTFT p95 s | vs llama.cpp |");
    println!("|--------------------------|---------|-----------|--------------|------------|------------|--------------|");
    let mut seed = 1u64;
    let mut loads = Vec::new();
    for shared in [false, true] {
        for clients in [1usize, 16, 32] {
            seed += 1000;
            let prefix = if shared {
                text_tokens(&model, seed, 1000)
            } else {
                Vec::new()
            };
            let n = clients.max(4);
            let prompts: Vec<Vec<u32>> = (0..n as u64)
                .map(|i| {
                    let mut p = prefix.clone();
                    p.extend(text_tokens(&model, seed + 1 + i, 100));
                    p
                })
                .collect();
            let mut folio_rate = None;
            for s in &servers {
                let r = drive(s.addr, &prompts, clients, max_tokens)
                    .with_context(|| format!("{} under {clients} clients", s.name))?;
                let ratio = match folio_rate {
                    None => {
                        folio_rate = Some(r.output_tok_s);
                        String::new()
                    }
                    Some(f) => format!("folio {:.2}x", f / r.output_tok_s),
                };
                let what = if shared {
                    "shared 1000-token prefix"
                } else {
                    "distinct 100 tokens"
                };
                println!(
                    "| {what:<24} | {clients:>7} | {:<9} | {:>12.1} | {:>10.2} | {:>10.2} | {ratio:>12} |",
                    s.name, r.output_tok_s, r.ttft_p50, r.ttft_p95,
                );
                loads.push(
                    json!({"prompts": what, "shared_prefix": shared, "clients": clients,
                    "requests": prompts.len(), "server": s.name, "output_tok_s": r.output_tok_s,
                    "ttft_p50_s": r.ttft_p50, "ttft_p95_s": r.ttft_p95, "ttfts_s": r.ttfts}),
                );
            }
        }
    }

    // Warm-prefix TTFT on each server: the same 1100-token prefix (what a llama.cpp
    // slot holds), a new 20-token question; a fresh prefix, so neither server has seen
    // it before the cold request.
    let prefix = text_tokens(&model, 4242, PREFIX);
    let ttft = |addr: SocketAddr, suffix_seed: u64| -> Result<f64> {
        let mut p = prefix.clone();
        p.extend(text_tokens(&model, suffix_seed, 20));
        let body = json!({"prompt": p, "max_tokens": 1, "stream": true, "temperature": 0,
            "cache_prompt": true});
        Ok(stream_one(addr, &body)?.0.as_secs_f64())
    };
    let mut warm_cold = serde_json::Map::new();
    for s in &servers {
        match ttft(s.addr, 1).and_then(|cold| Ok((cold, ttft(s.addr, 2)?))) {
            Ok((cold, warm)) => {
                println!(
                    "{}, {PREFIX}-token prefix over HTTP: TTFT cold {cold:.2} s, warm {warm:.3} s = {:.1}% of cold",
                    s.name,
                    100.0 * warm / cold
                );
                warm_cold.insert(s.name.into(), json!({"cold_s": cold, "warm_s": warm}));
            }
            Err(e) => println!("{}, {PREFIX}-token prefix: not measured ({e:#})", s.name),
        }
    }
    let mut rss = serde_json::Map::new();
    for s in &servers {
        if let Some(mib) = s.peak_rss_mib() {
            println!("{} server peak RSS: {mib:.0} MiB", s.name);
            rss.insert(s.name.into(), json!(mib));
        }
    }
    report.add(
        "serve",
        json!({"route": "/v1/completions", "max_tokens": max_tokens, "threads": a.threads,
               "llama_server": llama.as_ref().map(|_| "llama-server, 32 slots of 1200 tokens"),
               "loads": loads, "prefix_tokens": PREFIX, "prefix_ttft": warm_cold, "peak_rss_mib": rss}),
    );
    Ok(())
}
