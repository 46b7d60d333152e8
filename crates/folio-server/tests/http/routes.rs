//! The routes' answers: shapes, streaming vs not, several prompts, echo and
//! log-probabilities, cached tokens and salts, tokenize, models, metrics.

use crate::client::{get, post};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::{json, Value};

fn stream_text(events: &[String], field: &str) -> (String, Vec<Value>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut text = String::new();
    for c in &chunks {
        for ch in c["choices"].as_array().unwrap() {
            let t = if field == "delta" {
                ch["delta"]["content"].as_str()
            } else {
                ch["text"].as_str()
            };
            text.push_str(t.unwrap_or(""));
        }
    }
    (text, chunks)
}

#[test]
fn streamed_and_whole_answers_agree() {
    let s = start(ServeConfig::default(), small_engine());
    let base = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let whole = post(s.addr, "/v1/completions", &base).json();
    assert_eq!(whole["object"], "text_completion");
    assert!(whole["id"].as_str().unwrap().starts_with("cmpl-"));
    let u = &whole["usage"];
    assert_eq!(
        u["total_tokens"],
        json!(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64());
    let mut sreq = base.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let r = post(s.addr, "/v1/completions", &sreq);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let (text, chunks) = stream_text(&r.events(), "text");
    assert_eq!(json!(text), whole["choices"][0]["text"]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], u["completion_tokens"]);
    let fin: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(fin.len(), 1);

    // Chat, the same way.
    let chat = json!({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 10, "temperature": 0});
    let whole = post(s.addr, "/v1/chat/completions", &chat).json();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let mut sc = chat.clone();
    sc["stream"] = json!(true);
    let r = post(s.addr, "/v1/chat/completions", &sc);
    let (text, chunks) = stream_text(&r.events(), "delta");
    assert_eq!(json!(text), whole["choices"][0]["message"]["content"]);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage without include_usage"
    );
}

#[test]
fn several_prompts_and_n_samples_number_their_choices() {
    let s = start(ServeConfig::default(), small_engine());
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": ["One", "Two"], "n": 2, "max_tokens": 4, "temperature": 0.8, "seed": 7}),
    )
    .json();
    let idx: Vec<u64> = r["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 2, 3]);
    // Token-id prompts, and a list of them.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": [[1, 504], [1, 2]], "max_tokens": 2}),
    )
    .json();
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    // The same seed gives the same samples.
    let a = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Once", "n": 3, "max_tokens": 8, "temperature": 1.0, "seed": 42}),
    )
    .json();
    let b = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Once", "n": 3, "max_tokens": 8, "temperature": 1.0, "seed": 42}),
    )
    .json();
    assert_eq!(a["choices"], b["choices"]);
    // Streamed n = 3 chat: every index finishes once.
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "n": 3, "max_tokens": 6, "stream": true}),
    );
    let (_, chunks) = stream_text(&r.events(), "delta");
    let mut finished: Vec<u64> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .map(|c| c["choices"][0]["index"].as_u64().unwrap())
        .collect();
    finished.sort();
    assert_eq!(finished, [0, 1, 2]);
}

#[test]
fn echo_scores_the_prompt_and_logprobs_have_openais_shapes() {
    let s = start(ServeConfig::default(), small_engine());
    let prompt = "The quick brown fox jumps over the lazy dog";
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "echo": true, "logprobs": 2, "max_tokens": 0}),
    )
    .json();
    let c = &r["choices"][0];
    assert_eq!(c["text"], prompt);
    let lp = &c["logprobs"];
    let toks: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(toks.concat(), prompt);
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for (i, v) in lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .skip(1)
    {
        assert!(v.as_f64().unwrap() <= 0.0);
        assert_eq!(lp["top_logprobs"][i].as_object().unwrap().len(), 2);
    }
    assert_eq!(r["usage"]["completion_tokens"], 0);
    // Streamed echo with generation: the prompt comes first, with its figures.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 3, "stream": true, "temperature": 0}),
    );
    let (text, _) = stream_text(&r.events(), "text");
    assert!(text.starts_with(prompt), "{text}");
    // Offsets point into the text, whatever the tokens: special-token text, a
    // character split over several tokens.
    let tricky = "<|im_start|>user hi 😀 x";
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": tricky, "echo": true, "logprobs": 1, "max_tokens": 4, "temperature": 0}),
    )
    .json();
    let text: Vec<char> = r["choices"][0]["text"].as_str().unwrap().chars().collect();
    let lp = &r["choices"][0]["logprobs"];
    let offs = lp["text_offset"].as_array().unwrap();
    for (piece, off) in lp["tokens"].as_array().unwrap().iter().zip(offs) {
        let (piece, off) = (piece.as_str().unwrap(), off.as_u64().unwrap() as usize);
        assert!(off <= text.len());
        if !piece.contains('\u{fffd}') {
            let at: String = text[off..].iter().collect();
            assert!(at.starts_with(piece), "{piece:?} at {off} of {text:?}");
        }
    }
    // Echo alone, nothing to compute.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "echo": true, "max_tokens": 0}),
    )
    .json();
    assert_eq!(r["choices"][0]["text"], prompt);
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": prompt, "echo": true, "max_tokens": 0, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let (text, chunks) = stream_text(&r.events(), "text");
    assert_eq!(text, prompt);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 0);

    let r = post(s.addr, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": 3, "max_tokens": 5, "temperature": 0})).json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the likeliest.
        assert_eq!(e["logprob"], top[0]["logprob"]);
        assert_eq!(e["token"], top[0]["token"]);
        assert!(e["bytes"].is_array());
    }
}

#[test]
fn a_shared_prefix_is_cached_and_salts_keep_tenants_apart() {
    let s = start(ServeConfig::default(), small_engine());
    let prefix = "The history of the printing press is long. ".repeat(30);
    let ask = |end: &str, salt: Option<&str>| {
        let mut b = json!({"prompt": format!("{prefix}{end}"), "max_tokens": 2, "temperature": 0});
        if let Some(s) = salt {
            b["cache_salt"] = json!(s);
        }
        post(s.addr, "/v1/completions", &b).json()["usage"]["prompt_tokens_details"]
            ["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    ask("First", None);
    assert!(
        ask("Second", None) >= 256,
        "a 300-token shared prefix is mostly cached"
    );
    assert_eq!(
        ask("Third", Some("tenant-a")),
        0,
        "another salt shares nothing"
    );
    assert!(ask("Fourth", Some("tenant-a")) >= 256);
    assert_eq!(ask("Fifth", Some("tenant-b")), 0);
    let hits = crate::client::metric(s.addr, "folio:prefix_cache_hits_total", "model_name");
    assert!(hits >= 512.0, "{hits}");
}

#[test]
fn tokenize_models_and_metrics() {
    let s = start(ServeConfig::default(), small_engine());
    let t = post(
        s.addr,
        "/tokenize",
        &json!({"content": "Hello world", "with_pieces": true}),
    )
    .json();
    let ids = t["tokens"].clone();
    assert_eq!(t["count"], json!(ids.as_array().unwrap().len()));
    assert_eq!(
        t["pieces"].as_array().unwrap().len(),
        ids.as_array().unwrap().len()
    );
    let d = post(s.addr, "/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["content"], "Hello world");
    let t2 = post(
        s.addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .json();
    assert!(t2["count"].as_u64().unwrap() > 3);
    // Without the assistant's turn opened (fewer tokens), and a prefill left open;
    // `content` and `prompt` together are a 400 (the fifth hostile probe: one was
    // dropped unseen, as was `add_generation_prompt`).
    let count = |body: Value| post(s.addr, "/tokenize", &body).json()["count"].clone();
    let hi = json!({"role": "user", "content": "Hi"});
    let bare = count(json!({"messages": [hi], "add_generation_prompt": false}));
    assert!(
        bare.as_u64().unwrap() < t2["count"].as_u64().unwrap(),
        "{bare}"
    );
    let open = json!({"messages": [hi, {"role": "assistant", "content": "Hello"}],
        "continue_final_message": true, "with_pieces": true});
    let open = post(s.addr, "/tokenize", &open).json();
    let last = open["pieces"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last, json!("Hello"), "{open}");
    let both = post(s.addr, "/tokenize", &json!({"content": "a", "prompt": "b"}));
    assert_eq!(both.status, 400, "{}", both.text());
    let m = get(s.addr, "/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["object"], "model");
    // vLLM's /version: the SGLang gateway reads a worker's load only where it answers.
    let v = get(s.addr, "/version");
    assert_eq!(v.status, 200);
    assert_eq!(v.json()["version"], env!("CARGO_PKG_VERSION"));
    post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3, "n": 2}),
    );
    let text = get(s.addr, "/metrics").text();
    for name in [
        "folio:num_requests_running",
        "folio:num_requests_waiting",
        "folio:kv_cache_usage_perc",
        "folio:prefix_cache_queries_total",
        "folio:prefix_cache_hits_total",
        "folio:num_preemptions_total",
        "folio:prompt_tokens_total",
        "folio:generation_tokens_total",
        "folio:request_success_total",
        "folio:time_to_first_token_seconds_bucket",
        "folio:time_per_output_token_seconds_bucket",
        "folio:e2e_request_latency_seconds_count",
        "folio:request_queue_time_seconds_sum",
        "folio:iteration_tokens_total_bucket",
        "folio:kv_pages{",
        "folio:kv_pages_shared",
        "folio:forks_total",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    for state in ["free", "working", "committed", "cached", "pinned"] {
        assert!(text.contains(&format!("state=\"{state}\"")), "{state}");
    }
    assert!(crate::client::metric(s.addr, "folio:forks_total", "model_name") >= 1.0);
    assert_eq!(
        crate::client::metric(s.addr, "folio:generation_tokens_total", "model_name"),
        6.0
    );
}

#[test]
fn cors_answers_only_the_listed_origins() {
    let cfg = ServeConfig {
        cors_origins: vec!["http://app.example".into()],
        api_key: Some("k".into()),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let preflight = |origin: &str| {
        crate::client::request(
            s.addr,
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization,content-type",
                ),
            ],
            b"",
        )
    };
    let ok = preflight("http://app.example");
    assert_eq!(
        ok.header("access-control-allow-origin"),
        Some("http://app.example"),
        "{ok:?}"
    );
    let no = preflight("http://evil.example");
    assert_eq!(no.header("access-control-allow-origin"), None, "{no:?}");
    // Without the setting, no CORS headers at all.
    let plain = start(ServeConfig::default(), small_engine());
    let r = crate::client::request(
        plain.addr,
        "GET",
        "/health",
        &[("Origin", "http://app.example")],
        b"",
    );
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[test]
fn structured_output_and_tool_calls() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Answer."}], "max_tokens": 40, "temperature": 0.8, "seed": 1});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post(a, "/v1/chat/completions", &b)
    };
    // vLLM's fields on both routes.
    let r = chat(json!({"guided_choice": ["alpha", "beta"]})).json();
    assert!(
        ["alpha", "beta"].contains(&r["choices"][0]["message"]["content"].as_str().unwrap()),
        "{r}"
    );
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "Code:", "guided_regex": "[A-Z]{2}[0-9]{2}", "max_tokens": 10}),
    )
    .json();
    let t = r["choices"][0]["text"].as_str().unwrap();
    assert!(
        t.len() == 4
            && t[..2].chars().all(|c| c.is_ascii_uppercase())
            && t[2..].chars().all(|c| c.is_ascii_digit()),
        "{t:?}"
    );
    let r = chat(
        json!({"response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 200}),
    )
    .json();
    assert_eq!(
        r["choices"][0]["finish_reason"], "stop",
        "ended by the grammar: {r}"
    );
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text).unwrap().is_object(),
        "{text}"
    );
    // Bad sources and conflicts are 400 before any work.
    let e = chat(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "frob"}}}})).error(400);
    assert_eq!(e["param"], "response_format");
    let e =
        chat(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})).error(400);
    assert_eq!(e["param"], "guided_regex");
    chat(json!({"response_format": {"type": "yaml"}})).error(400);
    chat(json!({"guided_regex": "(unclosed"})).error(400);

    // Tools: a forced call is always a valid call of the schema.
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"term": {"type": "string", "maxLength": 20}}, "required": ["term"], "additionalProperties": false}}}]);
    let r = chat(json!({"tools": tools, "tool_choice": "required", "max_tokens": 150})).json();
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["term"].is_string(), "{args}");
    let r = chat(
        json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "lookup"}}, "stream": true, "max_tokens": 150}),
    );
    let mut arguments = String::new();
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(a) = v["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
        {
            arguments.push_str(a);
        }
    }
    assert!(
        serde_json::from_str::<Value>(&arguments).unwrap()["term"].is_string(),
        "{arguments}"
    );
    // tool_choice none: plain text.
    let r = chat(json!({"tools": tools, "tool_choice": "none"})).json();
    assert!(r["choices"][0]["message"]["tool_calls"].is_null(), "{r}");
    let e = chat(
        json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    )
    .error(400);
    assert_eq!(e["param"], "tool_choice");
    chat(json!({"tool_choice": "required"})).error(400);
    chat(json!({"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}})).error(400);
}
