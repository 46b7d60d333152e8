//! `--request-timeout` bounds every request that does model work, snapshot saves
//! included. A save whose context still has tokens to compute runs that flush first:
//! past the limit the flush is cancelled and nothing is written, so the client gets
//! 503 `request_timeout` and the snapshot of that name stays as it was, in memory and
//! on disk. A generation into a context is stopped the same way.

use crate::client::{context_with, tokens};
use crate::client::{get, metric, ok, post};
use crate::server;
use crate::snapshots::snapshots;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Instant;

/// 6000 tokens: their flush takes seconds on a CPU, far past the 0.5 s limit.
const LONG: usize = 6000;

fn kv_totals(a: SocketAddr) -> serde_json::Value {
    get(a, "/v1/kv").json()["totals"].clone()
}

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_save_past_the_request_timeout_is_503_and_keeps_the_old_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    // Contexts may use the whole pool here (this is about time limits, not the
    // contexts' share, which is half the pool by default).
    let args = [
        "--snapshot-dir",
        &d,
        "--ctx",
        "8192",
        "--kv-pages",
        "800",
        "--context-pages",
        "800",
    ];
    let snap = dir.path().join("notes.snap");
    // The old snapshot, saved by a server without a tight limit.
    let s = server::start(&args);
    let small = context_with(s.addr, &tokens(40, 0));
    ok(
        s.addr,
        "/v1/snapshots",
        json!({"context": small, "name": "notes"}),
    );
    s.kill();
    let old = std::fs::read(&snap).unwrap();

    let mut limited = args.to_vec();
    limited.extend(["--request-timeout", "0.5"]);
    let s = server::start(&limited);
    let a = s.addr;
    assert_eq!(snapshots(a), vec![("notes".to_string(), 40)]);
    let long = context_with(a, &tokens(LONG, 1));
    let t = Instant::now();
    let r = post(
        a,
        "/v1/snapshots",
        &json!({"context": long, "name": "notes"}),
    );
    let took = t.elapsed();
    let e = r.error(503);
    assert_eq!(e["code"], "request_timeout", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("--request-timeout"),
        "{e}"
    );
    assert_eq!(r.header("retry-after"), None);
    // Nothing was saved: the old snapshot, in memory and on disk, byte for byte, and
    // no temporary file.
    assert_eq!(snapshots(a), vec![("notes".to_string(), 40)]);
    assert_eq!(std::fs::read(&snap).unwrap(), old);
    assert_eq!(files(dir.path()), vec!["notes.snap".to_string()]);
    // The flush was stopped, not left running: nothing runs or waits (the engine
    // takes the cancel before the next request's call), the page store's invariants
    // hold, and the context keeps every token (what the flush computed, the rest
    // pending again).
    let totals = kv_totals(a);
    assert_eq!(
        (&totals["running"], &totals["waiting"]),
        (&json!(0), &json!(0))
    );
    assert_eq!(get(a, "/v1/kv/check").status, 200);
    let info = get(a, &format!("/v1/contexts/{long}")).json();
    assert_eq!(info["seq_len"], LONG as u64, "{info}");
    assert_eq!(
        metric(a, "folio:requests_timed_out_total", "model_name"),
        1.0
    );
    // A bad name is refused before any flush: 400 naming the field.
    let e = post(
        a,
        "/v1/snapshots",
        &json!({"context": long, "name": "../x"}),
    )
    .error(400);
    assert_eq!(e["param"], "name", "{e}");
    // A generation into a long context is stopped the same way.
    let gen = context_with(a, &tokens(LONG, 2));
    let r = post(
        a,
        &format!("/v1/contexts/{gen}/generate"),
        &json!({"max_tokens": 1}),
    );
    assert_eq!(r.error(503)["code"], "request_timeout");
    assert_eq!(get(a, "/v1/kv/check").status, 200);
    // What fits in the limit still works: a short context saves under a new name,
    // and the long one, cut short, saves too.
    ok(
        a,
        "/v1/snapshots",
        json!({"context": small_ctx(a), "name": "tiny"}),
    );
    ok(
        a,
        &format!("/v1/contexts/{long}/truncate"),
        json!({"tokens": LONG - 8}),
    );
    ok(a, "/v1/snapshots", json!({"context": long, "name": "cut"}));
    let mut list = snapshots(a);
    list.sort();
    assert_eq!(
        list,
        vec![
            ("cut".to_string(), 8),
            ("notes".to_string(), 40),
            ("tiny".to_string(), 8)
        ]
    );
    assert_eq!(std::fs::read(&snap).unwrap(), old);
    eprintln!("the save answered 503 after {took:?} (limit 0.5 s)");
}

/// A context of 8 tokens.
fn small_ctx(a: SocketAddr) -> String {
    context_with(a, &tokens(8, 3))
}
