//! folio as a replica behind a router (issue 41): `POST /v1/cache/match` answers how
//! many leading tokens of a prompt the replica holds, before the request is sent; `/metrics` carries the figures routers
//! built for vLLM score replicas by, under vLLM's names.

use crate::client::{get, metric, post};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::{json, Value};

/// The cache probe says what the request then reports as cached: the same count, per
/// salt, for text, tokens and chat messages; nothing before the prefix is computed.
#[test]
fn cache_match_predicts_the_cached_tokens_of_the_request() {
    let s = start(ServeConfig::default(), small_engine());
    let prefix = "The history of the printing press is long. ".repeat(30);
    let probe = |body: Value| {
        let r = post(s.addr, "/v1/cache/match", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "cache.match");
        assert_eq!(v["tiers"]["memory"], v["cached_tokens"]);
        (
            v["prompt_tokens"].as_u64().unwrap(),
            v["cached_tokens"].as_u64().unwrap(),
        )
    };
    let complete = |prompt: &str, salt: Option<&str>| {
        let mut b = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0});
        if let Some(s) = salt {
            b["cache_salt"] = json!(s);
        }
        let u = &post(s.addr, "/v1/completions", &b).json()["usage"];
        (
            u["prompt_tokens"].as_u64().unwrap(),
            u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        )
    };
    let first = format!("{prefix}First");
    assert_eq!(
        probe(json!({"prompt": first})).1,
        0,
        "an empty cache holds nothing"
    );
    complete(&first, None);

    let second = format!("{prefix}Second");
    let (n, cached) = probe(json!({"prompt": second}));
    assert!(
        cached >= 256,
        "a 300-token shared prefix is mostly cached: {cached}"
    );
    // The same prompt as token ids.
    let ids: Vec<u64> = post(s.addr, "/tokenize", &json!({"content": second})).json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(probe(json!({"tokens": ids})), (n, cached));
    assert_eq!(
        complete(&second, None),
        (n, cached),
        "the probe predicts the request"
    );
    // Now the whole prompt is held; a request still computes its last token (its
    // logits), so it reports one fewer.
    assert_eq!(probe(json!({"tokens": ids})), (n, n));
    assert_eq!(complete(&second, None), (n, n - 1));

    // Another tenant's salt sees none of it, then its own.
    assert_eq!(
        probe(json!({"prompt": second, "cache_salt": "tenant-a"})).1,
        0
    );
    complete(&format!("{prefix}Third"), Some("tenant-a"));
    let (n, cached) = probe(json!({"prompt": format!("{prefix}Fourth"), "cache_salt": "tenant-a"}));
    assert!(cached >= 256);
    assert_eq!(
        complete(&format!("{prefix}Fourth"), Some("tenant-a")),
        (n, cached)
    );

    // Chat messages are rendered as the chat route renders them.
    let chat = |content: &str| json!({"messages": [{"role": "user", "content": content}]});
    let c = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": chat(&format!("{prefix}One"))["messages"], "max_tokens": 2}),
    )
    .json();
    assert!(c["usage"].is_object(), "{c}");
    let (n, cached) = probe(chat(&format!("{prefix}Two")));
    assert!(cached >= 256, "{cached}");
    let c = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": chat(&format!("{prefix}Two"))["messages"], "max_tokens": 2}),
    )
    .json();
    let u = &c["usage"];
    assert_eq!(u["prompt_tokens"].as_u64().unwrap(), n);
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        cached
    );
}

/// A malformed probe is a 400 naming the field, never a 500.
#[test]
fn cache_match_rejects_malformed_probes() {
    let s = start(ServeConfig::default(), small_engine());
    for (body, param) in [
        (json!({}), "prompt"),
        (json!({"prompt": "a", "tokens": [1]}), "prompt"),
        (json!({"tokens": [1, 4_000_000_000u64]}), "tokens"),
        (
            json!({"prompt": "a", "cache_salt": "x".repeat(10_000)}),
            "cache_salt",
        ),
    ] {
        let r = post(s.addr, "/v1/cache/match", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.text());
    }
    for body in [
        json!({"prompt": "a", "unknown": 1}),
        json!({"tokens": "abc"}),
    ] {
        let r = post(s.addr, "/v1/cache/match", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
}

/// `/metrics` carries vLLM's own names for what llm-d's scorers and the vLLM production
/// stack's router read: the queues, KV usage (both names), prefix-cache queries and
/// hits, and the cache's configuration with its block size.
#[test]
fn metrics_carry_vllm_names_for_routers() {
    let s = start(ServeConfig::default(), small_engine());
    let prompt = "The history of the printing press is long. ".repeat(30);
    for _ in 0..2 {
        post(
            s.addr,
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 2, "temperature": 0}),
        );
    }
    let page = get(s.addr, "/metrics").text();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
    ] {
        assert!(page.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    assert!(
        page.lines()
            .any(|l| l.starts_with("vllm:cache_config_info{")
                && l.contains("block_size=\"16\"")
                && l.ends_with(" 1")),
        "{page}"
    );
    let hits = metric(s.addr, "vllm:prefix_cache_hits_total", "model_name");
    assert_eq!(
        hits,
        metric(s.addr, "folio:prefix_cache_hits_total", "model_name")
    );
    assert!(hits >= 256.0, "{hits}");
    let usage = metric(s.addr, "vllm:kv_cache_usage_perc", "model_name");
    assert!((0.0..=1.0).contains(&usage), "{usage}");
}
