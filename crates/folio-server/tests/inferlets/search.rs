//! The search and speculative examples of examples/inferlets/ (beam.py, lookup.py),
//! run over HTTP.

use crate::examples::json_chunks;
use crate::{assert_no_page_held, greedy, run, serial, shared_server};
use serde_json::{json, Value};

fn last(v: &Value) -> Value {
    json_chunks(v).last().expect("a result").clone()
}

#[test]
fn beam_search_of_width_one_is_greedy_decoding() {
    let _s = serial();
    let a = shared_server();
    let prompt = "The capital of France is";
    let want = greedy(a, prompt);
    let r = run(
        a,
        "beam",
        json!({"prompt": prompt, "width": 1, "max_tokens": 24}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let beams = last(&r.json())["beams"].clone();
    assert_eq!(beams.as_array().unwrap().len(), 1, "{beams}");
    assert_eq!(beams[0]["text"], want.as_str(), "the greedy text");
    assert_no_page_held(a);
}

#[test]
fn beam_search_keeps_the_best_beams_ranked_by_log_probability() {
    let _s = serial();
    let a = shared_server();
    let r = run(
        a,
        "beam",
        json!({"prompt": "The capital of France is", "width": 3, "max_tokens": 6}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let out = json_chunks(&r.json());
    let steps: Vec<&Value> = out.iter().filter(|c| c.get("step").is_some()).collect();
    assert_eq!(steps.len(), 6, "one event per step: {out:?}");
    let beams = out.last().unwrap()["beams"].as_array().unwrap().clone();
    assert_eq!(beams.len(), 3, "{beams:?}");
    let scores: Vec<f64> = beams.iter().map(|b| b["score"].as_f64().unwrap()).collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "best first: {scores:?}"
    );
    assert!(scores.iter().all(|&s| s < 0.0), "{scores:?}");
    // The last step's scores are the beams'.
    let last_step: Vec<f64> = steps[5]["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    assert_eq!(last_step, scores);
    // Each beam holds max_tokens tokens, and no two are the same sequence.
    let toks: Vec<&Value> = beams.iter().map(|b| &b["tokens"]).collect();
    assert!(
        toks.iter().all(|t| t.as_array().unwrap().len() == 6),
        "{toks:?}"
    );
    assert!(
        toks[0] != toks[1] && toks[0] != toks[2] && toks[1] != toks[2],
        "{toks:?}"
    );
    // A step's best total never rises: each step adds a log-probability.
    let best: Vec<f64> = steps
        .iter()
        .map(|s| s["scores"][0].as_f64().unwrap())
        .collect();
    assert!(best.windows(2).all(|w| w[1] <= w[0]), "{best:?}");
    assert_no_page_held(a);
}

#[test]
fn prompt_lookup_decoding_gives_the_greedy_text_and_accepts_drafted_tokens() {
    let _s = serial();
    let a = shared_server();
    let prompt = "Repeat after me: the quick brown fox jumps over the lazy dog. \
                  the quick brown fox jumps over the lazy dog. the quick";
    let want = greedy(a, prompt);
    let r = run(a, "lookup", json!({"prompt": prompt, "max_tokens": 24}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = last(&r.json());
    assert_eq!(v["text"], want.as_str(), "exactly greedy decoding: {v}");
    assert_eq!(v["tokens"], 24, "{v}");
    let drafted = v["drafted"].as_u64().unwrap();
    let accepted = v["accepted"].as_u64().unwrap();
    assert!(
        accepted >= 4 && accepted <= drafted,
        "the repeated phrase is drafted: {v}"
    );
    // Each pass checks a whole draft: fewer passes than tokens.
    let passes = v["passes"].as_u64().unwrap();
    assert_eq!(
        passes + accepted,
        24,
        "a pass gives its accepted tokens and one more: {v}"
    );
    assert_no_page_held(a);
}
