//! OpenAI's request fields (issue 44): every field of the completions and chat
//! completions request schemas is implemented, accepted and ignored, or refused with
//! a 400 naming it (the table is in `folio_server`'s `params` module); `logit_bias`
//! bans and forces tokens, under grammars too; `system_fingerprint` is in every
//! answer and chunk; the llama.cpp route aliases answer as the `/v1` routes do.

use crate::client::{get, post, request};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::{json, Value};

/// What the server must do with a field of the given value.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// 200 (implemented, or accepted and ignored).
    Accepted,
    /// 400 with `param` naming the field.
    Refused,
}
use Want::{Accepted, Refused};

/// Every top-level field of OpenAI's chat completions request schema, each with the
/// values tried and what folio must answer. `messages` and `model` are in the base
/// request.
fn chat_fields() -> Vec<(&'static str, Value, Want)> {
    vec![
        ("model", json!("anything"), Accepted),
        ("max_tokens", json!(2), Accepted),
        ("max_completion_tokens", json!(2), Accepted),
        ("n", json!(2), Accepted),
        ("stop", json!(["\n\n"]), Accepted),
        ("seed", json!(5), Accepted),
        ("temperature", json!(0.5), Accepted),
        ("top_p", json!(0.9), Accepted),
        ("presence_penalty", json!(0.5), Accepted),
        ("frequency_penalty", json!(0.5), Accepted),
        ("logit_bias", json!({"11": 5, "12": -100}), Accepted),
        ("logit_bias", json!({"eleven": 5}), Refused),
        ("logprobs", json!(true), Accepted),
        ("stream", json!(false), Accepted),
        (
            "stream_options",
            json!({"include_usage": true, "include_obfuscation": false}),
            Accepted,
        ),
        ("response_format", json!({"type": "text"}), Accepted),
        ("tools", json!([]), Accepted),
        ("tool_choice", json!("none"), Accepted),
        ("parallel_tool_calls", json!(true), Accepted),
        ("user", json!("user-1234"), Accepted),
        ("safety_identifier", json!("hashed-id"), Accepted),
        ("prompt_cache_key", json!("key"), Accepted),
        ("metadata", json!({"project": "x"}), Accepted),
        (
            "prediction",
            json!({"type": "content", "content": "Blue"}),
            Accepted,
        ),
        ("service_tier", json!("auto"), Accepted),
        ("service_tier", json!("default"), Accepted),
        ("service_tier", json!("flex"), Refused),
        ("service_tier", json!("priority"), Refused),
        ("store", json!(false), Accepted),
        ("store", json!(true), Refused),
        ("modalities", json!(["text"]), Accepted),
        ("modalities", json!(["text", "audio"]), Refused),
        ("verbosity", json!("medium"), Accepted),
        ("verbosity", json!("low"), Refused),
        ("reasoning_effort", json!("low"), Refused),
        ("audio", json!({"voice": "alloy", "format": "wav"}), Refused),
        ("web_search_options", json!({}), Refused),
        (
            "functions",
            json!([{"name": "f", "parameters": {"type": "object"}}]),
            Refused,
        ),
        ("function_call", json!("auto"), Refused),
    ]
}

/// Every top-level field of OpenAI's (legacy) completions request schema; `prompt`
/// and `model` are in the base request.
fn completion_fields() -> Vec<(&'static str, Value, Want)> {
    vec![
        ("model", json!("anything"), Accepted),
        ("max_tokens", json!(2), Accepted),
        ("n", json!(2), Accepted),
        ("best_of", json!(1), Accepted),
        ("best_of", json!(3), Refused),
        ("echo", json!(true), Accepted),
        ("frequency_penalty", json!(0.5), Accepted),
        ("presence_penalty", json!(0.5), Accepted),
        ("logit_bias", json!({"11": 5}), Accepted),
        ("logit_bias", json!({"11": 101}), Refused),
        ("logprobs", json!(2), Accepted),
        ("seed", json!(5), Accepted),
        ("stop", json!("\n"), Accepted),
        ("stream", json!(false), Accepted),
        ("stream_options", json!({"include_usage": true}), Accepted),
        ("suffix", json!(""), Accepted),
        ("suffix", json!(" and so on."), Refused),
        ("temperature", json!(0.5), Accepted),
        ("top_p", json!(0.9), Accepted),
        ("user", json!("user-1234"), Accepted),
    ]
}

/// The schemas' fields as OpenAI's API reference lists them (request bodies of
/// `POST /v1/chat/completions` and `POST /v1/completions`): the tables above must
/// try each one.
const CHAT_SCHEMA: &[&str] = &[
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];
const COMPLETIONS_SCHEMA: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

/// Sends `base` with `field` set to `value` and checks the answer against `want`.
fn try_field(addr: std::net::SocketAddr, path: &str, base: &Value, f: &str, v: &Value, want: Want) {
    let mut body = base.clone();
    body[f] = v.clone();
    let r = post(addr, path, &body);
    match want {
        Accepted => assert_eq!(r.status, 200, "{path} {f}={v}: {}", r.text()),
        Refused => {
            let e = r.error(400);
            assert_eq!(e["param"], json!(f), "{path} {f}={v}: {e}");
        }
    }
}

#[test]
fn every_openai_request_field_is_implemented_accepted_or_refused_by_name() {
    let s = start(ServeConfig::default(), small_engine());
    let chat = json!({"model": "folio", "messages": [{"role": "user", "content": "Name a colour."}],
                      "max_tokens": 2, "temperature": 0});
    let mut tried: Vec<&str> = vec!["messages", "top_logprobs"];
    for (f, v, want) in chat_fields() {
        try_field(s.addr, "/v1/chat/completions", &chat, f, &v, want);
        tried.push(f);
    }
    // top_logprobs goes with logprobs.
    let mut lp = chat.clone();
    lp["logprobs"] = json!(true);
    try_field(
        s.addr,
        "/v1/chat/completions",
        &lp,
        "top_logprobs",
        &json!(2),
        Accepted,
    );
    for f in CHAT_SCHEMA {
        assert!(tried.contains(f), "chat field {f} is not tried");
    }

    let comp = json!({"model": "folio", "prompt": "The sky is", "max_tokens": 2, "temperature": 0});
    let mut tried: Vec<&str> = vec!["prompt"];
    for (f, v, want) in completion_fields() {
        try_field(s.addr, "/v1/completions", &comp, f, &v, want);
        tried.push(f);
    }
    for f in COMPLETIONS_SCHEMA {
        assert!(tried.contains(f), "completions field {f} is not tried");
    }
    // best_of equal to n is taken.
    let mut both = comp.clone();
    both["n"] = json!(2);
    try_field(
        s.addr,
        "/v1/completions",
        &both,
        "best_of",
        &json!(2),
        Accepted,
    );
    // An explicit null is the field left out.
    try_field(
        s.addr,
        "/v1/chat/completions",
        &chat,
        "audio",
        &Value::Null,
        Accepted,
    );
    // A field no OpenAI schema (nor folio) knows is still ignored.
    try_field(
        s.addr,
        "/v1/completions",
        &comp,
        "no_such_field",
        &json!(1),
        Accepted,
    );
}

/// The text of `body`'s completion (its first choice).
fn text_of(addr: std::net::SocketAddr, body: &Value) -> String {
    let r = post(addr, "/v1/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

fn token_id(addr: std::net::SocketAddr, text: &str) -> u32 {
    let r = post(
        addr,
        "/tokenize",
        &json!({"content": text, "add_special": false}),
    );
    let t = r.json()["tokens"].clone();
    assert_eq!(t.as_array().map(Vec::len), Some(1), "{text:?}: {t}");
    t[0].as_u64().unwrap() as u32
}

#[test]
fn logit_bias_bans_and_forces_tokens_greedy_sampled_and_under_a_grammar() {
    let s = start(ServeConfig::default(), small_engine());
    let base = json!({"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0});
    let first = text_of(s.addr, &base);
    let id = token_id(s.addr, &first);
    // -100 bans the greedy choice.
    let mut ban = base.clone();
    ban["logit_bias"] = json!({ id.to_string(): -100 });
    let other = text_of(s.addr, &ban);
    assert_ne!(other, first);
    // +100 forces a token, greedy and sampled (seeded: the same text twice).
    let forced = token_id(s.addr, " banana");
    for (temperature, seed) in [(0.0, 1), (1.0, 7)] {
        let body = json!({"prompt": "The capital of France is", "max_tokens": 3,
                          "temperature": temperature, "seed": seed,
                          "logit_bias": { forced.to_string(): 100 }});
        let a = text_of(s.addr, &body);
        assert_eq!(a, " banana banana banana", "temperature {temperature}");
        assert_eq!(text_of(s.addr, &body), a);
    }
    // Chat takes it too.
    let chat = json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2,
                      "temperature": 0, "logit_bias": { forced.to_string(): 100 }});
    let r = post(s.addr, "/v1/chat/completions", &chat).json();
    let content = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(content.trim(), "banana banana", "{r}");
    // Under a grammar a forced token the grammar forbids never comes out.
    for temperature in [0.0, 1.0] {
        let body = json!({"prompt": "Is the sky blue? Answer:", "max_tokens": 8,
                          "temperature": temperature, "seed": 3,
                          "guided_choice": ["yes", "no"],
                          "logit_bias": { forced.to_string(): 100 }});
        let t = text_of(s.addr, &body);
        assert!(t == "yes" || t == "no", "{t:?}");
    }
}

#[test]
fn logit_bias_faults_are_400s_naming_it() {
    let s = start(ServeConfig::default(), small_engine());
    let vocab = 49152; // SmolLM2's
    let too_many: serde_json::Map<String, Value> =
        (0..=1024).map(|i| (i.to_string(), json!(1))).collect();
    for (path, bias) in [
        ("/v1/completions", json!({"x": 1})),
        ("/v1/completions", json!({"-3": 1})),
        ("/v1/completions", json!({ vocab.to_string(): 1 })),
        ("/v1/completions", json!({"5": 100.5})),
        ("/v1/completions", json!({"5": -1000})),
        ("/v1/completions", json!({"5": "1"})),
        ("/v1/completions", Value::Object(too_many)),
        ("/v1/completions", json!("5:1")),
        ("/v1/chat/completions", json!({"5": 101})),
        ("/v1/chat/completions", json!({"1.0": 1})),
    ] {
        let body = if path == "/v1/completions" {
            json!({"prompt": "Hi", "max_tokens": 1, "logit_bias": bias})
        } else {
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                   "logit_bias": bias})
        };
        let e = post(s.addr, path, &body).error(400);
        assert_eq!(e["param"], "logit_bias", "{bias}: {e}");
    }
    // The largest id and the bounds are fine.
    let body = json!({"prompt": "Hi", "max_tokens": 1,
                      "logit_bias": { (vocab - 1).to_string(): -100, "0": 100 }});
    assert_eq!(post(s.addr, "/v1/completions", &body).status, 200);
}

#[test]
fn system_fingerprint_is_in_every_answer_and_every_chunk() {
    let s = start(ServeConfig::default(), small_engine());
    let fp_ok = |v: &Value| {
        let f = v["system_fingerprint"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            f.len() == 15 && f.starts_with("fp_") && f[3..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{v}"
        );
        f
    };
    let comp = json!({"prompt": "The sky is", "max_tokens": 3, "temperature": 0});
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                      "temperature": 0});
    let fp = fp_ok(&post(s.addr, "/v1/completions", &comp).json());
    assert_eq!(
        fp_ok(&post(s.addr, "/v1/chat/completions", &chat).json()),
        fp
    );
    for (path, body) in [("/v1/completions", comp), ("/v1/chat/completions", chat)] {
        let mut b = body.clone();
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
        let events = post(s.addr, path, &b).events();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        assert!(events.len() > 2);
        for e in &events[..events.len() - 1] {
            let v: Value = serde_json::from_str(e).unwrap();
            assert_eq!(fp_ok(&v), fp, "{path}");
        }
    }
}

#[test]
fn route_aliases_answer_as_the_v1_routes() {
    let s = start(ServeConfig::default(), small_engine());
    assert_eq!(
        get(s.addr, "/models").json(),
        get(s.addr, "/v1/models").json()
    );
    let comp = json!({"prompt": "The sky is", "max_tokens": 4, "temperature": 0});
    let a = post(s.addr, "/completions", &comp).json();
    let b = post(s.addr, "/v1/completions", &comp).json();
    assert_eq!(a["object"], "text_completion");
    assert_eq!(a["choices"], b["choices"]);
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                      "temperature": 0});
    let a = post(s.addr, "/chat/completions", &chat).json();
    let b = post(s.addr, "/v1/chat/completions", &chat).json();
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["choices"], b["choices"]);
    // The same checks: a refused field is refused there too.
    let mut bad = chat.clone();
    bad["store"] = json!(true);
    let e = post(s.addr, "/chat/completions", &bad).error(400);
    assert_eq!(e["param"], "store");
    drop(s);

    // The aliases are behind the API key as the /v1 routes are.
    let s = start(
        ServeConfig {
            api_key: Some("sekrit".into()),
            ..ServeConfig::default()
        },
        small_engine(),
    );
    for (method, path) in [
        ("GET", "/models"),
        ("POST", "/completions"),
        ("POST", "/chat/completions"),
    ] {
        let body = match path {
            "/completions" => comp.to_string(),
            "/chat/completions" => chat.to_string(),
            _ => String::new(),
        };
        let r = request(s.addr, method, path, &[], body.as_bytes());
        assert_eq!(r.error(401)["code"], "invalid_api_key", "{path}");
        let r = request(
            s.addr,
            method,
            path,
            &[("Authorization", "Bearer sekrit")],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
}
