//! The Messages API's own edges over HTTP: a malformed body is answered in Anthropic's
//! envelope (its SDK reads no other), and `count_tokens` counts whatever `max_tokens`
//! says (what would be generated plays no part in a count).

use crate::client::{open_stream, post, request};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::{json, Value};

fn anthropic_error(status: u16, body: &Value) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(
        body["error"]["type"], "invalid_request_error",
        "{status}: {body}"
    );
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[test]
fn malformed_bodies_get_anthropics_envelope_and_counts_ignore_max_tokens() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let ct = [("Content-Type", "application/json")];
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let r = request(a, "POST", path, &ct, b"{\"messages\": [");
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        anthropic_error(400, &r.json());
    }
    let ask = json!([{"role": "user", "content": "Hello there"}]);
    let n = post(a, "/v1/messages/count_tokens", &json!({"messages": ask}));
    assert_eq!(n.status, 200, "{}", n.text());
    let count = n.json()["input_tokens"].as_u64().unwrap();
    assert!(count > 0);
    for max in [json!(0), json!(1_000_000), json!("x")] {
        let r = post(
            a,
            "/v1/messages/count_tokens",
            &json!({"messages": ask, "max_tokens": max}),
        );
        assert_eq!(r.status, 200, "max_tokens {max}: {}", r.text());
        assert_eq!(r.json(), json!({"input_tokens": count}));
    }
    let r = post(
        a,
        "/v1/messages",
        &json!({"messages": ask, "max_tokens": "x"}),
    );
    assert_eq!(r.status, 400);
    anthropic_error(400, &r.json());
}

/// A forced tool call cut short by `max_tokens`: the whole answer's `input` is what
/// the streamed `input_json_delta`s join to, closed (what Anthropic's SDKs make of
/// them), never an object the model did not write (the hostile probe of 2026-12-07
/// found `{}` whole and `{"a":1000` streamed).
#[test]
fn a_tool_call_cut_short_gives_the_same_input_whole_and_streamed() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let body = json!({"model": "m", "max_tokens": 10, "temperature": 0,
        "messages": [{"role": "user", "content": "call f"}],
        "tools": [{"name": "f", "input_schema": {"type": "object",
            "properties": {"a": {"type": "integer"}}, "required": ["a"]}}],
        "tool_choice": {"type": "tool", "name": "f"}});
    let whole = post(a, "/v1/messages", &body).json();
    assert_eq!(whole["stop_reason"], "max_tokens", "{whole}");
    let block = &whole["content"][0];
    assert_eq!(block["type"], "tool_use", "{whole}");
    let mut body = body;
    body["stream"] = json!(true);
    let mut o = open_stream(a, "/v1/messages", &body);
    let mut partial = String::new();
    while let Some(e) = o.next_event() {
        let c: Value = serde_json::from_str(&e).unwrap();
        if c["type"] == "message_stop" {
            break;
        }
        if let Some(p) = c["delta"]["partial_json"].as_str() {
            partial.push_str(p);
        }
    }
    let closed: Value = serde_json::from_str(&format!("{partial}}}"))
        .unwrap_or_else(|e| panic!("{partial:?} and a brace: {e}"));
    assert_eq!(block["input"], closed, "{whole}");
    assert_ne!(block["input"], json!({}), "{whole}");
}

/// A message ended by one of several stop sequences names it, whole and streamed, as
/// Anthropic does (the hostile probe of 2026-12-08: with more than one listed,
/// `stop_sequence` was null).
#[test]
fn the_stop_sequence_that_ended_a_message_is_named_among_several() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let body = |stops: Value| {
        json!({"model": "m", "max_tokens": 24, "temperature": 0, "stop_sequences": stops,
            "messages": [{"role": "user", "content": "Write a sentence about the sea."}]})
    };
    let free = post(a, "/v1/messages", &body(json!([]))).json();
    let text = free["content"][0]["text"].as_str().unwrap().to_string();
    // A word from the middle of the free answer, listed after one that never comes.
    let word = text
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("{text:?}"))
        .to_string();
    let stops = json!(["zqxj never", word]);
    let whole = post(a, "/v1/messages", &body(stops.clone())).json();
    assert_eq!(whole["stop_reason"], "stop_sequence", "{whole}");
    assert_eq!(whole["stop_sequence"], json!(word), "{whole}");
    let cut = whole["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(word.as_str()),
        "{cut:?}"
    );
    let mut streamed = body(stops);
    streamed["stream"] = json!(true);
    let mut o = open_stream(a, "/v1/messages", &streamed);
    let mut delta = Value::Null;
    while let Some(e) = o.next_event() {
        let c: Value = serde_json::from_str(&e).unwrap();
        if c["type"] == "message_delta" {
            delta = c["delta"].clone();
        }
        if c["type"] == "message_stop" {
            break;
        }
    }
    assert_eq!(delta["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(delta["stop_sequence"], json!(word), "{delta}");
}

/// A last assistant turn is the start of the answer, which continues it (Anthropic's
/// prefill; the hostile probe of 2026-12-08 found it answered as a new turn, the same
/// text as without it): the prompt ends with the prefill's text and no end of turn,
/// and the answer holds only what follows. On chat completions the same is vLLM's
/// `continue_final_message`; without an assistant message last it is a 400.
#[test]
fn an_assistant_prefill_is_continued_not_answered() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let ask = json!({"role": "user", "content": "Count from 1 to 10."});
    let prefill = "1, 2, 3, 4, 5, 6, 7, 8,";
    let body = json!({"model": "m", "max_tokens": 6, "temperature": 0,
        "messages": [ask, {"role": "assistant", "content": prefill}]});
    let whole = post(a, "/v1/messages", &body).json();
    let text = whole["content"][0]["text"].as_str().unwrap().to_string();
    // The same prompt by hand: the template's text up to the prefill, then greedy.
    let chat = json!({"messages": [ask, {"role": "assistant", "content": prefill}],
        "continue_final_message": true, "max_tokens": 6, "temperature": 0});
    let r = post(a, "/v1/chat/completions", &chat).json();
    assert_eq!(r["choices"][0]["message"]["content"], json!(text), "{r}");
    eprintln!("continued: {text:?}");
    // Without the prefill the model starts its own count; with it, it goes on.
    let free = post(
        a,
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 6,
        "temperature": 0, "messages": [ask]}),
    )
    .json();
    assert_ne!(free["content"][0]["text"], json!(text), "{whole}");
    assert!(
        text.trim_start().starts_with('9'),
        "{text:?} does not go on from 8"
    );
    // Continuing needs an assistant message last.
    let bad = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [ask],
        "continue_final_message": true, "max_tokens": 2}),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
}
