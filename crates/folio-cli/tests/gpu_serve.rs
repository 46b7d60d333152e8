//! `folio serve --device gpu` over HTTP, at its defaults: a script of the server's
//! routes whose answers must agree with each other on the GPU backend as they do on
//! the CPU (run first, on the same script): completions whole, streamed and with
//! `n = 2` (forked pages) give the same greedy text; structured output (a JSON schema)
//! and a forced tool call are valid for their schema; a context of a text generates what
//! a completion of it does; a fork truncated back across a page generates; a snapshot
//! saved and loaded into a new context continues as its context; a prompt longer than
//! the context is a 400; embeddings agree with the CPU's (cosine); at the end, the
//! contexts deleted, no page is held; and `/metrics` names the backend and its device
//! figures (memory, pages read back, copies on the device). Snapshots go to a directory and the disk tier
//! is on, so the GPU's K/V is read back from the device for both. The two backends' texts are not compared: their
//! arithmetic differs and a near tie may part them (`crates/folio-gpu/tests/parity.rs`
//! compares them where they agree, with llama.cpp's arithmetic on both). CI runs it on
//! Mesa's lavapipe (a few tokens per answer: there a step takes about a second); without
//! any Vulkan adapter it says so and returns.

#[allow(dead_code)]
#[path = "../../folio-server/tests/http/client.rs"]
mod client;
#[allow(dead_code)]
#[path = "common/server.rs"]
mod server;

use client::{get, ok, post, request};
use serde_json::{json, Value};
use std::net::SocketAddr;

/// The script on the server at `a`, checking that its answers agree with each other
/// (streamed and whole, `n = 2`, a context and a plain completion of the same text, a
/// snapshot and the context it was taken of); returns what the answers were (for the
/// log) and the embedding.
fn script(a: SocketAddr) -> (Vec<String>, Vec<f64>) {
    let mut got = Vec::new();
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap_or("").to_string();
    let greedy = |extra: Value| {
        let mut b = json!({"temperature": 0, "ignore_eos": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    // Completions: whole, streamed and n = 2 (forked pages): the same text.
    let p = json!({"prompt": "The three primary colours are", "max_tokens": 4});
    let whole = text(&ok(a, "/v1/completions", greedy(p.clone())));
    let mut sp = p.clone();
    sp["stream"] = json!(true);
    let r = post(a, "/v1/completions", &greedy(sp));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut streamed = String::new();
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        streamed.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed, whole, "streamed and whole answers differ");
    let mut np = p.clone();
    np["n"] = json!(2);
    let r = ok(a, "/v1/completions", greedy(np));
    for c in r["choices"].as_array().unwrap() {
        assert_eq!(c["text"].as_str().unwrap(), whole, "n = 2: {r}");
    }
    got.push(whole);
    let chat = json!({
        "messages": [{"role": "user", "content": "Name a planet."}],
        "max_tokens": 3
    });
    let r = ok(a, "/v1/chat/completions", greedy(chat));
    got.push(
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    // Structured output and a forced tool call: the grammar masks the step's logits
    // wherever the step ran.
    let colours = json!({"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
        "required": ["colour"], "additionalProperties": false});
    let ask = json!({"messages": [{"role": "user", "content": "Pick a colour."}], "max_tokens": 48,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": colours}}});
    let r = ok(a, "/v1/chat/completions", greedy(ask));
    assert_eq!(
        r["choices"][0]["finish_reason"], "stop",
        "ended by the grammar: {r}"
    );
    let content = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let picked: Value = serde_json::from_str(&content).unwrap();
    assert!(
        ["red", "blue"].contains(&picked["colour"].as_str().unwrap()),
        "{content}"
    );
    got.push(content);
    let tools = json!([{"type": "function", "function": {"name": "paint", "parameters": colours}}]);
    let call = json!({"messages": [{"role": "user", "content": "Paint it."}], "max_tokens": 48,
        "tools": tools, "tool_choice": "required"});
    let r = ok(a, "/v1/chat/completions", greedy(call));
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
    let f = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(f["name"], "paint", "{r}");
    let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["red", "blue"].contains(&args["colour"].as_str().unwrap()),
        "{args}"
    );
    got.push(args.to_string());
    // A context of a text generates what a completion of the same text does.
    let doc = "The lighthouse keeper wrote in his log every evening: the wind, the ships, \
               the colour of the sea. "
        .to_string();
    let plain = text(&ok(
        a,
        "/v1/completions",
        greedy(json!({"prompt": doc, "max_tokens": 3})),
    ));
    let id = ok(a, "/v1/contexts", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        a,
        &format!("/v1/contexts/{id}/append"),
        json!({"text": doc}),
    );
    let gen = |id: &str, n: usize| {
        let r = ok(
            a,
            &format!("/v1/contexts/{id}/generate"),
            json!({"max_tokens": n, "temperature": 0, "ignore_eos": true, "chat": false}),
        );
        text(&r)
    };
    let first = gen(&id, 3);
    assert_eq!(first, plain, "a context and a completion of the same text");
    got.push(first);
    // A fork truncated back across a page (into the first of the context's two) and
    // generated on.
    let fid = ok(a, &format!("/v1/contexts/{id}/fork"), json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        a,
        &format!("/v1/contexts/{fid}/truncate"),
        json!({"tokens": 12}),
    );
    got.push(gen(&fid, 2));
    // A snapshot continues as the context it was taken of.
    ok(a, "/v1/snapshots", json!({"context": id, "name": "log"}));
    let next = gen(&id, 2);
    let loaded = ok(a, "/v1/snapshots/log/load", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        gen(&loaded, 2),
        next,
        "the snapshot continues as its context"
    );
    got.push(next);
    // A prompt longer than the context is the user's mistake on either backend.
    let long = "word ".repeat(3000);
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // Embeddings: the final norm's hidden states.
    let r = ok(
        a,
        "/v1/embeddings",
        json!({"input": "a lighthouse on a cliff"}),
    );
    let emb: Vec<f64> = r["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let gone = [&id, &fid, &loaded].map(|c| format!("/v1/contexts/{c}"));
    for path in gone.iter().map(String::as_str).chain(["/v1/snapshots/log"]) {
        let d = request(a, "DELETE", path, &[], b"");
        assert_eq!(d.status, 200, "{path}: {}", d.text());
    }
    let kv = get(a, "/v1/kv").json();
    let held = kv["pages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| !p["holders"].as_array().unwrap().is_empty())
        .count();
    assert_eq!(held, 0, "pages still held at the end: {}", kv["totals"]);
    (got, emb)
}

#[test]
fn the_server_runs_on_the_gpu_backend() {
    if let Err(e) = folio_gpu::Gpu::open(true) {
        eprintln!("skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
        return;
    }
    // Snapshots kept in a directory and the disk tier on: their files are written from
    // K/V the GPU left on the device, read back for them.
    let root = std::env::temp_dir().join(format!("folio-gpu-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dirs = |device: &str| {
        let (s, d) = (
            root.join(device).join("snapshots"),
            root.join(device).join("disk"),
        );
        std::fs::create_dir_all(&s).unwrap();
        [s, d].map(|p| p.to_str().unwrap().to_string())
    };
    let args = |device: &'static str, [snaps, disk]: &[String; 2]| {
        let fixed = ["--device", device, "--ctx", "2048", "--threads", "2"];
        let dirs = ["--snapshot-dir", snaps, "--kv-disk", disk];
        fixed
            .into_iter()
            .chain(dirs)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let start = |a: Vec<String>| server::start(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let cpu = start(args("cpu", &dirs("cpu")));
    let (cpu_answers, cpu_emb) = script(cpu.addr);
    let metrics = get(cpu.addr, "/metrics").text();
    assert!(metrics.contains("backend=\"cpu "), "{metrics}");
    assert!(!metrics.contains("folio:device_"), "{metrics}");
    drop(cpu);
    let gpu_dirs = dirs("gpu");
    let gpu = start(args("gpu", &gpu_dirs));
    let line = "the forward pass runs on the GPU";
    let log = gpu.stderr_with(line, std::time::Duration::from_secs(10));
    assert!(log.contains(line), "{log}");
    let (answers, emb) = script(gpu.addr);
    // The texts themselves may part where two tokens nearly tie (the backends'
    // arithmetic differs: parity.rs); the hidden states agree closely.
    let dot: f64 = emb.iter().zip(&cpu_emb).map(|(a, b)| a * b).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cos = dot / (norm(&emb) * norm(&cpu_emb));
    eprintln!("gpu answers: {answers:?}\ncpu answers: {cpu_answers:?}\nembedding cosine {cos:.6}");
    assert!(cos > 0.999, "embedding cosine {cos}");
    // /metrics names the backend and its figures: weights and the pool in device
    // memory, pages read back for the snapshot and the disk tier, copies made there.
    let metrics = get(gpu.addr, "/metrics").text();
    let figure = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("folio:{name}{{")))
            .unwrap_or_else(|| panic!("no {name}: {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(metrics.contains("backend=\"gpu "), "{metrics}");
    let figures = [
        "device_weight_bytes",
        "device_kv_pool_bytes",
        "device_kv_uploaded_pages_total",
        "device_kv_read_back_pages_total",
        "device_kv_read_back_bytes_total",
        "device_kv_copies_total",
    ]
    .map(|n| (n, figure(n)));
    eprintln!("the GPU server's figures: {figures:?}");
    for (name, v) in figures {
        if name != "device_kv_uploaded_pages_total" {
            assert!(v > 0, "{name}: {v}");
        }
    }
    // The disk tier holds the GPU's committed pages, read back from the device.
    drop(gpu);
    let on_disk = std::fs::read_dir(&gpu_dirs[1])
        .unwrap()
        .flat_map(|pool| std::fs::read_dir(pool.unwrap().path()).unwrap())
        .filter(|f| f.as_ref().unwrap().path().extension() == Some("page".as_ref()))
        .count();
    eprintln!("pages in the GPU server's disk tier: {on_disk}");
    assert!(on_disk > 0, "no page in the GPU server's disk tier");
    let _ = std::fs::remove_dir_all(&root);
}
