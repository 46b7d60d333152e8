//! Tool calls over HTTP: the same output answered whole and streamed gives the same
//! content, calls and finish reason (probe F13). Outputs are forced with `tools`
//! (auto) plus `guided_choice: [TEXT]`, as the probe did; a `required` call is cut by
//! `max_tokens`.

use crate::client::post;
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::{json, Map, Value};
use std::net::SocketAddr;

/// A stream's chunks put back together as an OpenAI client does: content from the
/// deltas' `content` (null until one has a string), each tool call by its `index`
/// (id, type and name from the delta that brings them, `function.arguments`
/// concatenated), and the finish reason. Returns `(message, finish_reason)`, ids
/// left out.
fn reassemble(events: &[String]) -> (Value, Value) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let (mut content, mut calls, mut finish) = (Value::Null, Vec::<Value>::new(), Value::Null);
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let Some(choice) = chunk["choices"].get(0) else {
            continue; // the usage chunk
        };
        let delta = &choice["delta"];
        if let Some(c) = delta["content"].as_str() {
            content = Value::String(format!("{}{c}", content.as_str().unwrap_or("")));
        }
        for d in delta["tool_calls"].as_array().into_iter().flatten() {
            let k = d["index"].as_u64().unwrap() as usize;
            if k == calls.len() {
                assert!(d["id"].is_string(), "a call's first delta has its id: {d}");
                calls.push(json!({"type": d["type"], "function": {"name": d["function"]["name"], "arguments": ""}}));
            }
            let args = d["function"]["arguments"].as_str().unwrap_or("");
            let all = &mut calls[k]["function"]["arguments"];
            *all = Value::String(format!("{}{args}", all.as_str().unwrap()));
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert("content".into(), content);
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    (Value::Object(m), finish)
}

/// The unstreamed answer's `(message, finish_reason)`, ids left out.
fn whole(r: &Value) -> (Value, Value) {
    let c = &r["choices"][0];
    let mut m = c["message"].clone();
    let calls = m.get_mut("tool_calls").and_then(Value::as_array_mut);
    for call in calls.into_iter().flatten() {
        assert!(call["id"].is_string(), "{call}");
        call.as_object_mut().unwrap().remove("id");
    }
    (m, c["finish_reason"].clone())
}

/// Asks `body` whole and streamed; asserts both give the same answer; returns it.
fn same_both_ways(a: SocketAddr, body: Value) -> (Value, Value) {
    let mut b = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                       "temperature": 0, "max_tokens": 120,
                       "tools": [{"type": "function", "function": {"name": "lookup",
                                  "parameters": {"type": "object"}}}]});
    b.as_object_mut()
        .unwrap()
        .extend(body.as_object().unwrap().clone());
    let unstreamed = whole(&post(a, "/v1/chat/completions", &b).json());
    b["stream"] = json!(true);
    let streamed = reassemble(&post(a, "/v1/chat/completions", &b).events());
    assert_eq!(streamed, unstreamed, "streamed vs whole for {body}");
    unstreamed
}

#[test]
fn streamed_tool_calls_equal_the_unstreamed_answer() {
    let s = start(ServeConfig::default(), small_engine());
    let forced = |text: &str| {
        let (m, finish) = same_both_ways(s.addr, json!({"guided_choice": [text]}));
        (m, finish.as_str().unwrap().to_string())
    };
    // A call with text before it: content is the text, arguments minified.
    let (m, finish) = forced(
        "Let me check.\n<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"term\": \"a b\"}}\n</tool_call>",
    );
    assert_eq!(finish, "tool_calls");
    assert_eq!(m["content"], "Let me check.");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(
        m["tool_calls"][0]["function"]["arguments"],
        r#"{"term":"a b"}"#
    );
    // Only calls: content null; the first of two names counts; missing arguments are {}.
    let (m, _) = forced("<tool_call>{\"name\": \"lookup\", \"name\": \"g\"}</tool_call>");
    assert_eq!(m["content"], Value::Null);
    assert_eq!(m["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{}");
    // No call: junk after the JSON, a closing tag in a string, plain text.
    for text in [
        "<tool_call>{\"name\": \"lookup\", \"arguments\": {}} junk</tool_call>",
        "<tool_call>{\"name\": \"lookup\", \"arguments\": {\"s\": \"x</tool_call>y\"}}</tool_call>",
        "Sunny.",
    ] {
        let (m, finish) = forced(text);
        assert_eq!(m["content"], text);
        assert!(m.get("tool_calls").is_none(), "{m}");
        assert_eq!(finish, "stop");
    }
    // A required call cut by max_tokens: the same begun call either way, its
    // arguments as far as they were generated.
    let (m, finish) = same_both_ways(s.addr, json!({"tool_choice": "required", "max_tokens": 12}));
    assert_eq!(finish, "length");
    assert_eq!(m["content"], Value::Null);
    assert_eq!(m["tool_calls"][0]["function"]["name"], "lookup", "{m}");
    let args = m["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert!(serde_json::from_str::<Value>(args).is_err(), "cut: {args}");
}
