//! The disk tier (`--kv-disk`) against the built server: SIGKILL at varied moments of
//! the write-behind never leaves a file that is served wrong (every restart answers a
//! prompt with the bits a server without the tier gives, and the last one reads the
//! prompt back from disk), and a disk that refuses writes costs the tier, never a
//! request.

use crate::client::{metric, ok, tokens};
use crate::server;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// 900 tokens: 56 pages of about 0.36 MB each to write behind.
const PROMPT: usize = 900;

fn completion(a: std::net::SocketAddr) -> Value {
    ok(
        a,
        "/v1/completions",
        json!({"prompt": tokens(PROMPT, 7), "max_tokens": 8, "temperature": 0, "logprobs": 2}),
    )
}

/// The answer's text and log-probabilities (as the server printed them: the same
/// digits are the same bits).
fn answer(v: &Value) -> (Value, Value) {
    (
        v["choices"][0]["text"].clone(),
        v["choices"][0]["logprobs"].clone(),
    )
}

/// The answer of a server without the disk tier.
fn cold_answer() -> (Value, Value) {
    let s = server::start(&["--ctx", "2048"]);
    let c = completion(s.addr);
    s.kill();
    answer(&c)
}

/// Every file under `dir`, with its size.
fn files(dir: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        let size = std::fs::metadata(&e).map_or(0, |m| m.len());
        out.push((e.to_string_lossy().into_owned(), size));
    }
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn sigkill_during_write_behind_restarts_and_serves_the_cold_bits() {
    let cold = cold_answer();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let args = ["--ctx", "2048", "--kv-disk", &d];
    // Kill mid-request, as the answer arrives (writes queued), and a moment later.
    for (k, wait_ms) in [(0, Some(150)), (1, None), (2, None), (3, Some(0))] {
        let s = server::start(&args);
        let a = s.addr;
        match wait_ms {
            Some(ms) => {
                let asked = std::thread::spawn(move || {
                    let _ = std::panic::catch_unwind(|| completion(a));
                });
                std::thread::sleep(Duration::from_millis(ms + 400 * k));
                s.kill();
                let _ = asked.join();
            }
            None => {
                let got = completion(a);
                assert_eq!(answer(&got), cold, "kill {k}: the answer before the kill");
                if k == 2 {
                    std::thread::sleep(Duration::from_millis(30));
                }
                s.kill();
            }
        }
        // Whatever was on disk then: a restart serves the cold bits.
        let s = server::start(&args);
        let got = completion(s.addr);
        assert_eq!(
            answer(&got),
            cold,
            "kill {k}: after the restart; log:\n{}",
            s.stderr()
        );
        assert!(
            !files(dir.path()).iter().any(|(f, _)| f.ends_with(".tmp")),
            "kill {k}: no unfinished write is left after a start"
        );
        s.kill();
    }
    // A clean run (its writes finish), then a restart reads the prompt from disk.
    let s = server::start(&args);
    completion(s.addr);
    let pages = PROMPT / 16;
    assert!(
        crate::client::eventually(20.0, || metric(s.addr, "folio:kv_disk_pages", "") as usize
            >= pages),
        "the prompt's pages are written behind"
    );
    s.kill();
    let s = server::start(&args);
    // A router's probe sees the prompt's pages on the disk tier.
    let m = ok(
        s.addr,
        "/v1/cache/match",
        json!({"tokens": tokens(PROMPT, 7)}),
    );
    assert_eq!(
        m["tiers"],
        json!({"memory": 0, "disk": PROMPT / 16 * 16}),
        "{m}"
    );
    let got = completion(s.addr);
    assert_eq!(answer(&got), cold, "read back from disk: the cold bits");
    let cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        cached as usize,
        (PROMPT - 1) / 16 * 16,
        "every whole page of the prompt came from disk: {got}"
    );
    assert!(metric(s.addr, "folio:kv_disk_hits_total", "") as usize >= pages);
    s.kill();
}

#[test]
fn a_disk_that_refuses_writes_costs_the_tier_never_a_request() {
    let cold = cold_answer();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    // Files cannot grow past 64 KiB: every page write fails as on a full disk.
    let s = server::start_limited(64 << 10, &["--ctx", "2048", "--kv-disk", &d]);
    for _ in 0..2 {
        assert_eq!(answer(&completion(s.addr)), cold);
    }
    assert!(crate::client::eventually(20.0, || metric(
        s.addr,
        "folio:kv_disk_write_errors_total",
        ""
    ) > 0.0));
    assert_eq!(metric(s.addr, "folio:kv_disk_pages", ""), 0.0);
    let left: Vec<_> = files(dir.path())
        .into_iter()
        .filter(|(f, _)| f.ends_with(".page") || f.ends_with(".tmp"))
        .collect();
    assert!(
        left.is_empty(),
        "no page or unfinished file is left: {left:?}"
    );
    s.kill();
}
