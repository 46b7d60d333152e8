//! Snapshots under a hostile client (probe 2026-11-27): saves in a loop do not stall
//! other requests (F2), a crafted snapshot file is skipped at start and cannot fail a
//! stream beside it (F9), and snapshot files have a quota (F11a). And (probe
//! 2026-12-08, F1) a salted context's snapshot stays in its tenant's chain across a
//! restart.

use crate::client::{context_with, get, ok, open_stream, post, tokens};
use crate::server::start;
use crate::stall::{assert_no_stall, under_attack};
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

fn files(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn snapshot_names(a: SocketAddr) -> Vec<String> {
    get(a, "/v1/snapshots").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn saving_a_3000_token_context_in_a_loop_does_not_stall_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(
        ServeConfig::default(),
        EngineConfig {
            kv_pages: 1024,
            max_seq_tokens: Some(4096),
            snapshot_dir: Some(dir.path().to_path_buf()),
            ..EngineConfig::default()
        },
    );
    let a = s.addr;
    let id = context_with(a, &tokens(3000, 0));
    // The first save computes the context; the attack's saves only write.
    let r = ok(a, "/v1/snapshots", json!({"context": id, "name": "first"}));
    assert_eq!(r["tokens"], 3000);
    let saves = AtomicUsize::new(0);
    let (alone, attacked) = under_attack(a, 100, 2, |t, _| {
        let r = post(
            a,
            "/v1/snapshots",
            &json!({"context": id, "name": format!("loop{t}")}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        saves.fetch_add(1, Ordering::Relaxed);
    });
    let saves = saves.load(Ordering::Relaxed);
    let size = std::fs::metadata(dir.path().join("first.snap"))
        .unwrap()
        .len();
    eprintln!(
        "{saves} saves of {size} bytes while the victim ran ({:.1} MB written)",
        (saves as u64 * size) as f64 / 1e6
    );
    assert!(saves >= 2, "the savers ran: {saves} saves");
    assert_eq!(attacked.tokens, alone.tokens, "the victim got every token");
    eprintln!(
        "median gap {:?} alone, {:?} under attack",
        alone.median, attacked.median
    );
    assert_no_stall("saving a 3000-token snapshot in a loop", alone, attacked);
    // Every save ended whole: the snapshots and their files, nothing else.
    assert_eq!(snapshot_names(a), vec!["first", "loop0", "loop1"]);
    assert_eq!(
        files(dir.path()),
        vec!["first.snap", "loop0.snap", "loop1.snap"]
    );
    assert_eq!(get(a, "/v1/kv/check").status, 200);
}

#[test]
fn a_crafted_snapshot_with_a_token_outside_the_vocabulary_is_skipped_and_a_stream_beside_it_is_unaffected(
) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EngineConfig {
        kv_pages: 512,
        max_seq_tokens: Some(1024),
        snapshot_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let n = 45;
    {
        let s = start(ServeConfig::default(), cfg());
        let id = context_with(s.addr, &tokens(n, 1));
        ok(
            s.addr,
            "/v1/snapshots",
            json!({"context": id, "name": "ref"}),
        );
        s.stop().unwrap();
    }
    // The forger: the last token made 0xFFFFFFF0, the checksum recomputed.
    let mut b = std::fs::read(dir.path().join("ref.snap")).unwrap();
    // Tokens start after the 44-byte header and the salt's length (no salt).
    let at = 48 + 4 * (n - 1);
    b[at..at + 4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    b.truncate(b.len() - 16);
    let sum = xxhash_rust::xxh3::xxh3_128(&b).to_le_bytes();
    b.extend_from_slice(&sum);
    std::fs::write(dir.path().join("evil_last.snap"), &b).unwrap();

    let s = start(ServeConfig::default(), cfg());
    let a = s.addr;
    assert_eq!(snapshot_names(a), vec!["ref"]);
    // A stream runs while a client tries the crafted snapshot, and loads and
    // generates from the good one.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0,
                      "ignore_eos": true, "stream": true});
    let mut stream = open_stream(a, "/v1/completions", &body);
    assert_eq!(stream.status, 200);
    let first = stream.next_event().expect("a first event");
    let e = post(a, "/v1/snapshots/evil_last/load", &json!({})).error(404);
    assert!(e["message"].as_str().unwrap().contains("evil_last"), "{e}");
    let ctx = ok(a, "/v1/snapshots/ref/load", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let g = ok(
        a,
        &format!("/v1/contexts/{ctx}/generate"),
        json!({"max_tokens": 5, "ignore_eos": true}),
    );
    assert_eq!(g["usage"]["completion_tokens"], 5, "{g}");
    let mut events = vec![first];
    while let Some(e) = stream.next_event() {
        let done = e == "[DONE]";
        events.push(e);
        if done {
            break;
        }
    }
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(
        events.iter().all(|e| !e.contains("\"error\"")),
        "the stream beside it got an error: {events:?}"
    );
    let tokens_seen = events
        .iter()
        .filter(|e| e.starts_with('{') && e.contains("\"text\""))
        .count();
    assert!(tokens_seen >= 60, "{tokens_seen} token events: {events:?}");
}

#[test]
fn a_save_over_the_snapshot_quota_is_507_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(
        ServeConfig::default(),
        EngineConfig {
            kv_pages: 512,
            max_seq_tokens: Some(1024),
            snapshot_dir: Some(dir.path().to_path_buf()),
            // About 23 KB a token with the default model: two 20-token saves fit,
            // an 80-token one does not.
            snapshot_max_bytes: 2 << 20,
            snapshot_max_count: 2,
            ..EngineConfig::default()
        },
    );
    let a = s.addr;
    let small = context_with(a, &tokens(20, 2));
    ok(a, "/v1/snapshots", json!({"context": small, "name": "a"}));
    ok(a, "/v1/snapshots", json!({"context": small, "name": "b"}));
    let before: Vec<Vec<u8>> = ["a.snap", "b.snap"]
        .iter()
        .map(|f| std::fs::read(dir.path().join(f)).unwrap())
        .collect();
    // A third name: over the count.
    let r = post(a, "/v1/snapshots", &json!({"context": small, "name": "c"}));
    let e = r.error(507);
    assert_eq!(e["code"], "snapshot_quota_exceeded", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("--max-snapshots"),
        "{e}"
    );
    assert_eq!(r.header("retry-after"), None);
    // A bigger save of an existing name: over the bytes (the old file counts off).
    let big = context_with(a, &tokens(80, 3));
    let r = post(a, "/v1/snapshots", &json!({"context": big, "name": "a"}));
    let e = r.error(507);
    assert_eq!(e["code"], "snapshot_quota_exceeded", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("--snapshot-max-bytes"),
        "{e}"
    );
    // Nothing was written: the same files, byte for byte, and the same snapshots.
    assert_eq!(files(dir.path()), vec!["a.snap", "b.snap"]);
    for (f, old) in ["a.snap", "b.snap"].iter().zip(&before) {
        assert_eq!(&std::fs::read(dir.path().join(f)).unwrap(), old, "{f}");
    }
    assert_eq!(snapshot_names(a), vec!["a", "b"]);
    // Replacing a snapshot with one of its size counts only the difference.
    ok(a, "/v1/snapshots", json!({"context": small, "name": "a"}));
    // A delete makes room.
    let d = crate::client::request(a, "DELETE", "/v1/snapshots/b", &[], b"");
    assert_eq!(d.status, 200, "{}", d.text());
    ok(a, "/v1/snapshots", json!({"context": small, "name": "c"}));
    assert_eq!(files(dir.path()), vec!["a.snap", "c.snap"]);
    assert_eq!(get(a, "/v1/kv/check").status, 200);
}

/// A snapshot of a context with a `cache_salt` keeps the salt: a load reports it, and
/// after a restart the restored pages serve only that tenant's prompts. The hostile
/// probe of 2026-12-08 (F1) found the pages restored unsalted: any tenant's prompt
/// matched the salted tenant's secret prefix (its `cached_tokens` said so), and the
/// tenant itself lost the hit.
#[test]
fn a_salted_contexts_snapshot_stays_in_its_tenants_chain_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EngineConfig {
        kv_pages: 256,
        max_seq_tokens: Some(1024),
        snapshot_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let secret = tokens(80, 7);
    let matched = |a: SocketAddr, salt: Option<&str>| {
        let mut body = json!({ "tokens": secret });
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        ok(a, "/v1/cache/match", body)["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let loaded_salt = |a: SocketAddr| {
        let c = ok(a, "/v1/snapshots/alice-secret/load", json!({}));
        c["cache_salt"].clone()
    };
    {
        let s = start(ServeConfig::default(), cfg());
        let a = s.addr;
        let id = ok(a, "/v1/contexts", json!({"cache_salt": "alice"}))["id"]
            .as_str()
            .unwrap()
            .to_string();
        ok(
            a,
            &format!("/v1/contexts/{id}/append"),
            json!({ "tokens": secret }),
        );
        ok(
            a,
            "/v1/snapshots",
            json!({"context": id, "name": "alice-secret"}),
        );
        assert_eq!(loaded_salt(a), json!("alice"));
        let hits = [
            matched(a, None),
            matched(a, Some("bob")),
            matched(a, Some("alice")),
        ];
        assert_eq!(hits[..2], [0, 0]);
        assert!(hits[2] >= 64, "{hits:?}");
        s.stop().unwrap();
    }
    let s = start(ServeConfig::default(), cfg());
    let a = s.addr;
    assert_eq!(snapshot_names(a), vec!["alice-secret"]);
    let hits = [
        matched(a, None),
        matched(a, Some("bob")),
        matched(a, Some("alice")),
    ];
    assert_eq!(
        hits[..2],
        [0, 0],
        "another tenant sees the salted pages: {hits:?}"
    );
    assert!(hits[2] >= 64, "the tenant lost its pages: {hits:?}");
    assert_eq!(loaded_salt(a), json!("alice"));
    assert_eq!(get(a, "/v1/kv/check").status, 200);
}
