//! Memory one request can pin (probe F1): a streaming client that stops reading is
//! cut off by its own bounded event channel, not buffered without end, and a
//! log-probability costs the entries it returns, not the vocabulary. Measured on the
//! `folio serve` process: its resident set while a stream goes unread, and its peak
//! while a long prompt is echoed with log-probabilities.

use crate::client::{get, metric, ok};
use crate::server;
use serde_json::json;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const MIB: u64 = 1024;

/// Distinct prompt ids (no cache hits between calls with different `k`).
fn prompt(len: usize, k: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 1000 + (i * 7919 + k * 104_729) % 40_000)
        .collect()
}

/// Starts a server and touches most of its pool (276 of its 300 pages) and its prefill
/// buffers, so that what is measured after is what a request holds, not the first use
/// of the pool. (The pool is small because touching it is a prefill of its size.)
fn warm_server() -> server::Server {
    let s = server::start(&["--ctx", "4096", "--kv-pages", "300"]);
    let prompts: Vec<Vec<u32>> = (0..2).map(|k| prompt(2200, k)).collect();
    ok(
        s.addr,
        "/v1/completions",
        json!({"prompt": prompts, "max_tokens": 1}),
    );
    s
}

fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn running(a: SocketAddr) -> u64 {
    let t = get(a, "/v1/kv").json()["totals"].clone();
    t["running"].as_u64().unwrap() + t["waiting"].as_u64().unwrap()
}

#[test]
fn f1_a_stream_that_is_not_read_is_stopped_and_memory_stays_flat() {
    let s = warm_server();
    let a = s.addr;
    let before = s.rss_kib().unwrap();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 1500, "n": 16, "logprobs": 20,
                      "ignore_eos": true, "stream": true, "temperature": 1})
    .to_string();
    // A small receive buffer, as a client on a slow link has: the kernel's own
    // buffers (up to 32 MB on loopback here) would otherwise hide the stall.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&a.into()).unwrap();
    let mut c: std::net::TcpStream = sock.into();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The client never reads. Before the fix the server buffered every event (and a
    // vocabulary-sized list in each): its RSS grew by hundreds of MB a second.
    let t = Instant::now();
    let mut most = before;
    let mut stopped = None;
    // It stops once the server's send buffer (up to 4 MB here) and the run's own
    // channel are full: seconds, on a busy machine tens of them; the request alone
    // would run for minutes.
    while t.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(250));
        most = most.max(s.rss_kib().unwrap());
        if stopped.is_none() && t.elapsed() > Duration::from_secs(1) && running(a) == 0 {
            stopped = Some(t.elapsed());
        }
        if stopped.is_some_and(|at| t.elapsed() > at + Duration::from_secs(1)) {
            break;
        }
    }
    let grew = most.saturating_sub(before);
    eprintln!(
        "unread stream: stopped after {stopped:?}; RSS {} MiB before, at most +{} MiB",
        before / MIB,
        grew / MIB
    );
    assert!(stopped.is_some(), "the unread stream still runs after 90 s");
    // Stopped for want of a reader, not ended by its 1500 tokens.
    assert_eq!(metric(a, "folio:streams_unread_total", ""), 1.0);
    assert!(grew < 100 * MIB, "RSS grew by {} MiB", grew / MIB);
    drop(c);
    // The server is fine afterwards.
    ok(
        a,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 4}),
    );
}

#[test]
fn f1_echo_with_logprobs_costs_what_it_returns_not_the_vocabulary() {
    let s = warm_server();
    let a = s.addr;
    // A first echo reaches the step's largest logits buffer (a row of logits for
    // each of up to 512 prompt tokens a step: ~100 MB, bounded by the batch, not the
    // prompt); the second shows what each prompt token costs beyond it.
    ok(
        a,
        "/v1/completions",
        json!({"prompt": prompt(600, 8), "max_tokens": 1, "echo": true, "logprobs": 0}),
    );
    let before = peak_kib(s.pid());
    let r = ok(
        a,
        "/v1/completions",
        json!({"prompt": prompt(2000, 9), "max_tokens": 1, "echo": true, "logprobs": 0}),
    );
    assert_eq!(
        r["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2001
    );
    let grew = peak_kib(s.pid()).saturating_sub(before);
    eprintln!(
        "echo + logprobs of 2000 prompt tokens: peak RSS +{} MiB",
        grew / MIB
    );
    // Before the fix: +774 MiB (393 KB a prompt token).
    assert!(grew < 60 * MIB, "peak RSS grew by {} MiB", grew / MIB);
}
