//! scripts/cluster.sh as an operator runs it: two `folio serve` replicas (one forward
//! thread each) behind the SGLang model gateway (PyPI `smg`, `--policy cache_aware`,
//! installed into `target/smg-venv` by the script) on loopback. One replica is killed
//! with SIGKILL while both serve a steady load of greedy chat requests, streamed and
//! whole: only requests in flight at the kill may fail, every other answer is the one a
//! single replica gives for its prompt, the replica restarts on its port and the gateway
//! sends it traffic again. Skipped, with the reason printed, only where smg cannot be
//! installed (no python3 venv, no PyPI). `FOLIO_CLUSTER_KILLS=N` is the long form: N
//! kills and restarts, of replica 1 and 0 in turn, with totals. Then the nginx variant (Debian's `nginx`;
//! skipped where it is not installed): every turn of a conversation reaches the replica
//! its first turn did, a killed replica's conversations go on elsewhere, and the
//! restarted replica gets them back. Last, smg with sticky sessions (docs/cluster.md's
//! advice for chat): conversations named in `X-SMG-Routing-Key` spread over both
//! replicas and stay each on one.

#[allow(dead_code)]
#[path = "common/server.rs"]
mod server;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAX_TOKENS: u64 = 16;
const CLIENTS: usize = 4;
const READ_TIMEOUT: Duration = Duration::from_secs(20);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cargo target folder the binary was built in (`target/release/folio` → `target`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_folio"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo().join("target"))
}

fn show(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A cluster started by scripts/cluster.sh in a directory of its own: `down` when
/// dropped, then SIGKILL to any process group whose pid file is still there.
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    /// A cluster directory with smg installed; None, with the reason printed, where smg
    /// cannot be installed (no python3 venv, no PyPI).
    fn with_smg() -> Option<Cluster> {
        let cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
        };
        let smg = cluster.script(&["install-smg"]);
        if !smg.status.success() {
            eprintln!(
                "skipped: smg (the SGLang model gateway, PyPI) could not be installed: {}",
                show(&smg)
            );
            return None;
        }
        Some(cluster)
    }

    fn script(&self, args: &[&str]) -> Output {
        Command::new(repo().join("scripts/cluster.sh"))
            .args(args)
            .env("FOLIO_CLUSTER_DIR", self.dir.path())
            .env("FOLIO_BIN", env!("CARGO_BIN_EXE_folio"))
            .env("FOLIO_MODEL", server::model())
            .env("FOLIO_SMG_VENV", target_dir().join("smg-venv"))
            .output()
            .expect("run scripts/cluster.sh")
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.script(args);
        assert!(out.status.success(), "cluster.sh {args:?}: {}", show(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .trim()
            .to_string()
    }

    fn router(&self) -> SocketAddr {
        let env = self.file("cluster.env");
        let port = env
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ROUTER_PORT="))
            .expect("ROUTER_PORT in cluster.env");
        format!("127.0.0.1:{port}").parse().unwrap()
    }

    fn replica(&self, i: usize) -> SocketAddr {
        format!("127.0.0.1:{}", self.file(&format!("replica-{i}.port")))
            .parse()
            .unwrap()
    }

    /// The pids of the router and the replicas, from their pid files.
    fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for e in std::fs::read_dir(self.dir.path()).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "pid") {
                if let Some(pid) = std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// A replica's log, for failure messages.
    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let left = self.pids();
        let _ = self.script(&["down"]);
        for pid in left {
            if alive(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
        }
    }
}

/// A process that runs (a zombie does not count).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
        })
        .unwrap_or(false)
}

/// One POST over a fresh connection, read to its end: the status and the body, or
/// why there was none (refused, reset, cut short).
fn post(addr: SocketAddr, path: &str, body: &Value) -> Result<(u16, String), String> {
    post_as(addr, path, body, None)
}

/// [`post`], with smg's routing-key header when `key` is given.
fn post_as(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    key: Option<&str>,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    // smg has been seen (once in about ten runs) to leave a request that was in flight on
    // the killed replica unanswered for over a minute: a request unanswered for
    // READ_TIMEOUT counts as failed, which only one in flight at the kill may.
    s.set_read_timeout(Some(READ_TIMEOUT)).ok();
    let body = body.to_string();
    let key = key.map_or(String::new(), |k| format!("X-SMG-Routing-Key: {k}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{key}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()))
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no head in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((status, if chunked { dechunk(rest)? } else { rest.into() }))
}

fn dechunk(mut rest: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n").ok_or("chunk cut short")?;
        let n = usize::from_str_radix(size.trim(), 16).map_err(|e| format!("chunk size: {e}"))?;
        if n == 0 {
            return Ok(out);
        }
        if tail.len() < n + 2 {
            return Err("chunk cut short".into());
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    Some(raw)
}

/// The sum over a metric's series in a replica's `/metrics` (None when it does not
/// answer).
fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let text = get(addr, "/metrics")?;
    Some(
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// Distinct first words, so the gateway's prefix tree spreads the prompts.
const TOPICS: [&str; 16] = [
    "Rivers",
    "Volcanoes",
    "Bicycles",
    "Owls",
    "Glaciers",
    "Pianos",
    "Lighthouses",
    "Cacti",
    "Satellites",
    "Honeybees",
    "Deserts",
    "Submarines",
    "Violins",
    "Comets",
    "Forests",
    "Bridges",
];

fn prompt(i: usize) -> String {
    format!("{}: tell me three facts about them, briefly.", TOPICS[i])
}

fn body(i: usize, stream: bool) -> Value {
    json!({
        "model": "folio",
        "messages": [{"role": "user", "content": prompt(i)}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
    })
}

/// The generated text of a 200 answer, whole or streamed (a stream must end with
/// `[DONE]`); Err with what came instead.
fn answer(r: Result<(u16, String), String>, stream: bool) -> Result<String, String> {
    let (status, body) = r?;
    if status != 200 {
        return Err(format!("status {status}: {body}"));
    }
    if !stream {
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        return v["choices"][0]["message"]["content"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no content in {body}"));
    }
    let mut text = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data:")) {
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("{e}: {data}"))?;
        if v.get("error").is_some() {
            return Err(format!("error event: {data}"));
        }
        if let Some(piece) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(piece);
        }
    }
    if !done {
        return Err(format!("stream cut short: {body:?}"));
    }
    Ok(text)
}

struct Outcome {
    start: Instant,
    end: Instant,
    prompt: usize,
    stream: bool,
    result: Result<String, String>,
}

/// One kill of replica `victim` under load and its restart; asserts as the test's doc
/// says.
fn kill_and_restart(
    cluster: &Cluster,
    router: SocketAddr,
    replicas: [SocketAddr; 2],
    reference: &[String],
    victim: usize,
) -> Cycle {
    // Clients send the prompts through the gateway in turn, streamed and whole.
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (stop, outcomes) = (Arc::clone(&stop), Arc::clone(&outcomes));
            std::thread::spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    let i = (c + k * CLIENTS + k) % TOPICS.len();
                    let stream = (c + k) % 2 == 1;
                    let start = Instant::now();
                    let r = post(router, "/v1/chat/completions", &body(i, stream));
                    let result = answer(r, stream);
                    outcomes.lock().unwrap().push(Outcome {
                        start,
                        end: Instant::now(),
                        prompt: i,
                        stream,
                        result,
                    });
                    k += 1;
                }
            })
        })
        .collect();

    // Kill the victim while it has requests running (its own gauge says so).
    std::thread::sleep(Duration::from_millis(1500));
    let deadline = Instant::now() + Duration::from_secs(15);
    let (scraped_at, in_flight) = loop {
        let at = Instant::now();
        let running = metric(replicas[victim], "vllm:num_requests_running").unwrap_or(0.0);
        let waiting = metric(replicas[victim], "vllm:num_requests_waiting").unwrap_or(0.0);
        if running >= 1.0 || Instant::now() > deadline {
            break (at, (running + waiting) as usize);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        in_flight >= 1,
        "the gateway sent replica {victim} nothing in 15 s; router log:\n{}",
        cluster.log("router.log")
    );
    let kill_start = Instant::now();
    cluster.run(&["kill", &victim.to_string()]);
    let killed = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());

    let after = outcomes.iter().filter(|o| o.start >= killed).count();
    let overlapping = outcomes
        .iter()
        .filter(|o| o.start < killed && o.end > kill_start)
        .count();
    let started_near_kill = outcomes
        .iter()
        .filter(|o| o.start >= scraped_at && o.start < killed)
        .count();
    let mut failed = 0;
    let failed_streams = outcomes
        .iter()
        .filter(|o| o.stream && o.result.is_err())
        .count();
    for o in &outcomes {
        match &o.result {
            Ok(text) => assert_eq!(
                text, &reference[o.prompt],
                "prompt {} (stream {}) through the gateway answered differently from one replica",
                o.prompt, o.stream
            ),
            Err(e) => {
                failed += 1;
                assert!(
                    o.start < killed && o.end > kill_start,
                    "a request not in flight at the kill failed (started {:?} after the kill): {e}",
                    o.start.checked_duration_since(killed)
                );
                eprintln!(
                    "in flight at the kill, failed: prompt {} stream {}: {e}",
                    o.prompt, o.stream
                );
            }
        }
    }
    if failed > 0 {
        let log = cluster.log("router.log");
        let tail: Vec<_> = log.lines().rev().take(12).collect();
        eprintln!("the router's log, last lines:");
        for l in tail.into_iter().rev() {
            eprintln!("  {l}");
        }
    }
    assert!(
        failed <= in_flight + started_near_kill,
        "{failed} requests failed, but replica {victim} held {in_flight} (+{started_near_kill} \
         sent between its gauge and the kill)"
    );
    assert!(after >= CLIENTS, "only {after} requests after the kill");
    eprintln!(
        "kill of replica {victim}: {} requests, {} after the kill (all answered as one \
         replica does), {} in flight across the kill, the replica held {} by its gauge, {} \
         failed (the gateway retried the rest)",
        outcomes.len(),
        after,
        overlapping,
        in_flight,
        failed
    );

    // Restart: same port, the gateway's health checks take it back, traffic returns.
    let restarted = Instant::now();
    let old_pid = cluster.file(&format!("replica-{victim}.pid"));
    eprintln!("{}", cluster.run(&["restart", &victim.to_string()]));
    assert_ne!(
        cluster.file(&format!("replica-{victim}.pid")),
        old_pid,
        "not a new process"
    );
    assert_eq!(
        cluster.replica(victim),
        replicas[victim],
        "restarted on another port"
    );
    let served = |a| metric(a, "folio:request_success_total").unwrap_or(0.0);
    let mut sent = 0;
    let back = std::thread::scope(|s| {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            let batch: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let i = (sent + c) % TOPICS.len();
                    s.spawn(move || {
                        (
                            i,
                            answer(post(router, "/v1/chat/completions", &body(i, false)), false),
                        )
                    })
                })
                .collect();
            for h in batch {
                let (i, r) = h.join().unwrap();
                let text = r.unwrap_or_else(|e| panic!("prompt {i} after the restart: {e}"));
                assert_eq!(text, reference[i], "prompt {i} after the restart");
            }
            sent += CLIENTS;
            if served(replicas[victim]) > 0.0 {
                return true;
            }
        }
        false
    });
    assert!(
        back,
        "the gateway sent the restarted replica nothing in 20 s ({sent} requests); status:\n{}",
        String::from_utf8_lossy(&cluster.script(&["status"]).stdout)
    );
    let rejoined = restarted.elapsed().as_secs_f64();
    eprintln!(
        "restart: replica {victim} served again {rejoined:.1} s after `restart` began ({sent} \
         requests sent)"
    );
    Cycle {
        requests: outcomes.len(),
        failed,
        failed_streams,
        in_flight,
        rejoined,
    }
}

struct Cycle {
    requests: usize,
    failed: usize,
    failed_streams: usize,
    in_flight: usize,
    rejoined: f64,
}

#[test]
fn a_replica_killed_under_load_loses_only_its_requests_in_flight_and_rejoins_after_restart() {
    let begun = Instant::now();
    let Some(cluster) = Cluster::with_smg() else {
        return;
    };
    let up = cluster.run(&[
        "up",
        "--replicas",
        "2",
        "--router",
        "smg",
        "--policy",
        "cache_aware",
        "--port",
        "0",
    ]);
    eprintln!("{up}");
    let router = cluster.router();
    let replicas = [cluster.replica(0), cluster.replica(1)];

    // What one replica answers for each prompt, asked directly (the two split them).
    let reference: Vec<String> = std::thread::scope(|s| {
        let halves: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    (0..TOPICS.len())
                        .filter(|i| i % 2 == r)
                        .map(|i| {
                            let text = answer(
                                post(replicas[r], "/v1/chat/completions", &body(i, false)),
                                false,
                            )
                            .unwrap_or_else(|e| panic!("reference for {i}: {e}"));
                            (i, text)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, String)> =
            halves.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort();
        all.into_iter().map(|(_, t)| t).collect()
    });

    // FOLIO_CLUSTER_KILLS=N (the long form): N kills, replica 1 and 0 in turn.
    let kills: usize = std::env::var("FOLIO_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let cycles: Vec<Cycle> = (0..kills)
        .map(|k| kill_and_restart(&cluster, router, replicas, &reference, 1 - k % 2))
        .collect();
    if kills > 1 {
        let sum = |f: fn(&Cycle) -> usize| cycles.iter().map(f).sum::<usize>();
        let mut rejoin: Vec<f64> = cycles.iter().map(|c| c.rejoined).collect();
        rejoin.sort_by(f64::total_cmp);
        eprintln!(
            "{kills} kills: {} requests, {} failed ({} of them streams under way), {} held by \
             the killed replicas' gauges at the kills; back in service {:.1}-{:.1} s after \
             `restart` began (median {:.1})",
            sum(|c| c.requests),
            sum(|c| c.failed),
            sum(|c| c.failed_streams),
            sum(|c| c.in_flight),
            rejoin[0],
            rejoin[kills - 1],
            rejoin[kills / 2]
        );
    }

    // `down` leaves no process behind.
    let pids = cluster.pids();
    assert_eq!(pids.len(), 3, "pid files: {pids:?}");
    cluster.run(&["down"]);
    let gone = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        pids.iter().all(|&p| !alive(p))
    });
    assert!(gone, "processes left after down: {pids:?}");
    eprintln!("whole test: {:.1} s", begun.elapsed().as_secs_f64());
}

/// Turn `turns` of conversation `c`: a system prompt, the first user turn (the hash
/// key), then follow-ups with short stand-in answers.
fn turn(c: usize, turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": prompt(c)}),
    ];
    for t in 1..turns {
        messages.push(json!({"role": "assistant", "content": "Noted."}));
        messages.push(json!({"role": "user", "content": format!("And fact number {t}?")}));
    }
    json!({"model": "folio", "messages": messages, "max_tokens": 4, "temperature": 0})
}

/// Which replica answered `req` (the one whose request counter moved).
fn answered_by(router: SocketAddr, replicas: &[SocketAddr; 2], req: &Value) -> usize {
    answered_by_as(router, replicas, req, None)
}

/// [`answered_by`], sent with smg's routing-key header when `key` is given.
fn answered_by_as(
    router: SocketAddr,
    replicas: &[SocketAddr; 2],
    req: &Value,
    key: Option<&str>,
) -> usize {
    let served = |a| metric(a, "folio:request_success_total").unwrap_or(0.0);
    let before = [served(replicas[0]), served(replicas[1])];
    let r = answer(post_as(router, "/v1/chat/completions", req, key), false);
    assert!(r.is_ok(), "{req}: {r:?}");
    let after = [served(replicas[0]), served(replicas[1])];
    let moved: Vec<usize> = (0..2).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(moved.len(), 1, "counters {before:?} -> {after:?}");
    moved[0]
}

#[test]
fn nginx_consistent_hash_keeps_each_conversation_on_one_replica_across_a_kill_and_restart() {
    if Command::new("nginx").arg("-v").output().is_err() {
        eprintln!("skipped: nginx is not installed (apt-get install nginx-light)");
        return;
    }
    let cluster = Cluster {
        dir: tempfile::tempdir().unwrap(),
    };
    eprintln!(
        "{}",
        cluster.run(&["up", "--replicas", "2", "--router", "nginx", "--port", "0"])
    );
    let router = cluster.router();
    let replicas = [cluster.replica(0), cluster.replica(1)];

    // Every turn of a conversation lands where its first did; conversations spread.
    let home: Vec<usize> = (0..12)
        .map(|c| {
            let first = answered_by(router, &replicas, &turn(c, 1));
            for t in 2..=3 {
                assert_eq!(
                    answered_by(router, &replicas, &turn(c, t)),
                    first,
                    "conversation {c} turn {t} moved"
                );
            }
            first
        })
        .collect();
    assert!(
        home.contains(&0) && home.contains(&1),
        "12 conversations all hashed to one replica: {home:?}"
    );

    // Replica 1 dies: its conversations go on on replica 0, the others stay put.
    cluster.run(&["kill", "1"]);
    for (c, &h) in home.iter().enumerate() {
        let r = answer(post(router, "/v1/chat/completions", &turn(c, 4)), false);
        assert!(
            r.is_ok(),
            "conversation {c} (home {h}) after the kill: {r:?}"
        );
    }
    for (c, _) in home.iter().enumerate().filter(|(_, &h)| h == 0) {
        assert_eq!(answered_by(router, &replicas, &turn(c, 5)), 0);
    }

    // Restarted on its port, replica 1 gets its conversations back once nginx's
    // fail_timeout (2 s) has passed.
    cluster.run(&["restart", "1"]);
    let c = home.iter().position(|&h| h == 1).unwrap();
    let back = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(250));
        answered_by(router, &replicas, &turn(c, 6)) == 1
    });
    assert!(
        back,
        "conversation {c} never returned to the restarted replica"
    );

    let pids = cluster.pids();
    cluster.run(&["down"]);
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "processes left after down: {pids:?}"
    );
}

/// docs/cluster.md's advice for chat behind smg, `cluster.sh up --sticky` (smg's
/// `--sticky-sessions --assignment-mode min_load`) and the conversation's id in
/// `X-SMG-Routing-Key`. Eight conversations of the
/// same text (the prefix tree alone would send them all to the replica holding it)
/// start at once under eight keys and spread over both replicas; every later turn of
/// each reaches the replica its second turn did.
#[test]
fn smg_sticky_sessions_keep_each_conversation_on_one_replica_and_spread_new_ones() {
    let Some(cluster) = Cluster::with_smg() else {
        return;
    };
    let up = cluster.run(&["up", "--router", "smg", "--sticky", "--port", "0"]);
    eprintln!("{up}");
    let router = cluster.router();
    let replicas = [cluster.replica(0), cluster.replica(1)];
    let key = |c: usize| format!("conversation-{c}");

    // First turns all at once, long enough to be in flight together: each new key goes
    // to the replica with fewer requests in flight (on a tie smg picks either).
    let mut first = turn(0, 1);
    first["max_tokens"] = json!(48);
    std::thread::scope(|s| {
        for c in 0..8 {
            let (key, first) = (key(c), &first);
            s.spawn(move || {
                let r = answer(
                    post_as(router, "/v1/chat/completions", first, Some(&key)),
                    false,
                );
                assert!(r.is_ok(), "conversation {c} turn 1: {r:?}");
            });
        }
    });
    let home: Vec<usize> = (0..8)
        .map(|c| {
            let home = answered_by_as(router, &replicas, &turn(0, 2), Some(&key(c)));
            for t in 3..=4 {
                assert_eq!(
                    answered_by_as(router, &replicas, &turn(0, t), Some(&key(c))),
                    home,
                    "conversation {c} turn {t} moved"
                );
            }
            home
        })
        .collect();
    let on_0 = home.iter().filter(|&&h| h == 0).count();
    assert!(
        (2..=6).contains(&on_0),
        "8 conversations placed {on_0} / {} on the two replicas: {home:?}\n{}",
        8 - on_0,
        cluster.log("router.log")
    );
}
