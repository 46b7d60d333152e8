//! KV events (`--kv-events`) as a router receives them: a pyzmq + msgpack subscriber
//! (scripts/test_kv_events.py, in a venv at `target/kv-events-venv` made on first
//! use; needs python3, and PyPI the first time) binds, the server connects to it,
//! requests with shared prefixes (one family of them under a tenant's `cache_salt`)
//! run through a pool small enough to evict, and the subscriber checks every key
//! against vLLM's sha256_cbor computed from the token ids (and the salt, as vLLM
//! hashes it into a first block's extra keys), the sequence numbers, its view of the
//! cache against `/v1/kv` and `/v1/cache/match`, and the replay socket after a
//! deliberate gap.

use crate::client::{get, ok, tokens};
use crate::server::{small_engine, start};
use folio::EngineConfig;
use folio_server::kv_events::{KvEventsConfig, KvHashMode};
use folio_server::ServeConfig;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's python with pyzmq, msgpack and cbor2 (made and filled the first time).
fn venv_python() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let venv = target.join("kv-events-venv");
    let python = venv.join("bin/python");
    let has = |p: &Path| {
        Command::new(p)
            .args(["-c", "import zmq, msgpack, cbor2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !python.exists() {
        let st = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .status()
            .expect("python3 (with its venv module) runs the KV-event subscriber");
        assert!(st.success(), "python3 -m venv {} failed", venv.display());
    }
    if !has(&python) {
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["pyzmq", "msgpack", "cbor2"])
            .output()
            .expect("run pip");
        assert!(
            out.status.success(),
            "pip install pyzmq msgpack cbor2 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    python
}

#[test]
fn a_subscriber_rebuilds_every_vllm_key_in_sequence_and_holds_what_the_pool_indexes() {
    let mut sub = Command::new(venv_python())
        .arg(repo().join("scripts/test_kv_events.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the subscriber");
    let mut lines = BufReader::new(sub.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("the subscriber's port").expect("read");
    let port: u16 = first
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the subscriber said {first:?}"));

    let block_size = 16;
    // A free port for the replay socket (bound by the publisher).
    let replay_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let replay = format!("tcp://127.0.0.1:{replay_port}");
    let (tap, rx) = folio::kv_event_channel(1 << 16);
    folio_server::kv_events::spawn(
        KvEventsConfig {
            endpoint: format!("tcp://127.0.0.1:{port}"),
            topic: "kv@test@folio".into(),
            hash: KvHashMode::Vllm,
            seed: "1234".into(),
            block_size,
            replay: Some(replay.clone()),
        },
        rx,
    )
    .expect("the publisher");
    // 40 pages of 16: a few prompts fill it, the rest evict.
    let engine = EngineConfig {
        kv_pages: 40,
        page_size: block_size,
        max_seq_tokens: Some(256),
        kv_events: Some(tap),
        ..small_engine()
    };
    let s = start(ServeConfig::default(), engine);
    // The publisher connects, then waits for the subscription before its first message.
    std::thread::sleep(Duration::from_secs(2));

    // Three families of prompts sharing 64-token prefixes, each with its own tail;
    // the third family is a tenant's (`cache_salt`, not ASCII: the salt is hashed as
    // the UTF-8 string vLLM would see), and shares its prefix with the first family,
    // which the salt keeps apart.
    let salt_of = |family: usize| (family == 2).then_some("tenant-ß");
    let mut prompts = Vec::new();
    let mut salts = Vec::new();
    for round in 0..4 {
        for family in 0..3 {
            let mut p = tokens(64, 1000 + family % 2);
            p.extend(tokens(40 + 8 * round, 2000 + 10 * family + round));
            let mut body =
                json!({"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": true});
            if let Some(salt) = salt_of(family) {
                body["cache_salt"] = json!(salt);
            }
            ok(s.addr, "/v1/completions", body);
            prompts.push(p);
            salts.push(salt_of(family));
        }
    }
    // Events of the last step go out as the engine turns to wait.
    std::thread::sleep(Duration::from_millis(500));
    let kv = get(s.addr, "/v1/kv").json();
    let indexed = kv["pages"]
        .as_array()
        .expect("pages")
        .iter()
        .filter(|p| p["indexed"] == json!(true))
        .count();
    let matched: Vec<u64> = prompts
        .iter()
        .zip(&salts)
        .map(|(p, salt)| {
            let mut body = json!({ "tokens": p });
            if let Some(salt) = salt {
                body["cache_salt"] = json!(salt);
            }
            ok(s.addr, "/v1/cache/match", body)["cached_tokens"]
                .as_u64()
                .expect("cached_tokens")
        })
        .collect();
    assert!(indexed > 0, "nothing indexed: {kv}");

    let spec = json!({
        "block_size": block_size,
        "seed": "1234",
        "indexed": indexed,
        "prompts": prompts,
        "salts": salts,
        "matched": matched,
        "replay": replay,
    });
    let mut stdin = sub.stdin.take().expect("stdin");
    writeln!(stdin, "{spec}").expect("tell the subscriber");
    drop(stdin);
    let verdict: Vec<String> = lines.map_while(Result::ok).collect();
    let status = sub.wait().expect("the subscriber ends");
    assert!(
        status.success() && verdict.iter().any(|l| l.starts_with("OK ")),
        "the subscriber: {verdict:?}"
    );
    eprintln!("{}", verdict.join("\n"));
}

#[test]
fn a_lagging_subscriber_loses_batches_counted_then_is_told_to_start_over() {
    // Room for one batch, and nobody reading while requests run.
    let (tap, rx) = folio::kv_event_channel(1);
    let engine = EngineConfig {
        kv_events: Some(tap),
        ..small_engine()
    };
    let s = start(ServeConfig::default(), engine);
    let run = |salt: usize| {
        ok(
            s.addr,
            "/v1/completions",
            json!({"prompt": tokens(70, salt), "max_tokens": 20, "temperature": 0, "ignore_eos": true}),
        );
    };
    run(1);
    run(2);
    let first = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("engine running")
        .expect("the first batch");
    assert!(first.cleared, "the first batch starts over");
    assert!(rx.dropped() > 0, "a full channel drops batches");
    // Now a reader keeps up: what comes next starts over, then flows.
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        while let Some(b) = rx
            .recv_timeout(Duration::from_secs(3))
            .expect("engine running")
        {
            got.push(b);
        }
        got
    });
    run(3);
    let after = reader.join().expect("the reader");
    assert!(
        after.first().is_some_and(|b| b.cleared),
        "the first batch after a loss says cleared: {after:?}"
    );
    assert!(
        after
            .iter()
            .flat_map(|b| &b.events)
            .any(|e| matches!(e, folio::KvEvent::Stored { .. })),
        "what was stored since arrives: {after:?}"
    );
}
