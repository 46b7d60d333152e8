//! The JavaScript examples of examples/inferlets/ (componentize-js guests, the same
//! programs as their Python twins), run over HTTP with the Python tests' checks or
//! against the Python programs' answers.

use crate::client;
use crate::examples::{
    best_of_n_checks, json_chunks, json_extraction_checks, streamed_generate_checks,
};
use crate::{assert_no_page_held, greedy, js_ready, run, serial, shared_server};
use serde_json::{json, Value};
use std::net::SocketAddr;

/// The JSON chunks of a run of `name` that answered 200.
fn chunks(a: SocketAddr, name: &str, input: Value) -> Vec<Value> {
    let r = run(a, name, input);
    assert_eq!(r.status, 200, "{name}: {}", r.text());
    json_chunks(&r.json())
}

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

#[test]
fn js_agent_runs_its_calculator_steps_inside_the_guest_as_python_does() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let input =
        json!({"items": ["apples", "pears", "plums", "figs", "kiwis", "limes"], "max_steps": 8});
    let out = chunks(a, "agent_js", input.clone());
    let steps: Vec<&Value> = out.iter().filter(|c| c.get("step").is_some()).collect();
    assert!(steps.len() >= 4, "tool steps: {out:?}");
    let mut last_len = 0;
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i + 1);
        let call = s["call"].as_str().unwrap();
        let inner = call
            .strip_prefix("calc(")
            .and_then(|c| c.strip_suffix(')'))
            .unwrap_or_else(|| panic!("a calc call: {s}"));
        // The calculator ran in the guest: its result is the call's sum.
        let (x, y) = inner.split_once(" + ").unwrap();
        let sum: i64 = x.parse::<i64>().unwrap() + y.parse::<i64>().unwrap();
        assert_eq!(s["result"], sum, "{s}");
        // One context across the steps: it only grows.
        let len = s["context_tokens"].as_u64().unwrap();
        assert!(len > last_len, "{s}");
        last_len = len;
    }
    let end = out.last().unwrap();
    assert_eq!(end["steps"], steps.len());
    assert_eq!(end["true_total"], 3 + 5 + 7 + 11 + 13 + 17);
    assert!(
        end["answer"].as_str().unwrap().starts_with("The total is "),
        "{end}"
    );
    // Greedy throughout: the same calls and answer as agent.py.
    let py = chunks(a, "agent", input);
    assert_eq!(out, py, "as Python");
    assert_no_page_held(a);
}

/// `/v1/chat/completions` answered by the inferlet `name`: its reply.
fn chat_reply(a: SocketAddr, name: &str) -> String {
    let msgs = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}
    ]);
    let v = client::ok(
        a,
        "/v1/chat/completions",
        json!({"model": format!("inferlet:{name}"), "messages": msgs, "max_tokens": 16}),
    );
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant", "{v}");
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn js_chat_answers_chat_completions_as_the_python_chat_does() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let js = chat_reply(a, "chat_js");
    assert!(!js.is_empty());
    assert_eq!(js, chat_reply(a, "chat"), "as Python");
    assert_no_page_held(a);
}

#[test]
fn js_beam_search_of_width_one_is_greedy_and_wider_beams_match_python() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let prompt = "The capital of France is";
    let want = greedy(a, prompt);
    let out = chunks(
        a,
        "beam_js",
        json!({"prompt": prompt, "width": 1, "max_tokens": 24}),
    );
    let beams = out.last().unwrap()["beams"].clone();
    assert_eq!(beams.as_array().unwrap().len(), 1, "{beams}");
    assert_eq!(beams[0]["text"], want.as_str(), "the greedy text");
    // Width 3: the same steps and beams as beam.py.
    let input = json!({"prompt": prompt, "width": 3, "max_tokens": 6});
    let js = chunks(a, "beam_js", input.clone());
    assert_eq!(js.len(), 7, "one event per step and the beams: {js:?}");
    assert_eq!(js.last().unwrap()["beams"].as_array().unwrap().len(), 3);
    assert_eq!(js, chunks(a, "beam", input), "as Python");
    assert_no_page_held(a);
}

#[test]
fn js_prompt_lookup_with_score_is_greedy_in_fewer_passes_than_tokens() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let prompt = "Repeat after me: the quick brown fox jumps over the lazy dog. \
                  the quick brown fox jumps over the lazy dog. the quick";
    // `greedy` asks /v1/completions for 24 tokens.
    let want = greedy(a, prompt);
    let out = chunks(a, "lookup_js", json!({"prompt": prompt, "max_tokens": 24}));
    let v = out.last().unwrap();
    assert_eq!(v["text"], want.as_str(), "exactly greedy decoding: {v}");
    assert_eq!(v["tokens"], 24, "{v}");
    assert_eq!(v["finish"], "length", "{v}");
    let drafted = v["drafted"].as_u64().unwrap();
    let accepted = v["accepted"].as_u64().unwrap();
    let passes = v["passes"].as_u64().unwrap();
    assert!(
        accepted >= 4 && accepted <= drafted,
        "the repeated phrase is drafted: {v}"
    );
    assert_eq!(
        passes + accepted,
        24,
        "a pass gives its accepted tokens and one more: {v}"
    );
    assert_no_page_held(a);
}

#[test]
fn js_a_saved_snapshot_opens_with_the_same_tokens_and_continuation() {
    let _s = serial();
    if !js_ready() {
        return;
    }
    let a = shared_server();
    let input =
        json!({"prompt": "The capital of France is", "name": "js-snapshot", "max_tokens": 12});
    let out = chunks(a, "snapshot_js", input);
    let v = out.last().unwrap();
    assert_eq!(v["same_tokens"], true, "{v}");
    assert_eq!(v["restored"], v["original"], "the same continuation: {v}");
    let ops = v["ops"].as_array().unwrap();
    let field = |i: usize, when: &str, k: &str| ops[i][when][k].as_u64().unwrap();
    for (i, o) in ops.iter().enumerate().take(3) {
        assert!(o["error"].is_null(), "{o}");
        assert_eq!(
            o["op"].as_str().unwrap(),
            ["reservePages(2)", "releasePages(2)", "truncateWorking(1)"][i]
        );
    }
    // Reserving and releasing pages leaves the tokens as they were, and the release
    // leaves no more working pages than the reservation did.
    for i in 0..2 {
        assert_eq!(
            field(i, "after", "seqLen"),
            field(i, "before", "seqLen"),
            "{v}"
        );
    }
    assert!(
        field(1, "after", "workingPages") <= field(0, "after", "workingPages"),
        "{v}"
    );
    assert_eq!(
        field(2, "after", "seqLen"),
        field(2, "before", "seqLen") - 1,
        "{v}"
    );
    // Committing a page: done, or refused with the SDK's error (no full working page).
    let c = &ops[3];
    assert!(c["error"].is_null() || c["error"].is_string(), "{c}");
    assert!(
        field(3, "after", "committedPages") >= field(3, "before", "committedPages"),
        "{c}"
    );
    let d = crate::raw(a, "DELETE", "/v1/snapshots/js-snapshot", &[], b"");
    assert_eq!(d.status, 200, "{}", d.text());
    assert_no_page_held(a);
}
