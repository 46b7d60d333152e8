//! The soak: random requests from eight clients against one `folio serve` with a
//! small pool (so pages are evicted and sequences preempted): completions and chats
//! with random `max_tokens`, `n` and temperature, streamed or not, a third of them
//! hung up midway; contexts created, appended to, forked, truncated, generated into
//! (also hung up) and deleted. Every answer is a success or a named refusal (409,
//! 429, 503), never another error; the page store's invariants hold throughout; at
//! the end every page is free or cached; the server's resident memory stays flat
//! after warm-up (the curve is printed). The disk tier is on, smaller than the
//! working set (pages are read back, and evicted from disk too): its files stay
//! under `--kv-disk-size` and are exactly what its index counts.
//!
//! `FOLIO_SOAK_REQUESTS` sets the number of requests (200 by default; the long form
//! runs 2000: scripts/soak.sh).

use crate::client::{connect, get, open_stream, post, request, send, Resp};
use crate::server;
use folio::rng::SplitMix64;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: u64 = 8;
/// Live contexts one client keeps at most.
const CONTEXTS_PER_CLIENT: usize = 2;
/// A context longer than this is truncated rather than grown (the window is 1024).
const CONTEXT_TOKENS: u64 = 200;

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Name three prime numbers.",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "What is a linked list?",
    "Why is the sky blue?",
    "Give me a word that rhymes with moon.",
    "Count from one to ten.",
];

/// A prompt: a shared system-like prefix (prefix hits), a question alone, or one of
/// six documents of about ten pages before it (together more than the pool holds, so
/// their pages are evicted and read back from the disk tier).
fn prompt(rng: &mut SplitMix64) -> String {
    let q = QUESTIONS[rng.below(QUESTIONS.len() as u64) as usize];
    match rng.below(3) {
        0 => format!("You are a careful assistant. Answer in one short paragraph, plainly and without lists. {q}"),
        1 => q.to_string(),
        _ => {
            let k = rng.below(6);
            let doc: String = (0..12)
                .map(|i| format!("Record {k}-{i}: the shipment of {} crates left port {} on day {}. ", 7 * i + k, 3 + i, 11 * k + i))
                .collect();
            format!("{doc}Given these records: {q}")
        }
    }
}

#[derive(Default)]
struct Tally {
    statuses: BTreeMap<u16, usize>,
    hung_up: usize,
    failures: Vec<String>,
}

struct Shared {
    addr: SocketAddr,
    pid: u32,
    total: usize,
    next: AtomicUsize,
    tally: Mutex<Tally>,
    /// (requests sent, RSS in KiB).
    rss: Mutex<Vec<(usize, u64)>>,
}

impl Shared {
    fn record(&self, what: &str, r: &Resp) {
        let mut t = self.tally.lock().unwrap();
        *t.statuses.entry(r.status).or_default() += 1;
        let refused = matches!(r.status, 409 | 429 | 503);
        if !(200..300).contains(&r.status) && !refused {
            t.failures
                .push(format!("{what}: {} {}", r.status, r.text()));
        }
        if refused {
            // A refusal still comes in the envelope.
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            if v["error"]["message"].as_str().unwrap_or("").is_empty() {
                t.failures
                    .push(format!("{what}: {} without a message", r.status));
            }
        }
    }

    fn hung_up(&self) {
        self.tally.lock().unwrap().hung_up += 1;
    }

    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
    }
}

/// Reads a stream to its end, or hangs up after `keep` events when `keep` is set.
/// A refusal (not 200) comes back whole; a stream gives whether it ended with
/// `[DONE]` after its events.
fn stream(addr: SocketAddr, path: &str, body: &Value, keep: Option<u64>) -> Result<bool, Resp> {
    let mut open = open_stream(addr, path, body);
    if open.status != 200 {
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut open.reader, &mut rest);
        return Err(Resp {
            status: open.status,
            headers: Vec::new(),
            body: rest,
        });
    }
    let mut seen = 0;
    while let Some(ev) = open.next_event() {
        if ev == "[DONE]" {
            return Ok(true);
        }
        seen += 1;
        if keep.is_some_and(|k| seen >= k) {
            return Ok(false);
        }
    }
    Ok(false)
}

/// Sends a request and hangs up before the answer.
fn send_and_hang_up(addr: SocketAddr, path: &str, body: &Value, wait_ms: u64) {
    let mut s = connect(addr);
    send(&mut s, "POST", path, &[], body.to_string().as_bytes());
    std::thread::sleep(Duration::from_millis(wait_ms));
}

/// Sampling fields: random max_tokens, n, temperature and seed.
fn sampling(rng: &mut SplitMix64, most: u64) -> Value {
    let temperature = if rng.below(2) == 0 { 0.0 } else { 0.8 };
    json!({
        "max_tokens": 1 + rng.below(most),
        "n": 1 + rng.below(3),
        "temperature": temperature,
        "seed": rng.below(1000),
    })
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// One generation (completion, chat or context generate): whole, streamed, or hung
/// up midway.
fn generate(sh: &Shared, rng: &mut SplitMix64, path: &str, body: Value) {
    let a = sh.addr;
    let streamed = merge(body.clone(), json!({"stream": true}));
    let way = rng.below(6);
    let keep = (way == 1).then(|| rng.below(4));
    match way {
        0 => {
            send_and_hang_up(a, path, &body, rng.below(30));
            sh.hung_up();
        }
        1..=3 => match stream(a, path, &streamed, keep) {
            Ok(_) if keep.is_some() => sh.hung_up(),
            Ok(true) => {
                *sh.tally.lock().unwrap().statuses.entry(200).or_default() += 1;
            }
            Ok(false) => sh
                .tally
                .lock()
                .unwrap()
                .failures
                .push(format!("{path}: a stream ended without [DONE]")),
            Err(refused) => sh.record(path, &refused),
        },
        _ => sh.record(path, &post(a, path, &body)),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Completion,
    Chat,
    Create,
    Fork,
    Delete,
    Truncate,
    /// Truncate half of a context grown long.
    Halve,
    Append,
    Generate,
}

/// One client: random operations until the shared count runs out.
fn client(sh: &Shared, seed: u64) {
    let mut rng = SplitMix64(seed);
    let a = sh.addr;
    // This client's contexts: (id, tokens it holds, as last seen).
    let mut mine: Vec<(String, u64)> = Vec::new();
    loop {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= sh.total {
            break;
        }
        let every = (sh.total / 20).max(1);
        if i.is_multiple_of(every) {
            // The write-behind queue drains.
            let queued = || crate::client::metric(a, "folio:kv_disk_write_queue", "");
            let end = Instant::now() + Duration::from_secs(10);
            while queued() > 0.0 && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
            }
            let check = get(a, "/v1/kv/check");
            if check.status != 200 {
                sh.tally
                    .lock()
                    .unwrap()
                    .failures
                    .push(format!("request {i}: invariants: {}", check.text()));
            }
            sh.rss.lock().unwrap().push((i, sh.rss_kib()));
        }
        let pick = rng.below(100);
        let room = mine.len() < CONTEXTS_PER_CLIENT;
        let c = rng.below(mine.len().max(1) as u64) as usize;
        let op = match pick {
            _ if mine.is_empty() && pick >= 50 => Op::Create,
            0..=34 => Op::Completion,
            35..=49 => Op::Chat,
            50..=59 if room => Op::Create,
            50..=59 => Op::Completion,
            60..=69 if room => Op::Fork,
            60..=69 => Op::Delete,
            70..=79 => Op::Truncate,
            _ if mine[c].1 >= CONTEXT_TOKENS => Op::Halve,
            80..=87 => Op::Append,
            _ => Op::Generate,
        };
        let base = mine.get(c).map(|m| format!("/v1/contexts/{}", m.0));
        let ctx_path = |what: &str| format!("{}/{what}", base.as_deref().unwrap_or(""));
        match op {
            Op::Completion => {
                let body = merge(json!({"prompt": prompt(&mut rng)}), sampling(&mut rng, 40));
                generate(sh, &mut rng, "/v1/completions", body);
            }
            Op::Chat => {
                let msgs = json!([{"role": "user", "content": prompt(&mut rng)}]);
                let body = merge(json!({"messages": msgs}), sampling(&mut rng, 40));
                generate(sh, &mut rng, "/v1/chat/completions", body);
            }
            Op::Create | Op::Fork => {
                let r = match op {
                    Op::Create => post(a, "/v1/contexts", &json!({"system": "You are terse."})),
                    _ => post(a, &ctx_path("fork"), &json!({})),
                };
                sh.record("create or fork", &r);
                if r.status == 201 {
                    let v = r.json();
                    let id = v["id"].as_str().unwrap().to_string();
                    mine.push((id, v["seq_len"].as_u64().unwrap()));
                }
            }
            Op::Delete => {
                let (id, _) = mine.swap_remove(c);
                let r = request(a, "DELETE", &format!("/v1/contexts/{id}"), &[], b"");
                sh.record("delete", &r);
            }
            Op::Truncate | Op::Halve => {
                let info = get(a, base.as_deref().unwrap_or(""));
                if info.status == 200 {
                    mine[c].1 = info.json()["seq_len"].as_u64().unwrap();
                }
                let len = mine[c].1;
                let drop = match op {
                    Op::Halve => len / 2,
                    _ if len > 1 => 1 + rng.below(len - 1),
                    _ => 0,
                };
                let r = post(a, &ctx_path("truncate"), &json!({ "tokens": drop }));
                sh.record("truncate", &r);
                if r.status == 200 {
                    mine[c].1 = r.json()["seq_len"].as_u64().unwrap();
                }
            }
            Op::Append => {
                let msg = json!({"messages": [{"role": "user", "content": prompt(&mut rng)}]});
                let r = post(a, &ctx_path("append"), &msg);
                sh.record("append", &r);
                if r.status == 200 {
                    mine[c].1 = r.json()["seq_len"].as_u64().unwrap();
                }
            }
            Op::Generate => {
                let mut body = sampling(&mut rng, 16);
                body["n"] = json!(1);
                let path = ctx_path("generate");
                generate(sh, &mut rng, &path, body);
                mine[c].1 += 16;
            }
        }
    }
    for (id, _) in mine {
        // A context still busy with a hung-up generation is freed once it is idle.
        let _ = request(a, "DELETE", &format!("/v1/contexts/{id}"), &[], b"");
    }
}

#[test]
fn soak_of_random_requests_ends_with_every_page_free_or_cached_and_memory_flat() {
    let total: usize = std::env::var("FOLIO_SOAK_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // 48 pages of 16 tokens: eight clients, n up to 3 and contexts need more, so
    // cached pages are evicted and running sequences preempted.
    // The disk tier: about 85 pages' worth (a page file is about 0.37 MB), less than
    // the soak writes.
    let disk = tempfile::tempdir().unwrap();
    let disk_max: u64 = 32 << 20;
    let s = server::start(&[
        "--ctx",
        "1024",
        "--kv-pages",
        "48",
        "--max-contexts",
        "16",
        "--kv-disk",
        disk.path().to_str().unwrap(),
        "--kv-disk-size",
        &disk_max.to_string(),
    ]);
    let sh = Arc::new(Shared {
        addr: s.addr,
        pid: s.pid(),
        total,
        next: AtomicUsize::new(0),
        tally: Mutex::new(Tally::default()),
        rss: Mutex::new(Vec::new()),
    });
    let began = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let sh = sh.clone();
            std::thread::spawn(move || client(&sh, 0x5eed + k))
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let took = began.elapsed();
    let a = s.addr;
    // Every page free or cached once the last cancellation is through.
    let totals = || get(a, "/v1/kv").json()["totals"].clone();
    let end = Instant::now() + Duration::from_secs(10);
    let mut t = totals();
    while (t["working"] != 0 || t["committed"] != 0 || t["running"] != 0) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        t = totals();
    }
    // The write-behind queue drains.
    let queued = || crate::client::metric(a, "folio:kv_disk_write_queue", "");
    let end = Instant::now() + Duration::from_secs(10);
    while queued() > 0.0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let check = get(a, "/v1/kv/check");
    let contexts = get(a, "/v1/contexts").json()["data"].clone();
    let metrics = get(a, "/metrics").text();
    let metric = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("?")
            .to_string()
    };
    let on_disk: u64 = std::fs::read_dir(disk.path())
        .unwrap()
        .flatten()
        .filter(|d| d.path().is_dir())
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .filter(|f| f.path().extension().is_some_and(|x| x == "page"))
        .map(|f| f.metadata().unwrap().len())
        .sum();
    let rss_end = s.rss_kib().unwrap_or(0);
    let mut curve = sh.rss.lock().unwrap().clone();
    curve.sort();
    curve.push((total, rss_end));
    let tally = std::mem::take(&mut *sh.tally.lock().unwrap());
    eprintln!(
        "soak: {total} requests from {CLIENTS} clients in {took:.1?}; statuses {:?}; {} hung up",
        tally.statuses, tally.hung_up
    );
    eprintln!(
        "soak: preemptions {}, evictions {}, cancelled {}; pages at the end {t}",
        metric("folio:num_preemptions_total"),
        metric("folio:kv_evictions_total"),
        metric("folio:requests_cancelled_total"),
    );
    eprintln!(
        "soak: disk tier: {} pages, {} bytes of {disk_max}, {} hits, {} misses, {} writes, {} dropped, {} skipped",
        metric("folio:kv_disk_pages"),
        metric("folio:kv_disk_bytes"),
        metric("folio:kv_disk_hits_total"),
        metric("folio:kv_disk_misses_total"),
        metric("folio:kv_disk_writes_total"),
        metric("folio:kv_disk_writes_dropped_total"),
        metric("folio:kv_disk_skipped_files_total"),
    );
    eprintln!(
        "soak: RSS (MiB) by requests sent: {}",
        curve
            .iter()
            .map(|(i, k)| format!("{i}:{:.1}", *k as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(tally.failures.is_empty(), "{:#?}", tally.failures);
    assert_eq!(check.status, 200, "{}", check.text());
    assert_eq!(contexts, json!([]), "every context was deleted");
    assert!(on_disk <= disk_max, "{on_disk} bytes on disk");
    assert_eq!(
        metric("folio:kv_disk_bytes"),
        on_disk.to_string(),
        "the files are what the disk index counts"
    );
    assert_eq!(metric("folio:kv_disk_skipped_files_total"), "0");
    assert_ne!(
        metric("folio:kv_disk_hits_total"),
        "0",
        "pages were read back"
    );
    assert_eq!(t["working"], 0, "{t}");
    assert_eq!(t["committed"], 0, "{t}");
    assert_eq!(t["pinned"], 0, "{t}");
    assert_eq!(
        t["free"].as_u64().unwrap() + t["cached"].as_u64().unwrap(),
        t["pages"].as_u64().unwrap(),
        "{t}"
    );
    // Flat after warm-up: from the first quarter on, the resident size grows by at
    // most a quarter (allocator arenas settle; a leak per request grows with them).
    let warm = curve
        .iter()
        .find(|(i, _)| *i >= total / 4)
        .map_or(0, |&(_, k)| k);
    let peak = curve
        .iter()
        .filter(|(i, _)| *i >= total / 4)
        .map(|&(_, k)| k)
        .max()
        .unwrap_or(0);
    assert!(
        warm > 0 && peak <= warm + warm / 4,
        "RSS grew from {warm} KiB after warm-up to {peak} KiB"
    );
}
