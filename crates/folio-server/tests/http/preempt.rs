//! A pool too small for the load: eight streams whose pages together need twice the
//! pool. The scheduler preempts (frees a sequence's pages and recomputes it later);
//! every stream still completes, and its text is the same request's run alone
//! (greedy decoding is batch-invariant, and recomputed K/V equal the first): nothing
//! lost, nothing sent twice.

use crate::client::{eventually, get, metric, open_stream, post};
use crate::server::start;
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::json;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "List three prime numbers:",
    "Once upon a time, in a quiet village,",
    "def fibonacci(n):",
    "Explain gravity to a child.",
    "My favourite season is autumn because",
    "The best way to learn a language is",
    "Write a short poem about the sea.",
];
const MAX_TOKENS: usize = 56;

fn body(p: &str, stream: bool) -> serde_json::Value {
    json!({"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": true,
           "stream": stream, "stream_options": {"include_usage": true}})
}

#[test]
fn a_pool_too_small_for_the_load_preempts_and_every_stream_is_whole() {
    // 16 pages of 16 tokens; each request needs 4 (a short prompt and 56 tokens):
    // eight at once need 32.
    let cfg = EngineConfig {
        kv_pages: 16,
        max_seq_tokens: Some(256),
        ..EngineConfig::default()
    };
    let s = start(ServeConfig::default(), cfg);
    let a = s.addr;
    let alone: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let r = post(a, "/v1/completions", &body(p, false));
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    let before = metric(a, "folio:num_preemptions_total", "model_name");
    let clients: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let p = p.to_string();
            std::thread::spawn(move || {
                let mut open = open_stream(a, "/v1/completions", &body(&p, true));
                assert_eq!(open.status, 200);
                let (mut text, mut usage, mut finish, mut done) =
                    (String::new(), None, Vec::new(), false);
                while let Some(ev) = open.next_event() {
                    if ev == "[DONE]" {
                        done = true;
                        break;
                    }
                    let v: serde_json::Value = serde_json::from_str(&ev).unwrap();
                    assert!(v.get("error").is_none(), "{v}");
                    if !v["usage"].is_null() {
                        usage = Some(v["usage"]["completion_tokens"].clone());
                    }
                    for c in v["choices"].as_array().unwrap() {
                        text.push_str(c["text"].as_str().unwrap_or(""));
                        if let Some(f) = c["finish_reason"].as_str() {
                            finish.push(f.to_string());
                        }
                    }
                }
                (text, usage, finish, done)
            })
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let (text, usage, finish, done) = c.join().unwrap();
        assert!(done, "stream {i} ended without [DONE]");
        assert_eq!(text, alone[i], "stream {i}");
        assert_eq!(usage, Some(json!(MAX_TOKENS)), "stream {i}");
        assert_eq!(finish, vec!["length".to_string()], "stream {i}");
    }
    let preempted = metric(a, "folio:num_preemptions_total", "model_name") - before;
    assert!(preempted >= 1.0, "the pool never ran dry: {preempted}");
    let idle = || {
        metric(a, "folio:kv_pages", "state=\"working\"") == 0.0
            && metric(a, "folio:kv_pages", "state=\"committed\"") == 0.0
    };
    assert!(eventually(5.0, idle), "{}", get(a, "/metrics").text());
    assert_eq!(get(a, "/v1/kv/check").status, 200);
    eprintln!("8 streams whole and identical to alone; {preempted} preemptions");
}
