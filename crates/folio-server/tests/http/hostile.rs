//! The 2026-11-27 hostile probe's findings on the server's own surface, each as its
//! reproducer: cross-site use (F8), `--cors-origin '*'` (F18), an oversized declared
//! body (F20), the context salt's limit (F19), the TTL and a generating context (F7),
//! a failed, timed-out or window-filling generation into a context (F6, F14, F15),
//! and a long chat message stalling the engine (F3). (Findings elsewhere: grammar,
//! tool calls and snapshots have their own files; memory is the fault tests'.)

use crate::client::{get, ok, post, read_response, Resp};
use crate::server::{small_engine, start};
use crate::stall::{assert_no_stall, under_attack};
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One request written byte for byte: `head` lines (no Content-Length: it is
/// added), then `body`.
fn raw(addr: SocketAddr, method: &str, path: &str, head: &[&str], body: &str) -> Resp {
    let mut s = crate::client::connect(addr);
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for h in head {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    read_response(&mut BufReader::new(s))
}

fn contexts(a: SocketAddr) -> usize {
    get(a, "/v1/contexts").json()["data"]
        .as_array()
        .unwrap()
        .len()
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_string()
}

fn seq_len(a: SocketAddr, id: &str) -> u64 {
    let r = get(a, &format!("/v1/contexts/{id}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["seq_len"].as_u64().unwrap()
}

#[test]
fn f8_a_body_that_is_not_json_typed_is_refused_with_415_and_does_nothing() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let r = raw(
            a,
            "POST",
            "/v1/contexts",
            &["Host: localhost", &format!("Content-Type: {ct}")],
            r#"{"system":"pwned"}"#,
        );
        r.error(415);
        let r = raw(a, "POST", "/v1/contexts", &["Host: localhost"], "{}");
        r.error(415);
    }
    assert_eq!(contexts(a), 0);
    // With the right type (parameters allowed), the same body works.
    let r = raw(
        a,
        "POST",
        "/v1/contexts",
        &[
            "Host: localhost",
            "Content-Type: Application/JSON; charset=utf-8",
        ],
        "{}",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // A body-less POST needs no type, but one that gives a type gives JSON's
    // (second probe, G2).
    let fork = format!("/v1/contexts/{}/fork", id(&r.json()));
    raw(
        a,
        "POST",
        &fork,
        &["Host: localhost", "Content-Type: text/plain"],
        "",
    )
    .error(415);
    let r = raw(a, "POST", &fork, &["Host: localhost"], "");
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn f8_a_foreign_origin_is_refused_and_the_servers_own_page_is_not() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let json = "Content-Type: application/json";
    for origin in ["http://evil.example", "null", "https://localhost.evil.com"] {
        let r = raw(
            a,
            "POST",
            "/v1/contexts",
            &["Host: localhost", json, &format!("Origin: {origin}")],
            "{}",
        );
        let e = r.error(403);
        assert!(
            e["message"].as_str().unwrap().contains("--cors-origin"),
            "{e}"
        );
        // Body-less and GET requests too.
        raw(
            a,
            "GET",
            "/v1/contexts",
            &["Host: localhost", &format!("Origin: {origin}")],
            "",
        )
        .error(403);
    }
    assert_eq!(contexts(a), 0);
    // The web page at / posts with its own origin.
    let host = format!("Host: {a}");
    let own = format!("Origin: http://{a}");
    let r = raw(a, "POST", "/v1/contexts", &[&host, json, &own], "{}");
    assert_eq!(r.status, 201, "{}", r.text());
    // Same scheme-less authority only: another port is another origin.
    let other = format!("Origin: http://127.0.0.1:{}", a.port() ^ 1);
    raw(a, "POST", "/v1/contexts", &[&host, json, &other], "{}").error(403);
}

#[test]
fn f8_a_host_that_is_not_ours_is_refused_as_dns_rebinding_sends_it() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    for host in [
        "attacker.example",
        "attacker.example:8080",
        "localhost.evil.com",
    ] {
        for path in ["/", "/v1/models", "/v1/contexts"] {
            let r = raw(a, "GET", path, &[&format!("Host: {host}")], "");
            let e = r.error(403);
            assert!(
                e["message"].as_str().unwrap().contains("--allowed-hosts"),
                "{e}"
            );
        }
        // The rebinding page's own origin does not help.
        raw(
            a,
            "POST",
            "/v1/contexts",
            &[
                &format!("Host: {host}"),
                &format!("Origin: http://{host}"),
                "Content-Type: application/json",
            ],
            "{}",
        )
        .error(403);
    }
    assert_eq!(contexts(a), 0);
    // A Host that is not text fails closed (second probe, G3).
    let mut c = crate::client::connect(a);
    c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: evil\xff.example\r\nConnection: close\r\n\r\n")
        .unwrap();
    read_response(&mut BufReader::new(c)).error(403);
    for host in [
        format!("{a}"),
        "localhost".into(),
        format!("[::1]:{}", a.port()),
    ] {
        let r = raw(a, "GET", "/v1/models", &[&format!("Host: {host}")], "");
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
}

#[test]
fn f8_allowed_hosts_and_cors_origins_open_exactly_what_they_name() {
    let cfg = ServeConfig {
        allowed_hosts: vec!["box.lan".into()],
        cors_origins: vec!["http://good.example".into()],
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let r = raw(a, "GET", "/v1/models", &["Host: box.lan:8080"], "");
    assert_eq!(r.status, 200, "{}", r.text());
    raw(a, "GET", "/v1/models", &["Host: evil.lan"], "").error(403);
    let r = raw(
        a,
        "POST",
        "/v1/contexts",
        &[
            "Host: box.lan",
            "Origin: http://good.example",
            "Content-Type: application/json",
        ],
        "{}",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://good.example")
    );
    raw(
        a,
        "POST",
        "/v1/contexts",
        &[
            "Host: box.lan",
            "Origin: http://evil.example",
            "Content-Type: application/json",
        ],
        "{}",
    )
    .error(403);
}

#[test]
fn f18_cors_origin_star_starts_and_allows_every_origin() {
    let cfg = ServeConfig {
        cors_origins: vec!["*".into()],
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let pre = raw(
        a,
        "OPTIONS",
        "/v1/completions",
        &[
            "Host: localhost",
            "Origin: http://anywhere.example",
            "Access-Control-Request-Method: POST",
            "Access-Control-Request-Headers: content-type",
        ],
        "",
    );
    assert!(pre.status < 300, "{} {}", pre.status, pre.text());
    assert_eq!(pre.header("access-control-allow-origin"), Some("*"));
    let r = raw(
        a,
        "POST",
        "/v1/contexts",
        &[
            "Host: localhost",
            "Origin: http://anywhere.example",
            "Content-Type: application/json",
        ],
        "{}",
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn f20_a_declared_body_over_max_body_gets_413_before_100_continue() {
    let cfg = ServeConfig {
        max_body: 1000,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let mut c = crate::client::connect(s.addr);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Expect: 100-continue\r\nContent-Length: 99999999\r\n\r\n",
    )
    .unwrap();
    let t = Instant::now();
    let r = read_response(&mut BufReader::new(c));
    // The answer comes at once, with no body sent (not 100, not 408 after 30 s).
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let e = r.error(413);
    assert!(e["message"].as_str().unwrap().contains("99999999"), "{e}");
}

#[test]
fn f19_a_context_salt_is_held_to_the_same_1024_bytes_as_a_completion() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let r = post(a, "/v1/contexts", &json!({"cache_salt": "s".repeat(1025)}));
    assert_eq!(r.error(400)["param"], "cache_salt");
    assert_eq!(contexts(a), 0);
    ok(a, "/v1/contexts", json!({"cache_salt": "s".repeat(1024)}));
}

#[test]
fn f7_the_ttl_never_reaps_a_context_while_it_generates() {
    let ttl = Duration::from_millis(500);
    let cfg = ServeConfig {
        context_ttl: ttl,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let c = id(&ok(a, "/v1/contexts", json!({})));
    ok(
        a,
        &format!("/v1/contexts/{c}/append"),
        json!({"text": "Once upon a time"}),
    );
    let t = Instant::now();
    let r = ok(
        a,
        &format!("/v1/contexts/{c}/generate"),
        json!({"max_tokens": 900, "temperature": 0, "ignore_eos": true, "chat": false}),
    );
    let took = t.elapsed();
    assert_eq!(r["usage"]["completion_tokens"], 900);
    // Otherwise the test proves nothing: the generation outlived the TTL severalfold.
    assert!(took > ttl * 3, "the generation took only {took:?}");
    // Its idle time starts when the generation ends: still there now...
    assert!(seq_len(a, &c) > 900);
    // ...and reaped once idle (a GET does not renew it).
    assert!(crate::client::eventually(5.0, || get(
        a,
        &format!("/v1/contexts/{c}")
    )
    .status
        == 404));
}

/// A context holding a short chat, and a fork of it taken as the reference.
fn chat_and_reference(a: SocketAddr) -> (String, String) {
    let c = id(&ok(a, "/v1/contexts", json!({})));
    ok(
        a,
        &format!("/v1/contexts/{c}/append"),
        json!({"messages": [{"role": "user", "content": "Name a colour."}]}),
    );
    let reference = id(&ok(a, &format!("/v1/contexts/{c}/fork"), json!({})));
    (c, reference)
}

/// After one more message, the context and its reference hold the same tokens.
fn same_after_append(a: SocketAddr, c: &str, reference: &str) {
    let msg = json!({"messages": [{"role": "user", "content": "Another."}]});
    let got = ok(a, &format!("/v1/contexts/{c}/append"), msg.clone());
    let want = ok(a, &format!("/v1/contexts/{reference}/append"), msg);
    assert_eq!(got["seq_len"], want["seq_len"]);
    let g = greedy_text(a, c);
    assert_eq!(g, greedy_text(a, reference));
}

fn greedy_text(a: SocketAddr, c: &str) -> String {
    let r = ok(
        a,
        &format!("/v1/contexts/{c}/generate"),
        json!({"max_tokens": 8, "temperature": 0}),
    );
    r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn f6_a_refused_chat_generation_leaves_the_context_as_it_was() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let (c, reference) = chat_and_reference(a);
    let before = seq_len(a, &c);
    let r = post(
        a,
        &format!("/v1/contexts/{c}/generate"),
        &json!({"prompt": "word ".repeat(5000), "max_tokens": 4}),
    );
    assert_eq!(r.error(400)["code"], "context_length_exceeded");
    assert_eq!(seq_len(a, &c), before);
    same_after_append(a, &c, &reference);
}

#[test]
fn f14_a_timed_out_context_generation_leaves_the_context_as_it_was() {
    let cfg = ServeConfig {
        request_timeout: Some(Duration::from_millis(700)),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let (c, reference) = chat_and_reference(a);
    let before = seq_len(a, &c);
    let r = post(
        a,
        &format!("/v1/contexts/{c}/generate"),
        &json!({"max_tokens": 2000, "ignore_eos": true}),
    );
    assert_eq!(r.error(503)["code"], "request_timeout");
    assert!(crate::client::eventually(5.0, || get(
        a,
        &format!("/v1/contexts/{c}")
    )
    .status
        == 200));
    assert_eq!(seq_len(a, &c), before);
    // A stream whose client hangs up is rolled back the same way.
    let mut open = crate::client::open_stream(
        a,
        &format!("/v1/contexts/{c}/generate"),
        &json!({"max_tokens": 500, "ignore_eos": true, "stream": true}),
    );
    for _ in 0..3 {
        open.next_event().unwrap();
    }
    drop(open);
    assert!(crate::client::eventually(5.0, || {
        let r = get(a, &format!("/v1/contexts/{c}"));
        r.status == 200 && r.json()["seq_len"].as_u64() == Some(before)
    }));
    same_after_append(a, &c, &reference);
}

#[test]
fn f15_a_chat_reply_never_takes_a_context_past_its_window() {
    let window = 64;
    let engine = EngineConfig {
        max_seq_tokens: Some(window),
        ..small_engine()
    };
    let s = start(ServeConfig::default(), engine);
    let a = s.addr;
    let (c, _) = chat_and_reference(a);
    let r = ok(
        a,
        &format!("/v1/contexts/{c}/generate"),
        json!({"max_tokens": 1000, "ignore_eos": true}),
    );
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    let len = seq_len(a, &c);
    assert!(len <= window as u64, "seq_len {len} > window {window}");
    // The context stays usable: it saves (in memory) and forks.
    let r = post(a, "/v1/snapshots", &json!({"context": c, "name": "full"}));
    assert_eq!(r.status, 201, "{}", r.text());
    ok(a, &format!("/v1/contexts/{c}/fork"), json!({}));
}

#[test]
fn f3_a_long_chat_message_is_rendered_and_tokenized_off_the_engine_thread() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let c = id(&ok(a, "/v1/contexts", json!({})));
    let long = " ".repeat(3_900_000);
    let append = json!({"messages": [{"role": "user", "content": long}]});
    let create = json!({"system": long});
    let (alone, attacked) = under_attack(a, 100, 1, |_, i| {
        let r = if i % 2 == 0 {
            post(a, &format!("/v1/contexts/{c}/append"), &append)
        } else {
            post(a, "/v1/contexts", &create)
        };
        // Too long for the window: refused, after the tokenizer's work.
        assert_eq!(r.status, 400, "{}", r.text());
    });
    assert_no_stall("a 3.9 MB chat message", alone, attacked);
    assert_eq!(seq_len(a, &c), 0);
}

#[test]
fn f11_idle_contexts_cannot_take_the_pool_from_requests() {
    // 128 pages of 16 tokens: contexts may hold 64 of them (half, `folio serve`'s
    // default). A context of 232 tokens holds 15 pages, 233 (after a generated token)
    // still 15.
    let engine = EngineConfig {
        kv_pages: 128,
        context_pages: Some(64),
        ..small_engine()
    };
    let s = start(ServeConfig::default(), engine);
    let a = s.addr;
    // Distinct tokens each time: equal ones would share their computed pages.
    let tokens = |k: u32| -> Vec<u32> {
        (0..232)
            .map(|i| 1000 + (i * 7919 + k * 13) % 30000)
            .collect()
    };
    let mut ids = Vec::new();
    let refused = loop {
        let c = id(&ok(a, "/v1/contexts", json!({})));
        let r = post(
            a,
            &format!("/v1/contexts/{c}/append"),
            &json!({"tokens": tokens(ids.len() as u32)}),
        );
        if r.status != 200 {
            break r;
        }
        ids.push(c);
        assert!(ids.len() < 8, "8 contexts of 232 tokens fit");
    };
    let e = refused.error(429);
    assert!(e["message"].as_str().unwrap().contains("64"), "{e}");
    assert_eq!(ids.len(), 4);
    // Pending tokens are counted too: computing them (a generation) changes nothing.
    for c in &ids {
        ok(
            a,
            &format!("/v1/contexts/{c}/generate"),
            json!({"max_tokens": 1, "chat": false}),
        );
    }
    // Forks share what they fork: each costs its copied page, not 14 more (63 of 64).
    for _ in 0..3 {
        ok(a, &format!("/v1/contexts/{}/fork", ids[0]), json!({}));
    }
    // Requests still get pages: four prompts of 232 new tokens need 60 of the 65 the
    // contexts leave.
    let prompts: Vec<Vec<u32>> = (10..14).map(tokens).collect();
    let r = ok(
        a,
        "/v1/completions",
        json!({"prompt": prompts, "max_tokens": 4}),
    );
    assert_eq!(r["usage"]["prompt_tokens"], 928);
    // Freeing a context makes room again.
    let c = id(&ok(a, "/v1/contexts", json!({})));
    let half = json!({"tokens": &tokens(20)[..116]});
    post(a, &format!("/v1/contexts/{c}/append"), &half).error(429);
    assert_eq!(request_delete(a, &ids[1]), 200);
    ok(a, &format!("/v1/contexts/{c}/append"), half);
}

fn request_delete(a: SocketAddr, id: &str) -> u16 {
    crate::client::request(a, "DELETE", &format!("/v1/contexts/{id}"), &[], b"").status
}

#[test]
fn f21_tokenize_pieces_show_control_tokens_as_their_text() {
    let s = start(ServeConfig::default(), small_engine());
    let t = ok(
        s.addr,
        "/tokenize",
        json!({"content": "<|im_start|>user", "add_special": false, "with_pieces": true}),
    );
    assert_eq!(t["pieces"][0], "<|im_start|>", "{t}");
    assert_eq!(
        t["pieces"].as_array().unwrap().len(),
        t["count"].as_u64().unwrap() as usize
    );
}

#[test]
fn f21_n_over_its_limit_says_that_limit_and_one_message_for_it() {
    let s = start(ServeConfig::default(), small_engine());
    for n in [129, 200, 256, 257, 100_000] {
        let r = post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": "Hi", "n": n, "max_tokens": 1}),
        );
        let e = r.error(400);
        assert_eq!(e["param"], "n");
        assert_eq!(e["message"], "n must be between 1 and 128", "n = {n}");
    }
    // The product with the prompts keeps its own message.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ["a", "b", "c"], "n": 100, "max_tokens": 1}),
    );
    assert!(r.error(400)["message"]
        .as_str()
        .unwrap()
        .contains("3 × 100"));
}

/// Second probe, G1: generations into contexts that start together cannot each take
/// the room left in the contexts' share: each reserves what it may sample.
#[test]
fn g1_concurrent_context_generations_stay_within_the_contexts_share() {
    let limit = 64;
    let engine = EngineConfig {
        context_pages: Some(limit),
        ..small_engine()
    };
    let s = start(ServeConfig::default(), engine);
    let a = s.addr;
    let ids: Vec<String> = (0..16)
        .map(|k| {
            let c = id(&ok(a, "/v1/contexts", json!({})));
            let toks: Vec<u32> = (0..16).map(|i| 1000 + i + 100 * k).collect();
            ok(
                a,
                &format!("/v1/contexts/{c}/append"),
                json!({"tokens": toks}),
            );
            c
        })
        .collect();
    let statuses: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = ids
            .iter()
            .map(|c| {
                sc.spawn(move || {
                    post(
                        a,
                        &format!("/v1/contexts/{c}/generate"),
                        &json!({"max_tokens": 1000, "ignore_eos": true, "chat": false}),
                    )
                    .status
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    assert!(statuses.contains(&200), "{statuses:?}");
    // Every page a context holds, counted once.
    let kv = get(a, "/v1/kv").json();
    let held = kv["pages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["holders"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h.as_str().unwrap().starts_with("ctx-"))
        })
        .count();
    assert!(
        held <= limit,
        "contexts hold {held} pages; their share is {limit}"
    );
    // The server still answers whole (past the end-of-text token: a sampled answer may
    // end early).
    let r = ok(
        a,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 8, "ignore_eos": true}),
    );
    assert_eq!(r["usage"]["completion_tokens"], 8);
}
