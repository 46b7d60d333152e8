//! Every error status, each in OpenAI's envelope; a user's mistake is never a 500
//! and never disturbs a request running beside it.

use crate::client::{get, open_stream, post, request};
use crate::server::{engine, small_engine, start, start_with};
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::json;
use std::time::Duration;

#[test]
fn bad_requests_are_400_naming_the_field() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let raw = |body: &str| request(a, "POST", "/v1/completions", &[], body.as_bytes());
    let e = raw("{\"prompt\": \"hi\", ").error(400);
    assert!(
        e["message"].as_str().unwrap().contains("not valid JSON"),
        "{e}"
    );
    raw("").error(400);
    raw("[1, 2]").error(400);
    let e = raw(r#"{"prompt": "hi", "max_tokens": "ten"}"#).error(400);
    assert_eq!(e["param"], "max_tokens");
    let e = raw(r#"{"prompt": {"a": 1}}"#).error(400);
    assert_eq!(e["param"], "prompt");
    let e = raw(r#"{"prompt": "hi", "stop": 3}"#).error(400);
    assert_eq!(e["param"], "stop");
    let e = raw(r#"{"prompt": "hi", "temperature": -1}"#).error(400);
    assert_eq!(e["param"], "temperature");
    let e = raw(r#"{"prompt": "hi", "n": 0}"#).error(400);
    assert_eq!(e["param"], "n");
    let e = raw(r#"{"prompt": "hi", "logprobs": 50}"#).error(400);
    assert_eq!(e["param"], "logprobs");
    let e = raw(r#"{"prompt": "hi", "max_tokens": -5}"#).error(400);
    assert_eq!(e["param"], "max_tokens");
    let e = raw(r#"{"prompt": "hi", "max_tokens": 0}"#).error(400);
    assert_eq!(e["param"], "max_tokens");
    let e = raw(r#"{"prompt": [5, 99999999]}"#).error(400);
    assert_eq!(e["param"], "prompt");
    let e = raw(r#"{"prompt": ""}"#).error(400);
    assert_eq!(e["param"], "prompt");
    let e = raw(r#"{"prompt": "hi", "stop": [""]}"#).error(400);
    assert_eq!(e["param"], "stop");
    raw(r#"{"messages": [{"role": "user", "content": "hi"}]}"#).error(400);
    // Unknown fields are ignored.
    let ok = raw(r#"{"prompt": "hi", "max_tokens": 2, "frobnicate": {"x": [1]}, "user": "u"}"#);
    assert_eq!(ok.status, 200, "{}", ok.text());

    let chat = |body: &str| request(a, "POST", "/v1/chat/completions", &[], body.as_bytes());
    chat(r#"{"messages": []}"#).error(400);
    chat(r#"{"messages": "hi"}"#).error(400);
    chat(r#"{"prompt": "hi"}"#).error(400);
    let e = chat(r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#).error(400);
    assert!(e["message"].as_str().unwrap().contains("image_url"), "{e}");
    let e = chat(r#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}"#).error(400);
    assert_eq!(e["param"], "logprobs");
    let e =
        chat(r#"{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}"#).error(400);
    assert_eq!(e["param"], "top_logprobs");
    let ok = chat(
        r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}"#,
    );
    assert_eq!(ok.status, 200, "{}", ok.text());

    request(a, "POST", "/tokenize", &[], b"{}").error(400);
    let e = post(a, "/detokenize", &json!({"tokens": [1, 4000000]})).error(400);
    assert_eq!(e["param"], "tokens");
}

#[test]
fn a_prompt_over_the_window_or_a_request_over_the_pool_is_400_with_the_limit() {
    // A window of 256 tokens; a pool of 8 pages of 16 (128 tokens).
    let cfg = EngineConfig {
        kv_pages: 8,
        max_seq_tokens: Some(256),
        ..EngineConfig::default()
    };
    let s = start(ServeConfig::default(), cfg);
    let long: Vec<u32> = (0..300).map(|i| 100 + i).collect();
    let e = post(s.addr, "/v1/completions", &json!({"prompt": long})).error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("256"), "{e}");
    let text = "hello ".repeat(400);
    let e = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": text}]}),
    )
    .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    // 100 prompt tokens + 100 to generate need 13 pages; the pool has 8.
    let p: Vec<u32> = (0..100).map(|i| 100 + i).collect();
    let e = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": p, "max_tokens": 100}),
    )
    .error(400);
    assert!(
        e["message"].as_str().unwrap().contains("whole pool has 8"),
        "{e}"
    );
    // What fits still runs.
    let ok = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": p, "max_tokens": 4}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
}

#[test]
fn the_api_key_guards_the_api_but_not_health_or_metrics() {
    let cfg = ServeConfig {
        api_key: Some("sekrit".into()),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let e = request(s.addr, "POST", "/v1/completions", &[], body.as_bytes()).error(401);
    assert_eq!(e["code"], "invalid_api_key");
    request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer wrong")],
        body.as_bytes(),
    )
    .error(401);
    request(s.addr, "GET", "/v1/models", &[], b"").error(401);
    request(s.addr, "POST", "/tokenize", &[], b"{\"content\":\"x\"}").error(401);
    let ok = request(
        s.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sekrit")],
        body.as_bytes(),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(get(s.addr, "/health").status, 200);
    assert_eq!(get(s.addr, "/metrics").status, 200);
}

#[test]
fn unknown_routes_wrong_methods_and_big_bodies_answer_in_the_envelope() {
    let cfg = ServeConfig {
        max_body: 1024,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    get(s.addr, "/v2/nothing").error(404);
    get(s.addr, "/v1/completions").error(405);
    let big = json!({"prompt": "x".repeat(4096)}).to_string();
    let e = request(s.addr, "POST", "/v1/completions", &[], big.as_bytes()).error(413);
    assert!(e["message"].as_str().unwrap().contains("--max-body"), "{e}");
}

#[test]
fn a_full_queue_is_503_with_retry_after() {
    let cfg = ServeConfig {
        max_queue: 0,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi"}));
    r.error(503);
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[test]
fn health_is_503_while_the_model_loads() {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (s, ready) = start_with(ServeConfig::default(), move || {
        go_rx.recv().map_err(|e| e.to_string())?;
        Ok(engine(small_engine()))
    });
    let h = get(s.addr, "/health");
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "loading");
    let r = post(s.addr, "/v1/completions", &json!({"prompt": "hi"}));
    r.error(503);
    assert!(r.header("retry-after").is_some());
    assert_eq!(get(s.addr, "/metrics").status, 200);
    go_tx.send(()).unwrap();
    ready.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(get(s.addr, "/health").status, 200);
}

#[test]
fn a_model_that_fails_to_load_ends_serve_with_the_reason() {
    let (s, _ready) = start_with(ServeConfig::default(), || Err("no such file".into()));
    let e = s.wait().expect_err("a failed load is an error");
    assert!(e.to_string().contains("no such file"), "{e}");
}

#[test]
fn mistakes_beside_a_running_stream_do_not_disturb_it() {
    let s = start(ServeConfig::default(), small_engine());
    let body = json!({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": true});
    let alone = post(s.addr, "/v1/completions", &body).json()["choices"][0]["text"].clone();
    let mut streamed = open_stream(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    assert_eq!(streamed.status, 200);
    for bad in [
        r#"{"prompt": "#,
        r#"{"prompt": "x", "top_p": 7}"#,
        r#"{"prompt": [1, 2, 999999999]}"#,
    ] {
        let r = request(s.addr, "POST", "/v1/completions", &[], bad.as_bytes());
        assert_eq!(r.status, 400, "{}", r.text());
    }
    let mut text = String::new();
    while let Some(ev) = streamed.next_event() {
        if ev == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(&ev).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
    }
    assert_eq!(json!(text), alone);
}

#[test]
fn limits_that_keep_one_request_from_taking_the_server() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "stop": stops}),
    )
    .error(400);
    assert_eq!(e["param"], "stop");
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "stop": ["x".repeat(5000)]}),
    )
    .error(400);
    assert_eq!(e["param"], "stop");
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "cache_salt": "s".repeat(2000)}),
    )
    .error(400);
    assert_eq!(e["param"], "cache_salt");
    let many: Vec<Vec<u32>> = (0..256)
        .map(|i| (0..300).map(|t| 100 + t + i).collect())
        .collect();
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": many, "max_tokens": 1}),
    )
    .error(400);
    assert!(e["message"].as_str().unwrap().contains("65536"), "{e}");
    let p: Vec<u32> = (0..900).map(|t| 100 + t).collect();
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": p, "echo": true, "logprobs": 20, "n": 128, "max_tokens": 1}),
    )
    .error(400);
    assert_eq!(e["param"], "logprobs");
    let e = post(
        a,
        "/v1/chat/completions",
        &json!({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .error(400);
    assert_eq!(e["param"], "prompt");
    let e = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "repetition_penalty": 0}),
    )
    .error(400);
    assert_eq!(e["param"], "repetition_penalty");
}

#[test]
fn a_client_that_never_finishes_its_request_head_is_cut_off() {
    use std::io::{Read, Write};
    let s = start(ServeConfig::default(), small_engine());
    let mut c = crate::client::connect(s.addr);
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHo").unwrap();
    let t = std::time::Instant::now();
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf); // the server closes (after a 408 or not)
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    assert!(
        waited >= Duration::from_secs(5),
        "closed too early: {waited:?}"
    );
    assert_eq!(get(s.addr, "/health").status, 200);
}

#[test]
fn shutdown_ends_even_with_a_request_half_sent() {
    use std::io::Write;
    let cfg = ServeConfig {
        shutdown_timeout: Duration::from_millis(300),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let mut c = crate::client::connect(s.addr);
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t = std::time::Instant::now();
    s.stop().expect("serve returns");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    drop(c);
}
