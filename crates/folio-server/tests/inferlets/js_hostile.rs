//! Hostile JavaScript guests (examples/inferlets/hostile.js): an endless loop, a
//! huge allocation, a thrown exception, calls on a dropped handle and a page-quota
//! breach. Each gets an error (never a 500); afterwards the server still serves, no
//! page is held, and a greedy answer is unchanged.

use crate::client::{self, get};
use crate::{
    assert_no_page_held, greedy, js_guest, js_ready, serial, server, shared_server, upload,
};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The time limit hostile runs ask for.
const LIMIT: Duration = Duration::from_secs(4);

/// Runs one attack of `hostile_js` within [`LIMIT`]; its error object (the status
/// must be `status`).
fn attack(a: SocketAddr, name: &str, status: u16) -> Value {
    client::post(
        a,
        "/v1/inferlets/hostile_js/run",
        &json!({"input": {"attack": name}, "time_limit": LIMIT.as_secs_f64()}),
    )
    .error(status)
}

/// The server after an attack: it serves, holds no page, answers as before.
fn still_fine(a: SocketAddr, before: &str) {
    assert_eq!(get(a, "/health").status, 200);
    assert_no_page_held(a);
    assert_eq!(
        greedy(a, "Once upon a time"),
        before,
        "greedy output changed"
    );
}

fn message(e: &Value) -> &str {
    e["message"].as_str().unwrap()
}

#[test]
fn js_a_spinning_guest_is_stopped_by_the_epoch_deadline() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let before = greedy(a, "Once upon a time");
    let t = Instant::now();
    let e = attack(a, "spin", 400);
    let took = t.elapsed();
    assert_eq!(e["code"], "inferlet_time_limit", "{e}");
    assert!(
        took >= LIMIT && took < LIMIT + Duration::from_secs(3),
        "{took:?}"
    );
    still_fine(a, &before);
}

#[test]
fn js_a_huge_allocation_fails_within_the_memory_limit() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let before = greedy(a, "Once upon a time");
    let e = attack(a, "alloc", 400);
    // SpiderMonkey's out-of-memory (the program's error) or a trap: never the time
    // limit, the allocation fails first.
    let code = e["code"].as_str().unwrap();
    assert!(code == "inferlet_error" || code == "inferlet_trap", "{e}");
    still_fine(a, &before);
}

#[test]
fn js_a_thrown_exception_ends_the_run_with_its_message() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let before = greedy(a, "Once upon a time");
    let e = attack(a, "throw", 400);
    assert_eq!(e["code"], "inferlet_error", "{e}");
    assert!(message(&e).contains("RangeError: thrown on purpose"), "{e}");
    still_fine(a, &before);
}

#[test]
fn js_calls_on_a_dropped_handle_are_refused() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let before = greedy(a, "Once upon a time");
    // The raw resource after its drop: the binding or the host's handle table
    // refuses it.
    let e = attack(a, "dropped", 400);
    let code = e["code"].as_str().unwrap();
    assert!(code == "inferlet_error" || code == "inferlet_trap", "{e}");
    // Through the SDK: its own FolioError.
    let e = attack(a, "dropped_sdk", 400);
    assert_eq!(e["code"], "inferlet_error", "{e}");
    assert!(
        message(&e).contains("invalid: the context was dropped"),
        "{e}"
    );
    still_fine(a, &before);
}

/// Pages one run may hold on the page-quota server.
const PAGES: usize = 24;

#[test]
fn js_scoring_past_the_page_quota_is_refused() {
    let _s = serial();
    let Some(guest) = js_guest("hostile") else {
        return;
    };
    // A server of its own: the shared one's quota is larger than its pool.
    let mut cfg = folio_server::ServeConfig::default();
    cfg.inferlet_limits.pages = PAGES;
    let s = server::start(cfg, server::small_engine());
    let a = s.addr;
    let r = upload(a, "hostile_js", &guest);
    assert_eq!(r.status, 201, "{}", r.text());
    let before = greedy(a, "Once upon a time");
    let r = client::post(
        a,
        "/v1/inferlets/hostile_js/run",
        &json!({"input": {"attack": "pages"}, "time_limit": LIMIT.as_secs_f64()}),
    );
    // Refused to the guest (a limit error it did not catch) or the run stopped.
    let e = r.error(if r.status == 429 { 429 } else { 400 });
    let code = e["code"].as_str().unwrap();
    assert!(code == "inferlet_error" || code == "inferlet_quota", "{e}");
    assert!(
        message(&e).contains(&format!("quota of {PAGES} pages")),
        "{e}"
    );
    still_fine(a, &before);
}
