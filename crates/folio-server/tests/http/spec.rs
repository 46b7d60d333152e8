//! Speculative decoding over HTTP (issue 40): drafted and accepted tokens in the usage
//! (folio's `speculative`; OpenAI's `completion_tokens_details` only for a request's
//! `prediction`), `"speculative": false` per request, `--spec off` for the server; the
//! same text every way; the counters in `/metrics` under folio's and vLLM's names.

use crate::client::{metric, post};
use crate::server::{small_engine, start};
use folio::SpecMode;
use folio_server::ServeConfig;
use serde_json::{json, Value};

const PROMPT: &str = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, \
Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,";

fn complete(addr: std::net::SocketAddr, extra: Value) -> Value {
    let mut b = json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    let r = post(addr, "/v1/completions", &b);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn drafts_are_reported_and_change_nothing_else() {
    let s = start(ServeConfig::default(), small_engine());
    let on = complete(s.addr, json!({}));
    let d = &on["usage"]["speculative"];
    let accepted = d["accepted_tokens"].as_u64().unwrap();
    let drafted = d["drafted_tokens"].as_u64().unwrap();
    assert!(
        on["usage"].get("completion_tokens_details").is_none(),
        "no prediction, no predicted-output figures: {}",
        on["usage"]
    );
    assert!(
        accepted > 0,
        "repeating text accepts drafts: {}",
        on["usage"]
    );
    let off = complete(s.addr, json!({"speculative": false}));
    assert_eq!(on["choices"][0]["text"], off["choices"][0]["text"]);
    assert_eq!(
        on["usage"]["completion_tokens"],
        off["usage"]["completion_tokens"]
    );
    assert!(
        off["usage"].get("speculative").is_none(),
        "nothing drafted, no figures: {}",
        off["usage"]
    );
    // Streamed, with usage at the end: the same figures' shape.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    let last: Value = r
        .events()
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .rfind(|v| !v["usage"].is_null())
        .unwrap();
    let streamed = &last["usage"]["speculative"];
    assert!(streamed["accepted_tokens"].as_u64().unwrap() > 0);
    // The counters add up the two drafted requests' figures.
    let want_drafted = drafted + streamed["drafted_tokens"].as_u64().unwrap();
    let want_acc = accepted + streamed["accepted_tokens"].as_u64().unwrap();
    for prefix in ["folio", "vllm"] {
        let m = |name: &str| metric(s.addr, &format!("{prefix}:{name}"), "") as u64;
        assert_eq!(m("spec_decode_num_draft_tokens_total"), want_drafted);
        assert_eq!(m("spec_decode_num_accepted_tokens_total"), want_acc);
    }
    assert!(metric(s.addr, "folio:spec_decode_acceptance_rate", "") > 0.0);
    assert!(metric(s.addr, "folio:spec_decode_tokens_per_draft_step", "") > 1.0);
    // A server started with speculation off drafts nothing, and says the same.
    let mut cfg = small_engine();
    cfg.speculative = SpecMode::Off;
    let plain = start(ServeConfig::default(), cfg);
    let p = complete(plain.addr, json!({}));
    assert_eq!(p["choices"][0]["text"], on["choices"][0]["text"]);
    assert!(p["usage"].get("speculative").is_none());
    assert_eq!(
        metric(plain.addr, "folio:spec_decode_num_draft_tokens_total", ""),
        0.0
    );
}

#[test]
fn a_speculative_field_of_the_wrong_type_is_a_400() {
    let s = start(ServeConfig::default(), small_engine());
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "speculative": "yes"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

/// OpenAI's predicted outputs: drafts follow the prediction, so a right one is almost
/// wholly accepted; right, wrong or absent, the answer is the same.
#[test]
fn a_prediction_is_drafted_from_and_changes_nothing_else() {
    let s = start(ServeConfig::default(), small_engine());
    let chat = |prediction: Option<Value>| {
        let mut b = json!({"messages": [{"role": "user", "content": "Write a haiku about the sea."}],
                           "max_tokens": 48, "temperature": 0, "speculative": prediction.is_some()});
        if let Some(p) = prediction {
            b["prediction"] = p;
        }
        let r = post(s.addr, "/v1/chat/completions", &b);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let plain = chat(None);
    let text = plain["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let right = chat(Some(json!({"type": "content", "content": text})));
    assert_eq!(right["choices"][0]["message"]["content"], json!(text));
    let d = &right["usage"]["completion_tokens_details"];
    let completion = right["usage"]["completion_tokens"].as_u64().unwrap();
    let accepted = d["accepted_prediction_tokens"].as_u64().unwrap();
    assert!(
        accepted * 10 >= (completion - 1) * 8,
        "a right prediction: {accepted} of {completion} tokens accepted"
    );
    let parts = json!({"type": "content", "content": [{"type": "text", "text": "The sea is wide and "},
                                                      {"type": "text", "text": "grey tonight."}]});
    let wrong = chat(Some(parts));
    assert_eq!(wrong["choices"][0]["message"]["content"], json!(text));
    for bad in [
        json!({"type": "text", "content": "x"}),
        json!({"type": "content"}),
        json!({"type": "content", "content": [{"type": "image", "url": "x"}]}),
        json!({"type": "content", "content": 5}),
    ] {
        let b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prediction": bad});
        let r = post(s.addr, "/v1/chat/completions", &b);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.error(400)["param"], "prediction");
    }
}
