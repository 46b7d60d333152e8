//! Snapshots meet faults: SIGKILL at varied moments of a save, and a disk that fills
//! while saving. The file on disk is always a whole save (the old one or the new),
//! the server says which, and a failed save keeps the old one.

use crate::client::{context_with, get, ok, post, request, tokens};
use crate::server;
use serde_json::json;
use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// The snapshots the server holds: name → tokens.
pub(crate) fn snapshots(a: SocketAddr) -> Vec<(String, u64)> {
    get(a, "/v1/snapshots").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["tokens"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Sends a save and returns without waiting for the answer (the server may die
/// before it gives one).
fn save_async(a: SocketAddr, ctx: &str, name: &str) -> std::thread::JoinHandle<Option<u16>> {
    let body = json!({"context": ctx, "name": name}).to_string();
    std::thread::spawn(move || {
        let mut s = crate::client::connect(a);
        crate::client::send(&mut s, "POST", "/v1/snapshots", &[], body.as_bytes());
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let head = String::from_utf8_lossy(&out);
        head.split_whitespace().nth(1).and_then(|c| c.parse().ok())
    })
}

/// The temporary file of a save of `name` in `dir`, if one is there.
fn temp_file(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    let prefix = format!(".{name}.snap.");
    std::fs::read_dir(dir).ok()?.find_map(|e| {
        let e = e.ok()?;
        let f = e.file_name().to_string_lossy().into_owned();
        (f.starts_with(&prefix) && f.ends_with(".tmp")).then(|| e.path())
    })
}

fn size(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|m| m.len())
}

const KILLS: usize = 4;

#[test]
fn sigkill_mid_save_restarts_with_the_old_snapshot_or_the_new_never_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let args = ["--snapshot-dir", &d, "--ctx", "2048", "--kv-pages", "320"];
    let snap = dir.path().join("big.snap");
    // A save's temporary file: `.big.snap.<random>.tmp` (unpredictable since probe F10).
    let tmp = || temp_file(dir.path(), "big");
    let mut s = server::start(&args);
    // The first save: 600 tokens (about 14 MB of K/V). Saved twice: the second time
    // the context is already computed, so it times the write alone.
    let mut saved = 600u64;
    let id = context_with(s.addr, &tokens(saved as usize, 0));
    ok(
        s.addr,
        "/v1/snapshots",
        json!({"context": id, "name": "big"}),
    );
    let t = Instant::now();
    let r = ok(
        s.addr,
        "/v1/snapshots",
        json!({"context": id, "name": "big"}),
    );
    let save_time = t.elapsed();
    assert_eq!(r["tokens"], saved);
    let per_token = size(&snap).unwrap() / saved;
    let first = saved;
    let mut outcomes = Vec::new();
    for k in 0..KILLS {
        // The next save: the last one plus 16 tokens, from a context loaded from it.
        let id = ok(s.addr, "/v1/snapshots/big/load", json!({}))["id"]
            .as_str()
            .unwrap()
            .to_string();
        ok(
            s.addr,
            &format!("/v1/contexts/{id}/append"),
            json!({ "tokens": tokens(16, k + 1) }),
        );
        let next = saved + 16;
        let pending = save_async(s.addr, &id, "big");
        // Kill at varied moments: as soon as the temporary file appears, when half of
        // it is written, halfway through the time a save takes, or after the answer.
        let deadline = Instant::now() + Duration::from_secs(30);
        match k {
            0 | 1 => {
                let want = if k == 0 { 0 } else { next * per_token / 2 };
                while !matches!(tmp().and_then(|p| size(&p)), Some(n) if n >= want)
                    && Instant::now() < deadline
                {
                    if pending.is_finished() {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            2 => std::thread::sleep(save_time.mul_f64(0.5)),
            _ => {
                while !pending.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let mid_write = tmp().and_then(|p| size(&p)).is_some();
        s.kill();
        let answered = pending.join().unwrap();
        let left_tmp = tmp().and_then(|p| size(&p)).is_some();
        // Restart on the same directory: the snapshot is a whole save, and the log
        // says which (and that an interrupted save was removed).
        s = server::start(&args);
        let list = snapshots(s.addr);
        assert_eq!(list.len(), 1, "{list:?}");
        let restored = list[0].1;
        assert!(
            restored == saved || restored == next,
            "round {k}: restored {restored} tokens; the saves held {saved} and {next}"
        );
        // The restore's lines come before it (the interrupted save's first).
        let line = format!("snapshot \"big\" restored: {restored} tokens");
        let log = s.stderr_with(&line, Duration::from_secs(10));
        assert!(log.contains(&line), "{log}");
        assert!(!log.contains("snapshot skipped: ") || left_tmp, "{log}");
        if left_tmp {
            assert!(
                log.contains("an interrupted save of snapshot \"big\"")
                    && log.contains(&format!("(restored: {restored} tokens)")),
                "{log}"
            );
            assert!(
                tmp().and_then(|p| size(&p)).is_none(),
                "the temporary file is removed"
            );
        }
        if answered == Some(201) {
            assert_eq!(restored, next, "a save that answered 201 is on disk");
        }
        let which = if restored == next { "new" } else { "old" };
        outcomes.push(format!(
            "round {k}: killed {} the write, restored the {which} save ({restored} tokens)",
            if mid_write { "during" } else { "outside" }
        ));
        saved = restored;
    }
    // The restored snapshot serves: its pages load into a context that generates.
    let id = ok(s.addr, "/v1/snapshots/big/load", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let g = ok(
        s.addr,
        &format!("/v1/contexts/{id}/generate"),
        json!({"max_tokens": 2}),
    );
    assert_eq!(g["usage"]["completion_tokens"], 2, "{g}");
    eprintln!(
        "a save of {first} tokens takes {save_time:?}; {}",
        outcomes.join("; ")
    );
}

#[test]
fn a_disk_that_fills_while_saving_gives_an_error_and_keeps_the_old_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let args = ["--snapshot-dir", &d, "--ctx", "1024", "--kv-pages", "128"];
    let snap = dir.path().join("notes.snap");
    // Files the server writes stop growing at 4 MB: a small snapshot fits, a large
    // one does not (about 23 KB per token).
    let s = server::start_limited(4 << 20, &args);
    let a = s.addr;
    let small = context_with(a, &tokens(40, 0));
    ok(
        a,
        "/v1/snapshots",
        json!({"context": small, "name": "notes"}),
    );
    let old = std::fs::read(&snap).unwrap();
    let large = context_with(a, &tokens(400, 1));
    let r = post(
        a,
        "/v1/snapshots",
        &json!({"context": large, "name": "notes"}),
    );
    let e = r.error(503);
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("the disk is full or the file-size limit"), "{m}");
    assert!(m.contains("previous save of this name"), "{m}");
    // The old snapshot stays, in memory and on disk, byte for byte; nothing of the
    // failed save is left.
    assert_eq!(snapshots(a), vec![("notes".to_string(), 40)]);
    assert_eq!(std::fs::read(&snap).unwrap(), old);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["notes.snap".to_string()]);
    // The server goes on serving, and a save that fits still works.
    assert_eq!(get(a, "/health").status, 200);
    let c = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(c.status, 200, "{}", c.text());
    ok(
        a,
        "/v1/snapshots",
        json!({"context": small, "name": "small2"}),
    );
    assert_eq!(get(a, "/v1/kv/check").status, 200);
    s.kill();
    // Restarted without the limit: the old snapshot is the one restored.
    let s = server::start(&args);
    assert_eq!(
        snapshots(s.addr),
        vec![("notes".to_string(), 40), ("small2".to_string(), 40)]
    );
    let r = request(s.addr, "DELETE", "/v1/snapshots/small2", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
}
