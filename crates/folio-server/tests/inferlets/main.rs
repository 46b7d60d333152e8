//! Inferlets end to end: the example programs (Python, built with componentize-py,
//! and JavaScript, built with componentize-js, by `scripts/build_inferlet.sh`) uploaded to a real server on loopback over HTTP
//! and run against the real default model; and hostile programs, after which the
//! server still serves, no page is held and a greedy answer is unchanged.
//!
//! The guests are built here when missing or older than their sources (the first
//! build installs componentize-py into target/inferlet-venv from PyPI and
//! componentize-js into target/inferlet-js from npm). Tests run one
//! at a time (a lock): the page checks need no other run going.

#[path = "../http/client.rs"]
#[allow(dead_code)]
mod client;
#[path = "../http/server.rs"]
#[allow(dead_code)]
mod server;

mod compile_cache;
mod examples;
mod hostile;
mod interface;
mod js;
mod js_hostile;
mod routes;
mod search;

use client::{get, Resp};
use serde_json::{json, Value};
use std::io::BufReader;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn newest(paths: &[PathBuf]) -> std::time::SystemTime {
    paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
        .expect("the guest's sources exist")
}

/// Builds `examples/inferlets/{name}.{ext}` into `target/inferlets/{out}.wasm` when
/// that is missing or older than its sources; `Err` holds the build's exit code and
/// what failed.
fn build(name: &str, ext: &str, out: &str, sdk: &[&str]) -> Result<Vec<u8>, (Option<i32>, String)> {
    static BUILD: Mutex<()> = Mutex::new(());
    let _b = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let r = root();
    let src = r.join(format!("examples/inferlets/{name}.{ext}"));
    let out = r.join(format!("target/inferlets/{out}.wasm"));
    let mut inputs = vec![src.clone(), r.join("crates/folio-inferlet/wit/folio.wit")];
    inputs.extend(
        sdk.iter()
            .map(|f| r.join("crates/folio-inferlet/sdk").join(f)),
    );
    let fresh = std::fs::metadata(&out)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= newest(&inputs));
    if !fresh {
        let st = std::process::Command::new("bash")
            .arg(r.join("scripts/build_inferlet.sh"))
            .arg(&src)
            .arg(&out)
            .status()
            .expect("run scripts/build_inferlet.sh");
        if !st.success() {
            return Err((st.code(), format!("building {name}.{ext} failed ({st})")));
        }
    }
    Ok(std::fs::read(&out).expect("the built guest"))
}

/// The component built from `examples/inferlets/{name}.py` (built now if missing or
/// stale).
pub fn guest(name: &str) -> Vec<u8> {
    build(
        name,
        "py",
        name,
        &["python/folio.py", "python/main_wrapper.py"],
    )
    .unwrap_or_else(|(_, e)| panic!("{e}"))
}

/// The JavaScript examples (`examples/inferlets/{name}.js`), uploaded as `{name}_js`.
pub const JS_GUESTS: [&str; 9] = [
    "generate",
    "best_of_n",
    "json_extract",
    "agent",
    "chat",
    "beam",
    "lookup",
    "hostile",
    "snapshot",
];

/// The component built from `examples/inferlets/{name}.js` by componentize-js (built
/// now if missing or stale). The build script exits with 3 when npm cannot install
/// componentize-js: then `None`, and the JavaScript tests say they are skipped.
pub fn js_guest(name: &str) -> Option<Vec<u8>> {
    let sdk = ["js/folio.js", "js/main_wrapper.js", "js/package-lock.json"];
    match build(name, "js", &format!("{name}_js"), &sdk) {
        Ok(b) => Some(b),
        Err((Some(3), e)) => {
            eprintln!("skipping the JavaScript guests: {e}: npm could not install componentize-js");
            None
        }
        Err((_, e)) => panic!("{e}"),
    }
}

/// Whether the shared server holds the JavaScript guests (false, with the reason
/// printed, only when componentize-js could not be installed).
pub fn js_ready() -> bool {
    shared_server();
    let ready = *JS_READY.get().expect("set by shared_server");
    if !ready {
        eprintln!("skipped: componentize-js could not be installed from npm");
    }
    ready
}

static JS_READY: OnceLock<bool> = OnceLock::new();

/// POSTs a component under `name`.
pub fn upload(a: SocketAddr, name: &str, bytes: &[u8]) -> Resp {
    raw(
        a,
        "POST",
        &format!("/v1/inferlets?name={name}"),
        &[("Content-Type", "application/wasm")],
        bytes,
    )
}

/// Like `client::request` but without the JSON content type `send` adds for a body.
pub fn raw(a: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    use std::io::Write;
    let mut s = client::connect(a);
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    client::read_response(&mut BufReader::new(s))
}

/// Runs `name` with `input` (JSON answer).
pub fn run(a: SocketAddr, name: &str, input: Value) -> Resp {
    client::post(
        a,
        &format!("/v1/inferlets/{name}/run"),
        &json!({ "input": input }),
    )
}

/// The pool holds no page for anyone: every page free or cached, none working,
/// committed or pinned, and the page store's invariants hold.
pub fn assert_no_page_held(a: SocketAddr) {
    let settled = client::eventually(10.0, || {
        let t = get(a, "/v1/kv").json()["totals"].clone();
        t["working"] == 0 && t["committed"] == 0 && t["running"] == 0
    });
    let t = get(a, "/v1/kv").json()["totals"].clone();
    assert!(settled, "pages still held after the runs: {t}");
    assert_eq!(
        t["free"].as_u64().unwrap() + t["cached"].as_u64().unwrap(),
        t["pages"].as_u64().unwrap(),
        "{t}"
    );
    let c = get(a, "/v1/kv/check");
    assert_eq!(c.status, 200, "{}", c.text());
}

/// A greedy completion's text (the reference a hostile run must not change).
pub fn greedy(a: SocketAddr, prompt: &str) -> String {
    let v = client::ok(
        a,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
    );
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// One test at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Contexts one run may hold on the shared server.
pub const CONTEXTS: usize = 6;

/// Pages one run's contexts may hold on the shared server (of 512; the contexts'
/// share is half the pool, so the run's quota is what stops a hog).
pub const PAGES: usize = 120;

/// The server the examples and the attacks share (each program uploaded once:
/// compiling a Python component takes seconds). Hostile runs ask for a short time
/// limit.
pub fn shared_server() -> SocketAddr {
    static S: OnceLock<(server::Server, SocketAddr)> = OnceLock::new();
    S.get_or_init(|| {
        let mut cfg = folio_server::ServeConfig::default();
        cfg.inferlet_limits.memory_bytes = 192 << 20;
        cfg.inferlet_limits.contexts = CONTEXTS;
        cfg.inferlet_limits.pages = PAGES;
        cfg.inferlet_limits.concurrent_runs = 2;
        cfg.inferlet_limits.output_bytes = 1 << 20;
        let s = server::start(cfg, server::small_engine());
        let a = s.addr;
        for name in [
            "best_of_n",
            "agent",
            "json_extract",
            "generate",
            "chat",
            "hostile",
            "beam",
            "lookup",
            "score",
            "snapshot",
        ] {
            let r = upload(a, name, &guest(name));
            assert_eq!(r.status, 201, "{name}: {}", r.text());
        }
        let mut js = true;
        for name in JS_GUESTS {
            let Some(bytes) = js_guest(name) else {
                js = false;
                break;
            };
            let r = upload(a, &format!("{name}_js"), &bytes);
            assert_eq!(r.status, 201, "{name}_js: {}", r.text());
        }
        JS_READY.set(js).unwrap();
        (s, a)
    })
    .1
}
