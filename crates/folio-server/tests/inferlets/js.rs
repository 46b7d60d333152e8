//! The JavaScript examples of examples/inferlets/ (componentize-js guests, the same
//! programs as their Python twins), run over HTTP with the Python tests' checks.

use crate::examples::{
    best_of_n_checks, json_chunks, json_extraction_checks, streamed_generate_checks,
};
use crate::{assert_no_page_held, js_ready, run, serial, shared_server};
use serde_json::json;

#[test]
fn js_streamed_run_sends_one_event_per_piece_and_matches_completions() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    streamed_generate_checks(shared_server(), "generate_js");
}

#[test]
fn js_best_of_n_scores_each_candidate_and_samples_what_python_samples() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let js = best_of_n_checks(a, "best_of_n_js");
    // The same seeds, forks and judge: the same candidates and scores as the
    // Python program (sampling runs on the host).
    let py = best_of_n_checks(a, "best_of_n");
    for (j, p) in js.iter().zip(&py).take(3) {
        assert_eq!(j["text"], p["text"], "js {j} python {p}");
        for k in ["mean_logprob", "judge_yes_logprob", "score"] {
            let (x, y) = (j[k].as_f64().unwrap(), p[k].as_f64().unwrap());
            assert!((x - y).abs() < 1e-6, "{k}: js {j} python {p}");
        }
    }
    assert_eq!(js[3]["best"]["candidate"], py[3]["best"]["candidate"]);
}

#[test]
fn js_json_extraction_answers_json_under_the_schema() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let js = json_extraction_checks(a, "json_extract_js");
    assert_eq!(js, json_extraction_checks(a, "json_extract"), "as Python");
}

#[test]
fn js_errors_end_the_run_with_the_programs_message() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    // A JavaScript exception leaving main: its name and message.
    let e = run(a, "generate_js", json!({"max_tokens": 4})).error(400);
    assert_eq!(e["code"], "inferlet_error", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("TypeError: append takes a string, not undefined"),
        "{e}"
    );
    // A failed host call: the SDK's FolioError, "kind: message".
    let bad = json!({"text": "x", "schema": {"type": "object", "properties": 7}});
    let e = run(a, "json_extract_js", bad).error(400);
    assert_eq!(e["code"], "inferlet_error", "{e}");
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("invalid: the grammar does not compile"), "{e}");
    assert_no_page_held(a);
    let ok = run(a, "generate_js", json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(json_chunks(&ok.json()).last().unwrap()["tokens"], 2);
}
