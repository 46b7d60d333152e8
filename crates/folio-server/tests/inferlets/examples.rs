//! The example programs of examples/inferlets/, run over HTTP.

use crate::client::{self, get, Open};
use crate::{assert_no_page_held, greedy, run, serial, shared_server};
use serde_json::{json, Value};

pub fn json_chunks(v: &Value) -> Vec<Value> {
    v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "json")
        .map(|c| c["json"].clone())
        .collect()
}

#[test]
fn best_of_n_forks_samples_and_scores_each_candidate() {
    let _s = serial();
    let a = shared_server();
    best_of_n_checks(a, "best_of_n");
}

/// Runs the best-of-n program uploaded as `name` (3 candidates): each candidate's
/// scores are log-probabilities that add up, the best is the top score, and no page
/// is held afterwards. Returns the JSON chunks.
pub fn best_of_n_checks(a: std::net::SocketAddr, name: &str) -> Vec<Value> {
    let r = run(
        a,
        name,
        json!({"prompt": "Name a primary colour.", "n": 3, "max_tokens": 12}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let out = json_chunks(&r.json());
    assert_eq!(out.len(), 4, "three candidates and the best: {out:?}");
    for (i, c) in out[..3].iter().enumerate() {
        assert_eq!(c["candidate"], i);
        let mean = c["mean_logprob"].as_f64().unwrap();
        let yes = c["judge_yes_logprob"].as_f64().unwrap();
        assert!(mean < 0.0 && mean > -30.0, "{c}");
        assert!(yes <= 0.0, "a log-probability: {c}");
        assert!(
            (c["score"].as_f64().unwrap() - (mean + yes)).abs() < 1e-4,
            "{c}"
        );
    }
    let best = &out[3]["best"];
    let top = out[..3]
        .iter()
        .max_by(|x, y| {
            x["score"]
                .as_f64()
                .partial_cmp(&y["score"].as_f64())
                .unwrap()
        })
        .unwrap();
    assert_eq!(best["candidate"], top["candidate"], "{out:?}");
    assert_no_page_held(a);
    out
}

#[test]
fn agent_loop_runs_five_calculator_steps_inside_the_guest() {
    let _s = serial();
    let a = shared_server();
    let items = ["apples", "pears", "plums", "figs", "kiwis", "limes"];
    let r = run(a, "agent", json!({"items": items, "max_steps": 8}));
    assert_eq!(r.status, 200, "{}", r.text());
    let out = json_chunks(&r.json());
    let steps: Vec<&Value> = out.iter().filter(|c| c.get("step").is_some()).collect();
    assert_eq!(
        steps.len(),
        5,
        "one tool step per item after the first: {out:?}"
    );
    let mut last_len = 0;
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i + 1);
        let call = s["call"].as_str().unwrap();
        assert!(call.starts_with("calc(") && call.ends_with(')'), "{s}");
        // The calculator ran in the guest: its result is the call's sum.
        let inner = &call["calc(".len()..call.len() - 1];
        let (x, y) = inner.split_once(" + ").unwrap();
        let sum: i64 = x.parse::<i64>().unwrap() + y.parse::<i64>().unwrap();
        assert_eq!(s["result"], sum, "{s}");
        // One context across the steps: it only grows.
        let len = s["context_tokens"].as_u64().unwrap();
        assert!(len > last_len, "{s}");
        last_len = len;
    }
    let end = out.last().unwrap();
    assert_eq!(end["steps"], 5);
    assert_eq!(end["true_total"], 3 + 5 + 7 + 11 + 13 + 17);
    assert!(
        end["answer"].as_str().unwrap().starts_with("The total is "),
        "{end}"
    );
    assert_no_page_held(a);
}

#[test]
fn json_extraction_answers_json_under_the_schema() {
    let _s = serial();
    let a = shared_server();
    json_extraction_checks(a, "json_extract");
}

/// Runs the JSON-extraction program uploaded as `name`: exactly the schema's keys
/// with the schema's types. Returns the extracted object.
pub fn json_extraction_checks(a: std::net::SocketAddr, name: &str) -> Value {
    let r = run(
        a,
        name,
        json!({"text": "Maria Lopez, 34, moved to Lisbon last spring to work as a nurse."}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let out = json_chunks(&r.json());
    let x = out.last().unwrap()["extracted"].clone();
    let obj = x.as_object().expect("an object");
    assert_eq!(obj.len(), 3, "exactly the schema's keys: {x}");
    assert!(x["name"].is_string() && x["city"].is_string(), "{x}");
    assert!(x["age"].is_i64(), "{x}");
    assert_no_page_held(a);
    x
}

#[test]
fn streamed_run_sends_one_event_per_piece_and_matches_completions() {
    let _s = serial();
    let a = shared_server();
    streamed_generate_checks(a, "generate");
}

/// Runs the plain-generation program uploaded as `name`, streamed and then as JSON:
/// one event per piece, the same greedy text as /v1/completions both ways.
pub fn streamed_generate_checks(a: std::net::SocketAddr, name: &str) {
    let prompt = "The capital of France is";
    let want = greedy(a, prompt);
    let mut o: Open = client::open_stream(
        a,
        &format!("/v1/inferlets/{name}/run"),
        &json!({"stream": true, "input": {"prompt": prompt, "max_tokens": 24}}),
    );
    assert_eq!(o.status, 200);
    let mut text = String::new();
    let mut pieces = 0;
    let mut done = None;
    while let Some(e) = o.next_event() {
        if e == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        match v["type"].as_str() {
            Some("text") => {
                pieces += 1;
                text.push_str(v["text"].as_str().unwrap());
            }
            Some("json") => assert_eq!(v["json"]["tokens"], 24, "{v}"),
            Some("done") => done = Some(v),
            _ => panic!("unexpected event {v}"),
        }
    }
    assert!(pieces > 1, "streamed piece by piece");
    assert_eq!(text, want, "the same greedy text as /v1/completions");
    let done = done.expect("a done event");
    assert!(done["usage"]["host_calls"].as_u64().unwrap() >= 3, "{done}");
    assert_no_page_held(a);
    // The JSON answer gathers the same chunks.
    let r = run(a, name, json!({"prompt": prompt, "max_tokens": 24}));
    assert_eq!(r.json()["text"], want);
    assert_eq!(get(a, "/health").status, 200);
}

#[test]
fn an_inferlet_answers_chat_completions_as_an_openai_model() {
    let _s = serial();
    let a = shared_server();
    let msgs = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}
    ]);
    let v = client::ok(
        a,
        "/v1/chat/completions",
        json!({"model": "inferlet:chat", "messages": msgs, "max_tokens": 16}),
    );
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "inferlet:chat");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    // The usage is the run's: its generation's prompt and generated tokens (the
    // hostile probe of 2026-12-07 found 0/0/0), and every answer's id is its own.
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 10 && (1..=16).contains(&c), "{v}");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + c), "{v}");
    let again = client::ok(
        a,
        "/v1/chat/completions",
        json!({"model": "inferlet:chat", "messages": msgs, "max_tokens": 16}),
    );
    assert_ne!(again["id"], v["id"], "two answers, two ids");
    // Streamed: a role chunk, content pieces that join to the same text, a finish,
    // and the usage chunk asked for.
    let mut o = client::open_stream(
        a,
        "/v1/chat/completions",
        &json!({"model": "inferlet:chat", "messages": msgs, "max_tokens": 16, "stream": true,
            "stream_options": {"include_usage": true}}),
    );
    assert_eq!(o.status, 200);
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    while let Some(e) = o.next_event() {
        if e == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&e).unwrap();
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        if c["choices"] == json!([]) {
            usage = Some(c["usage"].clone());
            continue;
        }
        text.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert_eq!(text, content, "streamed and whole answers agree");
    assert_eq!(finish.as_deref(), Some("stop"));
    let usage = usage.expect("the usage chunk");
    assert_eq!(
        usage["completion_tokens"], u["completion_tokens"],
        "{usage}"
    );
    // An unknown program is a 404, as an unknown model would be.
    client::post(
        a,
        "/v1/chat/completions",
        &json!({"model": "inferlet:nothing", "messages": msgs}),
    )
    .error(404);
    assert_no_page_held(a);
}
