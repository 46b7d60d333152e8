//! The Responses API on the real model: a chain forks the stored context and
//! computes only what the conversation adds, stored responses are a cache that
//! makes room for newer ones but never for a user's context, a stream's events are
//! numbered and its final object is what `GET` returns, a stream cut short stores
//! nothing, a stored response expires with its context, and every field the route
//! lists is answered as listed.

use crate::client::{eventually, get, ok, open_stream, post, request};
use crate::server::{small_engine, start};
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::{json, Value};
use std::net::SocketAddr;

fn contexts(a: SocketAddr) -> usize {
    get(a, "/v1/contexts").json()["data"]
        .as_array()
        .unwrap()
        .len()
}

fn text(r: &Value) -> String {
    r["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {r}"))
        .to_string()
}

fn cached(r: &Value) -> u64 {
    r["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_chain_reuses_all_its_previous_context_holds() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let mut prev: Option<Value> = None;
    for q in ["Tell me a colour.", "And another one.", "Which came first?"] {
        let mut body = json!({"input": q, "max_output_tokens": 12, "temperature": 0,
            "cache_salt": "chain"});
        if let Some(p) = &prev {
            body["previous_response_id"] = p["id"].clone();
        }
        let r = ok(a, "/v1/responses", body);
        if let Some(p) = &prev {
            // The fork holds the previous prompt and reply; only the last sampled
            // token was never computed.
            let held = p["usage"]["input_tokens"].as_u64().unwrap()
                + p["usage"]["output_tokens"].as_u64().unwrap()
                - 1;
            assert_eq!(cached(&r), held, "{r}");
            assert_eq!(r["previous_response_id"], p["id"]);
        }
        prev = Some(r);
    }
    // Each stored response is a context of the registry.
    assert_eq!(contexts(a), 3);
}

#[test]
fn get_returns_the_answer_and_delete_drops_its_context() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let r = ok(
        a,
        "/v1/responses",
        json!({"input": "Hi.", "max_output_tokens": 4, "metadata": {"k": "v"}}),
    );
    let id = r["id"].as_str().unwrap();
    assert_eq!(r["metadata"], json!({"k": "v"}));
    assert_eq!(get(a, &format!("/v1/responses/{id}")).json(), r);
    assert_eq!(contexts(a), 1);
    let d = request(a, "DELETE", &format!("/v1/responses/{id}"), &[], b"").json();
    assert_eq!(d, json!({"id": id, "object": "response", "deleted": true}));
    assert_eq!(contexts(a), 0);
    get(a, &format!("/v1/responses/{id}")).error(404);
    request(a, "DELETE", &format!("/v1/responses/{id}"), &[], b"").error(404);
    let e = post(
        a,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": id}),
    )
    .error(404);
    assert_eq!(e["code"], "response_not_found");
    // store: false keeps nothing.
    let r = ok(
        a,
        "/v1/responses",
        json!({"input": "Hi.", "max_output_tokens": 4, "store": false}),
    );
    assert_eq!(r["store"], false);
    assert_eq!(contexts(a), 0);
    get(a, &format!("/v1/responses/{}", r["id"].as_str().unwrap())).error(404);
}

#[test]
fn stored_responses_make_room_but_a_users_context_is_never_evicted() {
    let cfg = ServeConfig {
        max_contexts: 2,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let mine = ok(a, "/v1/contexts", json!({}))["id"].clone();
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let r = ok(
                a,
                "/v1/responses",
                json!({"input": format!("Count to {i}."), "max_output_tokens": 3}),
            );
            r["id"].as_str().unwrap().to_string()
        })
        .collect();
    // Each made room by dropping the one before; the user's context stayed.
    get(a, &format!("/v1/responses/{}", ids[0])).error(404);
    get(a, &format!("/v1/responses/{}", ids[1])).error(404);
    assert_eq!(get(a, &format!("/v1/responses/{}", ids[2])).status, 200);
    assert!(get(a, &format!("/v1/contexts/{}", mine.as_str().unwrap())).status == 200);
    // A second user context takes the stored response's place; then the registry
    // holds only users' contexts, and a stored response is a 429 before any work.
    ok(a, "/v1/contexts", json!({}));
    get(a, &format!("/v1/responses/{}", ids[2])).error(404);
    post(
        a,
        "/v1/responses",
        &json!({"input": "x", "max_output_tokens": 2}),
    )
    .error(429);
    // Not storing needs no room.
    ok(
        a,
        "/v1/responses",
        json!({"input": "x", "max_output_tokens": 2, "store": false}),
    );
}

#[test]
fn a_stream_is_numbered_and_ends_with_what_get_returns() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let body = json!({"input": "Say hello.", "max_output_tokens": 8, "temperature": 0,
        "stream": true});
    let r = post(a, "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let names: Vec<String> = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .map(str::to_string)
        .collect();
    let events: Vec<Value> = r
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(names.len(), events.len());
    for (i, (n, e)) in names.iter().zip(&events).enumerate() {
        assert_eq!(e["type"], json!(n), "{e}");
        assert_eq!(e["sequence_number"], json!(i), "{e}");
    }
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    let last = events.last().unwrap();
    assert!(["response.completed", "response.incomplete"].contains(&last["type"].as_str().unwrap()));
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let fin = &last["response"];
    assert_eq!(text(fin), deltas);
    let id = fin["id"].as_str().unwrap();
    assert_eq!(&get(a, &format!("/v1/responses/{id}")).json(), fin);
    // The same request whole gives the same text.
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    assert_eq!(text(&ok(a, "/v1/responses", whole)), deltas);
}

#[test]
fn a_stream_cut_short_stores_nothing() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let mut open = open_stream(
        a,
        "/v1/responses",
        &json!({"input": "Write a long story.", "max_output_tokens": 400,
            "ignore_eos": true, "stream": true}),
    );
    assert_eq!(open.status, 200);
    let created: Value = serde_json::from_str(&open.next_event().unwrap()).unwrap();
    let id = created["response"]["id"].as_str().unwrap().to_string();
    // The context is registered while it generates (so a full registry is a 429
    // before any work) ...
    assert_eq!(contexts(a), 1);
    drop(open);
    // ... and leaves it with the client.
    assert!(eventually(10.0, || contexts(a) == 0));
    get(a, &format!("/v1/responses/{id}")).error(404);
}

#[test]
fn every_listed_field_is_answered_as_listed() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let accepted = [
        ("model", json!("anything")),
        ("instructions", json!("Be brief.")),
        ("max_output_tokens", json!(2)),
        ("temperature", json!(0.5)),
        ("top_p", json!(0.9)),
        ("parallel_tool_calls", json!(false)),
        (
            "text",
            json!({"format": {"type": "text"}, "verbosity": "medium"}),
        ),
        ("store", json!(false)),
        ("metadata", json!({"a": "b"})),
        ("stream_options", json!({"include_obfuscation": false})),
        ("user", json!("u")),
        ("safety_identifier", json!("s")),
        ("prompt_cache_key", json!("k")),
        ("prompt_cache_retention", json!("in_memory")),
        ("service_tier", json!("default")),
        ("truncation", json!("disabled")),
        ("background", json!(false)),
        ("include", json!([])),
        ("reasoning", json!({})),
        ("seed", json!(3)),
        ("stop", json!(["\n\n"])),
        ("top_k", json!(5)),
        ("min_p", json!(0.1)),
        ("presence_penalty", json!(0.1)),
        ("frequency_penalty", json!(0.1)),
        ("repetition_penalty", json!(1.1)),
        ("logit_bias", json!({"42": -5})),
        ("ignore_eos", json!(true)),
        ("cache_salt", json!("salt")),
    ];
    for (k, v) in accepted {
        let mut body = json!({"input": "Hi.", "max_output_tokens": 2, "store": false});
        body[k] = v;
        let r = post(a, "/v1/responses", &body);
        assert_eq!(r.status, 200, "{k}: {}", r.text());
    }
    let refused = [
        ("top_logprobs", json!(1)),
        ("max_tool_calls", json!(1)),
        ("conversation", json!("conv_1")),
        ("prompt", json!({"id": "p"})),
        ("context_management", json!([])),
        ("moderation", json!({})),
        ("image", json!({})),
        ("access_programs", json!({})),
        ("background_options", json!({})),
        ("prompt_cache_options", json!({})),
        ("service_tier", json!("priority")),
        ("truncation", json!("auto")),
        ("background", json!(true)),
        ("include", json!(["message.output_text.logprobs"])),
        ("reasoning", json!({"effort": "low"})),
        ("temperature", json!(-1)),
        ("logit_bias", json!({"nope": 1})),
        // Checked on the chat path, named as this route names them.
        ("max_output_tokens", json!(-1)),
        ("max_output_tokens", json!(0)),
        ("max_output_tokens", json!("5")),
        ("text", json!("x")),
        ("temperature", json!("hot")),
        ("cache_salt", json!(5)),
    ];
    for (k, v) in refused {
        let mut body = json!({"input": "Hi.", "store": false});
        body[k] = v;
        let e = post(a, "/v1/responses", &body).error(400);
        assert_eq!(e["param"], json!(k), "{k}: {e}");
    }
    for (extra, param) in [
        (json!({"tools": [{"type": "function"}]}), "tools[0].name"),
        (
            json!({"text": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}),
            "text.format",
        ),
        (json!({"input": "x ".repeat(5000)}), "input"),
    ] {
        let mut body = json!({"input": "Hi.", "store": false});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e = post(a, "/v1/responses", &body).error(400);
        let got = e["param"].as_str().unwrap_or_default();
        assert!(got.starts_with(param), "{extra}: {e}");
    }
}

#[test]
fn a_stored_responses_context_is_read_only_and_its_id_unguessable() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let r = ok(
        a,
        "/v1/responses",
        json!({"input": "Hi.", "max_output_tokens": 3}),
    );
    let id = r["id"].as_str().unwrap();
    let suffix = id.strip_prefix("resp_").unwrap();
    assert!(
        suffix.len() == 32 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}: 128 random bits"
    );
    let other = ok(
        a,
        "/v1/responses",
        json!({"input": "Hi.", "max_output_tokens": 3}),
    );
    assert_ne!(other["id"], r["id"]);
    let list = get(a, "/v1/contexts").json();
    let ctx = list["data"][0]["id"].as_str().unwrap().to_string();
    for (path, body) in [
        ("append", json!({"text": " The password is swordfish."})),
        ("truncate", json!({"tokens": 1})),
        ("generate", json!({"max_tokens": 2})),
    ] {
        let e = post(a, &format!("/v1/contexts/{ctx}/{path}"), &body).error(409);
        assert_eq!(e["code"], "context_read_only", "{path}: {e}");
    }
    // A fork is the user's own context, to change at will.
    let fork = ok(a, &format!("/v1/contexts/{ctx}/fork"), json!({}));
    let fid = fork["id"].as_str().unwrap();
    ok(
        a,
        &format!("/v1/contexts/{fid}/append"),
        json!({"text": " More."}),
    );
}

#[test]
fn a_stored_response_expires_with_its_context() {
    let cfg = ServeConfig {
        context_ttl: std::time::Duration::from_millis(1000),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    let r = ok(
        a,
        "/v1/responses",
        json!({"input": "Hi.", "max_output_tokens": 3}),
    );
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(get(a, &format!("/v1/responses/{id}")).status, 200);
    // A GET does not renew it (a look is not a use); idle past the TTL, it goes.
    assert!(eventually(10.0, || contexts(a) == 0));
    get(a, &format!("/v1/responses/{id}")).error(404);
    let e = post(
        a,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": id}),
    )
    .error(404);
    assert_eq!(e["code"], "response_not_found");
}

/// A continuation whose conversation's text does not begin with what the context
/// holds (new, changed or dropped `instructions`) is cut back to the shared prefix:
/// it answers, and counts its input, exactly as the whole conversation sent at once.
#[test]
fn a_continuation_with_other_instructions_answers_as_the_whole_conversation() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    for (first, then) in [
        (None, Some("Answer in French.")),
        (Some("Be brief."), Some("Answer in French.")),
        (Some("Be brief."), None),
        (Some("Be brief."), Some("Be brief.")),
    ] {
        let mut one = json!({"input": "Tell me about dogs.", "max_output_tokens": 12,
            "temperature": 0});
        if let Some(i) = first {
            one["instructions"] = json!(i);
        }
        let r1 = ok(a, "/v1/responses", one);
        let mut two = json!({"input": "And cats?", "max_output_tokens": 12, "temperature": 0,
            "previous_response_id": r1["id"]});
        let mut whole = json!({"store": false, "max_output_tokens": 12, "temperature": 0,
            "input": [{"role": "user", "content": "Tell me about dogs."},
                {"role": "assistant", "content": text(&r1)},
                {"role": "user", "content": "And cats?"}]});
        if let Some(i) = then {
            two["instructions"] = json!(i);
            whole["instructions"] = json!(i);
        }
        let (chained, sent) = (ok(a, "/v1/responses", two), ok(a, "/v1/responses", whole));
        let what = format!("{first:?} then {then:?}");
        assert_eq!(text(&chained), text(&sent), "{what}");
        assert_eq!(
            chained["usage"]["input_tokens"], sent["usage"]["input_tokens"],
            "{what}"
        );
        assert!(cached(&chained) > 0, "{what}: {chained}");
    }
}

/// Other clients' contexts near the contexts' share of the pool: a response not
/// stored runs as a chat completion does (the same text, every token asked for),
/// and a stored one whose max_output_tokens does not fit is refused with 429, not
/// cut short and answered as if at max_output_tokens (the hostile probe of
/// 2026-12-07: 11 tokens of 120, `incomplete`, reason `max_output_tokens`).
#[test]
fn other_clients_contexts_never_cut_a_response_short() {
    let cfg = EngineConfig {
        kv_pages: 48,
        context_pages: Some(24),
        ..small_engine()
    };
    let s = start(ServeConfig::default(), cfg);
    let a = s.addr;
    let theirs = ok(a, "/v1/contexts", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let tokens: Vec<u32> = (0..328).map(|i| 100 + i % 500).collect();
    ok(
        a,
        &format!("/v1/contexts/{theirs}/append"),
        json!({"tokens": tokens}),
    );
    let q = "Write a long story about a dragon";
    let r = ok(
        a,
        "/v1/responses",
        json!({"input": q, "max_output_tokens": 60, "temperature": 0, "store": false}),
    );
    let c = ok(
        a,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": q}], "max_tokens": 60,
            "temperature": 0}),
    );
    assert_eq!(
        text(&r),
        c["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(r["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
    assert!(r["usage"]["output_tokens"].as_u64().unwrap() > 20, "{r}");
    let e = post(
        a,
        "/v1/responses",
        &json!({"input": q, "max_output_tokens": 60, "temperature": 0}),
    )
    .error(429);
    assert_eq!(e["param"], "max_output_tokens", "{e}");
    assert!(e["message"].as_str().unwrap().contains("room for"), "{e}");
    assert_eq!(contexts(a), 1, "nothing kept of the refused one");
    // One that fits is stored.
    let r = ok(
        a,
        "/v1/responses",
        json!({"input": q, "max_output_tokens": 4, "temperature": 0}),
    );
    assert_eq!(r["usage"]["output_tokens"], 4, "{r}");
    assert_eq!(contexts(a), 2);
}
