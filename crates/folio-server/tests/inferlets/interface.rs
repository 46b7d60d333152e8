//! The interface's newer calls through example programs over HTTP: `score` (one
//! pass over a text: examples/inferlets/score.py, and the speculative loop in
//! lookup.py), snapshots from a guest (`save`, `open`: snapshot.py), the raw page
//! operations, and the run's page quota.

use crate::examples::json_chunks;
use crate::{assert_no_page_held, run, serial, shared_server, PAGES};
use serde_json::{json, Value};

use crate::client;

fn last(v: &Value) -> Value {
    json_chunks(v).last().expect("a result").clone()
}

/// The logprobs `score` gives a text are the ones greedy decoding gave the same
/// tokens, bit for bit (a row's logits do not depend on how the rows were batched or
/// chunked), and each token is the pass's top choice in its place.
#[test]
fn score_gives_each_token_the_logprob_greedy_decoding_gave_it() {
    let _s = serial();
    let a = shared_server();
    let prompt = "The capital of France is";
    let v = client::ok(
        a,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 1}),
    );
    let text = v["choices"][0]["text"].as_str().unwrap();
    let want: Vec<f32> = v["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let r = run(a, "score", json!({"prompt": prompt, "text": text}));
    assert_eq!(r.status, 200, "{}", r.text());
    // Scoring is no generation: the run's token counts leave it out.
    let usage = &r.json()["usage"];
    assert_eq!(usage["prompt_tokens"], 0, "{usage}");
    assert_eq!(usage["completion_tokens"], 0, "{usage}");
    let s = last(&r.json());
    let tokens = s["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len(),
        want.len(),
        "the text re-tokenizes to the same count: {s}"
    );
    let got: Vec<f32> = s["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "score {got:?} against greedy decoding {want:?}"
    );
    assert_eq!(&s["top"], &s["tokens"], "greedy tokens are the top choices");
    assert!(s["perplexity"].as_f64().unwrap() >= 1.0, "{s}");
    assert_no_page_held(a);
}

/// A guest saves a context as a snapshot; the next run opens it instead of computing
/// it again, and answers the same.
#[test]
fn a_guest_saves_a_snapshot_and_the_next_run_opens_it() {
    let _s = serial();
    let a = shared_server();
    let input = json!({
        "name": "inferlet-system",
        "system": "You answer with one word. You are a geography quiz.",
        "questions": ["Capital of France?", "Capital of Italy?"],
        "max_tokens": 8,
    });
    let first = run(a, "snapshot", input.clone());
    assert_eq!(first.status, 200, "{}", first.text());
    let first = last(&first.json());
    assert_eq!(first["opened"], false, "{first}");
    let names = client::get(a, "/v1/snapshots").json();
    assert!(
        names.to_string().contains("inferlet-system"),
        "the guest's snapshot is the server's: {names}"
    );
    let second = run(a, "snapshot", input);
    assert_eq!(second.status, 200, "{}", second.text());
    let second = last(&second.json());
    assert_eq!(second["opened"], true, "{second}");
    assert_eq!(second["answers"], first["answers"]);
    assert_eq!(second["base_len"], first["base_len"]);
    let d = client::request(a, "DELETE", "/v1/snapshots/inferlet-system", &[], b"");
    assert!(d.status == 200 || d.status == 204, "{}", d.text());
    assert_no_page_held(a);
}

#[test]
fn the_raw_page_operations_move_the_page_counts() {
    let _s = serial();
    let a = shared_server();
    let r = run(a, "snapshot", json!({"raw": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = last(&r.json());
    let steps = v["steps"].as_array().unwrap();
    let at = |i: usize, k: &str| steps[i][k].as_u64().unwrap();
    assert_eq!(at(0, "spare_pages"), 0, "{v}");
    assert_eq!(at(1, "spare_pages"), 2, "reserved ahead: {v}");
    assert_eq!(at(2, "spare_pages"), 0, "released: {v}");
    assert_eq!(
        at(3, "seq_len"),
        at(0, "seq_len") - 1,
        "one token dropped: {v}"
    );
    assert_eq!(at(3, "committed_pages"), at(0, "committed_pages"), "{v}");
    assert_eq!(
        v["commit_partial"], "invalid",
        "a partial page is not committed: {v}"
    );
    assert_no_page_held(a);
}

/// Contexts past the run's page quota: the run stops with 429, its pages return.
#[test]
fn a_run_past_its_page_quota_is_stopped_and_its_pages_return() {
    let _s = serial();
    let a = shared_server();
    let r = client::post(
        a,
        "/v1/inferlets/hostile/run",
        &json!({"input": {"attack": "pages"}, "time_limit": 60.0}),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    let e = r.json()["error"].clone();
    assert_eq!(e["code"], "inferlet_quota", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains(&format!("over its quota of {PAGES}")),
        "{e}"
    );
    assert_no_page_held(a);
}
