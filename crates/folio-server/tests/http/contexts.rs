//! The context API on the real model: fork shares pages (held twice, stored once),
//! truncating into a shared page leaves the other branch intact, snapshots outlive
//! the server process and serve prefix hits, and bad ids and bodies are 404 / 400.

use crate::client::{get, ok, post, request};
use crate::server::{engine, small_engine, start, start_with};
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

fn greedy(a: SocketAddr, id: &str, n: usize) -> String {
    let r = ok(
        a,
        &format!("/v1/contexts/{id}/generate"),
        json!({"max_tokens": n, "temperature": 0, "ignore_eos": true, "chat": false}),
    );
    r["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn fork_shares_pages_and_truncate_leaves_the_other_branch_intact() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let c = ok(a, "/v1/contexts", json!({}));
    let id = c["id"].as_str().unwrap().to_string();
    let text = "The history of the printing press is long and full of surprises. ".repeat(5);
    let info = ok(
        a,
        &format!("/v1/contexts/{id}/append"),
        json!({"text": text}),
    );
    let len = info["seq_len"].as_u64().unwrap();
    assert!(len > 64, "{info}");
    // Generating computes the pending tokens; the continuation stays in the context.
    let before = greedy(a, &id, 6);
    let f = ok(a, &format!("/v1/contexts/{id}/fork"), json!({}));
    let fid = f["id"].as_str().unwrap().to_string();
    assert_eq!(f["parent"], json!(id));
    assert_eq!(
        f["seq_len"],
        get(a, &format!("/v1/contexts/{id}")).json()["seq_len"]
    );
    assert!(f["shared_pages"].as_u64().unwrap() >= 4, "{f}");
    // /v1/kv: the committed pages are held by both contexts and stored once.
    let kv = get(a, "/v1/kv").json();
    let both: Vec<&Value> = kv["pages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            let h = p["holders"].as_array().unwrap();
            h.contains(&json!(id)) && h.contains(&json!(fid))
        })
        .collect();
    assert!(both.len() >= 4, "{kv}");
    assert!(both
        .iter()
        .all(|p| p["state"] == "committed" && p["indexed"] == true));
    let pages_used =
        kv["totals"]["committed"].as_u64().unwrap() + kv["totals"]["working"].as_u64().unwrap();
    let each = get(a, &format!("/v1/contexts/{id}")).json();
    let per_ctx =
        each["committed_pages"].as_u64().unwrap() + each["working_pages"].as_u64().unwrap();
    assert!(
        pages_used < 2 * per_ctx,
        "stored once: {pages_used} pages for two contexts of {per_ctx}"
    );

    // Truncate the fork deep into the shared pages, then both go on greedily: the
    // original continues exactly as a fresh copy of its tokens would.
    let t = ok(
        a,
        &format!("/v1/contexts/{fid}/truncate"),
        json!({"tokens": 40}),
    );
    assert_eq!(
        t["seq_len"].as_u64().unwrap(),
        f["seq_len"].as_u64().unwrap() - 40
    );
    let fresh = ok(a, "/v1/contexts", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        a,
        &format!("/v1/contexts/{fresh}/append"),
        json!({"text": format!("{text}{before}")}),
    );
    let orig_next = greedy(a, &id, 8);
    let fresh_next = greedy(a, &fresh, 8);
    assert_eq!(
        orig_next, fresh_next,
        "the original branch changed under the fork's truncate"
    );
    greedy(a, &fid, 4);

    // Delete, and the ids are gone.
    let d = request(a, "DELETE", &format!("/v1/contexts/{fid}"), &[], b"").json();
    assert_eq!(d["deleted"], true);
    get(a, &format!("/v1/contexts/{fid}")).error(404);
    let list = get(a, "/v1/contexts").json();
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
}

#[test]
fn chat_messages_generate_replies_that_stay_in_the_context() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let id = ok(a, "/v1/contexts", json!({"system": "You are terse."}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        a,
        &format!("/v1/contexts/{id}/append"),
        json!({"messages": [{"role": "user", "content": "Name a colour."}]}),
    );
    let r = ok(
        a,
        &format!("/v1/contexts/{id}/generate"),
        json!({"max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r["object"], "chat.completion");
    let n1 = get(a, &format!("/v1/contexts/{id}")).json()["seq_len"]
        .as_u64()
        .unwrap();
    ok(
        a,
        &format!("/v1/contexts/{id}/append"),
        json!({"messages": [{"role": "user", "content": "Another."}]}),
    );
    let r = post(
        a,
        &format!("/v1/contexts/{id}/generate"),
        &json!({"max_tokens": 8, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    let r = ok(
        a,
        &format!("/v1/contexts/{id}/generate"),
        json!({"max_tokens": 4, "temperature": 0}),
    );
    // Only the new turn was computed: the earlier ones were in the context's pages.
    let u = &r["usage"];
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= n1,
        "{u}"
    );
    // A context generates under a grammar too.
    ok(
        a,
        &format!("/v1/contexts/{id}/append"),
        json!({"messages": [{"role": "user", "content": "Yes or no?"}]}),
    );
    let r = ok(
        a,
        &format!("/v1/contexts/{id}/generate"),
        json!({"guided_choice": ["yes", "no"], "max_tokens": 5}),
    );
    assert!(
        ["yes", "no"].contains(&r["choices"][0]["message"]["content"].as_str().unwrap()),
        "{r}"
    );
}

#[test]
fn bad_ids_and_bodies_are_404_and_400_and_the_limit_is_429() {
    let cfg = ServeConfig {
        max_contexts: 2,
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let a = s.addr;
    get(a, "/v1/contexts/ctx-99").error(404);
    post(a, "/v1/contexts/nope/fork", &json!({})).error(404);
    post(a, "/v1/contexts/nope/append", &json!({"text": "x"})).error(404);
    request(a, "DELETE", "/v1/contexts/nope", &[], b"").error(404);
    let id = ok(a, "/v1/contexts", json!({"cache_salt": "t1"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    post(a, &format!("/v1/contexts/{id}/append"), &json!({})).error(400);
    post(
        a,
        &format!("/v1/contexts/{id}/append"),
        &json!({"text": "a", "tokens": [1]}),
    )
    .error(400);
    post(
        a,
        &format!("/v1/contexts/{id}/append"),
        &json!({"tokens": [1, 99999999]}),
    )
    .error(400);
    post(
        a,
        &format!("/v1/contexts/{id}/append"),
        &json!({"messages": [{"role": "robot", "content": "x"}]}),
    )
    .error(400);
    request(
        a,
        "POST",
        &format!("/v1/contexts/{id}/truncate"),
        &[],
        b"{\"tokens\": -1}",
    )
    .error(400);
    let e = post(
        a,
        &format!("/v1/contexts/{id}/truncate"),
        &json!({"tokens": 5}),
    )
    .error(400);
    assert!(
        e["message"].as_str().unwrap().contains("cannot drop"),
        "{e}"
    );
    post(a, &format!("/v1/contexts/{id}/generate"), &json!({"n": 2})).error(400);
    post(a, &format!("/v1/contexts/{id}/generate"), &json!({})).error(400); // empty context
    post(
        a,
        "/v1/snapshots",
        &json!({"context": id, "name": "../evil"}),
    )
    .error(400);
    post(a, "/v1/snapshots", &json!({"context": "nope", "name": "x"})).error(404);
    post(a, "/v1/snapshots/none/load", &json!({})).error(404);
    request(a, "POST", "/v1/contexts", &[], b"{\"cache_salt\": 5}").error(400);
    ok(a, "/v1/contexts", json!({}));
    let r = post(a, "/v1/contexts", &json!({}));
    r.error(429);
    assert!(r.header("retry-after").is_some());
}

#[test]
fn idle_contexts_are_dropped_after_the_ttl() {
    let cfg = ServeConfig {
        context_ttl: Duration::from_millis(1000),
        ..ServeConfig::default()
    };
    let s = start(cfg, small_engine());
    let id = ok(s.addr, "/v1/contexts", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        s.addr,
        &format!("/v1/contexts/{id}/append"),
        json!({"text": "hello there"}),
    );
    // Any call on a context counts as use, so look only once, after the TTL (a
    // second: the calls before must fit in it on a busy machine) and a reaping.
    std::thread::sleep(Duration::from_millis(2500));
    get(s.addr, &format!("/v1/contexts/{id}")).error(404);
    assert_eq!(get(s.addr, "/v1/contexts").json()["data"], json!([]));
}

#[test]
fn a_snapshot_saved_by_one_server_serves_prefix_hits_in_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EngineConfig {
        snapshot_dir: Some(dir.path().to_path_buf()),
        ..small_engine()
    };
    let doc = "A long shared document about lighthouses and the people who kept them. ".repeat(12);
    {
        let s = start(ServeConfig::default(), cfg());
        let id = ok(s.addr, "/v1/contexts", json!({}))["id"]
            .as_str()
            .unwrap()
            .to_string();
        ok(
            s.addr,
            &format!("/v1/contexts/{id}/append"),
            json!({"text": doc}),
        );
        ok(
            s.addr,
            "/v1/snapshots",
            json!({"context": id, "name": "lighthouses"}),
        );
        s.stop().unwrap();
    }
    let c = cfg();
    let (s, ready) = start_with(ServeConfig::default(), move || Ok(engine(c)));
    ready.recv_timeout(Duration::from_secs(60)).unwrap();
    let list = get(s.addr, "/v1/snapshots").json();
    assert_eq!(list["data"][0]["name"], "lighthouses");
    let r = ok(
        s.addr,
        "/v1/completions",
        json!({"prompt": format!("{doc} Question: who kept them?"), "max_tokens": 2}),
    );
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= 128,
        "the restored snapshot's pages serve the prompt: {cached}"
    );
    let loaded = ok(s.addr, "/v1/snapshots/lighthouses/load", json!({}));
    assert_eq!(loaded["parent"], "snapshot:lighthouses");
    let d = request(s.addr, "DELETE", "/v1/snapshots/lighthouses", &[], b"");
    assert_eq!(d.status, 200, "{}", d.text());
    assert_eq!(get(s.addr, "/v1/snapshots").json()["data"], json!([]));
}
