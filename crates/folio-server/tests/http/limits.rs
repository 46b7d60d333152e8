//! Limits that protect the host, beside the ones in `errors.rs` (body size, queue
//! length, prompt length) and `contexts.rs` (live contexts): the `max_tokens` cap
//! and the per-request wall-clock timeout. Each is a clear status in OpenAI's
//! envelope, never a 500, and leaves every page free or cached.

use crate::client::{eventually, get, metric, open_stream, post};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

/// Nothing runs and every page is free or cached (none held).
fn idle(a: SocketAddr) -> bool {
    metric(a, "folio:num_requests_running", "model_name") == 0.0
        && metric(a, "folio:num_requests_waiting", "model_name") == 0.0
        && metric(a, "folio:kv_pages", "state=\"working\"") == 0.0
        && metric(a, "folio:kv_pages", "state=\"committed\"") == 0.0
}

#[test]
fn max_tokens_over_the_cap_is_400_naming_the_field_and_the_flag() {
    let cfg = ServeConfig {
        max_tokens: 8,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 9}),
    )
    .error(400);
    assert_eq!(e["param"], "max_tokens");
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("--max-tokens-cap") && m.contains('8'), "{m}");
    let e = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100}),
    )
    .error(400);
    assert_eq!(e["param"], "max_completion_tokens");
    // At the cap it runs; a chat without max_tokens gets the cap, not the window.
    let ok = post(
        a,
        "/v1/completions",
        &json!({"prompt": "Count:", "max_tokens": 8, "ignore_eos": true, "temperature": 0}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["usage"]["completion_tokens"], 8);
    let chat = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Count to a thousand."}], "ignore_eos": true, "temperature": 0}),
    );
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert_eq!(chat.json()["usage"]["completion_tokens"], 8);
}

#[test]
fn a_request_past_its_timeout_is_stopped_with_503_and_its_pages_freed() {
    let cfg = ServeConfig {
        request_timeout: Some(Duration::from_millis(1000)),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    // 1000 tokens cannot be generated in a second on a CPU (some 200 a second here).
    let body = json!({"prompt": "Count to a thousand:", "max_tokens": 1000, "ignore_eos": true});
    let r = post(a, "/v1/completions", &body);
    let e = r.error(503);
    assert_eq!(e["code"], "request_timeout");
    assert!(
        e["message"].as_str().unwrap().contains("--request-timeout"),
        "{e}"
    );
    assert_eq!(
        r.header("retry-after"),
        None,
        "retrying would time out again"
    );
    // A stream that already answered 200 ends with the error event, then [DONE].
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let mut open = open_stream(a, "/v1/completions", &stream_body);
    assert_eq!(open.status, 200);
    let mut events = Vec::new();
    while let Some(ev) = open.next_event() {
        let done = ev == "[DONE]";
        events.push(ev);
        if done {
            break;
        }
    }
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["error"]["code"], "request_timeout", "{last}");
    assert!(eventually(5.0, || idle(a)), "{}", get(a, "/metrics").text());
    assert_eq!(
        metric(a, "folio:requests_timed_out_total", "model_name"),
        2.0
    );
    // What fits in the limit still runs.
    let ok = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 1}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let check = get(a, "/v1/kv/check");
    assert_eq!(check.status, 200, "{}", check.text());
    assert_eq!(check.json()["ok"], true);
}
