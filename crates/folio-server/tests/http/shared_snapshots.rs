//! Replicas sharing one `--snapshot-dir`: two servers (each its own engine and pool,
//! as two processes would have; here in one test process) on one directory.

use crate::client::{context_with, get, ok, tokens};
use crate::server::{small_engine, start};
use folio::EngineConfig;
use folio_server::ServeConfig;
use serde_json::json;
use std::path::Path;

fn on(dir: &Path) -> EngineConfig {
    EngineConfig {
        snapshot_dir: Some(dir.to_path_buf()),
        ..small_engine()
    }
}

/// The names and token counts `GET /v1/snapshots` lists.
fn listed(addr: std::net::SocketAddr) -> Vec<(String, u64)> {
    get(addr, "/v1/snapshots").json()["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("name").to_string(),
                s["tokens"].as_u64().expect("tokens"),
            )
        })
        .collect()
}

/// Saves context `ctx` on the server at `addr` as snapshot `name`.
fn save(addr: std::net::SocketAddr, ctx: &str, name: &str) {
    ok(addr, "/v1/snapshots", json!({"context": ctx, "name": name}));
}

/// Loads snapshot `name` into a new context: its length.
fn load_len(addr: std::net::SocketAddr, name: &str) -> u64 {
    let c = ok(addr, &format!("/v1/snapshots/{name}/load"), json!({}));
    c["seq_len"].as_u64().expect("seq_len")
}

#[test]
fn replicas_on_one_directory_each_list_and_restore_what_another_saved_after_they_started() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(ServeConfig::default(), on(dir.path()));
    let b = start(ServeConfig::default(), on(dir.path()));
    assert!(listed(b.addr).is_empty());

    let ctx = context_with(a.addr, &tokens(100, 1));
    ok(
        a.addr,
        "/v1/snapshots",
        json!({"context": ctx, "name": "from-a"}),
    );
    assert_eq!(listed(b.addr), vec![("from-a".to_string(), 100)]);
    assert_eq!(load_len(b.addr, "from-a"), 100);

    let ctx = context_with(b.addr, &tokens(70, 2));
    ok(
        b.addr,
        "/v1/snapshots",
        json!({"context": ctx, "name": "from-b"}),
    );
    assert_eq!(load_len(a.addr, "from-b"), 70);
    assert_eq!(
        listed(a.addr),
        vec![("from-a".to_string(), 100), ("from-b".to_string(), 70)]
    );
    // A name nobody saved is still a 404.
    let r = crate::client::post(a.addr, "/v1/snapshots/nobody/load", &json!({}));
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn concurrent_saves_of_one_name_by_two_replicas_leave_one_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(ServeConfig::default(), on(dir.path()));
    let b = start(ServeConfig::default(), on(dir.path()));
    let ca = context_with(a.addr, &tokens(80, 3));
    let cb = context_with(b.addr, &tokens(96, 4));
    std::thread::scope(|s| {
        for (addr, ctx) in [(a.addr, &ca), (b.addr, &cb)] {
            s.spawn(move || {
                for _ in 0..8 {
                    ok(
                        addr,
                        "/v1/snapshots",
                        json!({"context": ctx, "name": "race"}),
                    );
                }
            });
        }
    });
    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        files,
        vec!["race.snap".to_string()],
        "no temporary file is left"
    );
    // A third replica starting on the directory restores the file whole: one of the
    // two saves, checksum and all.
    let c = start(ServeConfig::default(), on(dir.path()));
    let got = listed(c.addr);
    assert!(
        got == vec![("race".to_string(), 80)] || got == vec![("race".to_string(), 96)],
        "{got:?}"
    );
    let n = load_len(c.addr, "race");
    assert!(n == 80 || n == 96, "{n}");
    // The two that raced hold their own last saves; whichever lost the race re-reads
    // the file that won: all three load the same version.
    assert_eq!(load_len(a.addr, "race"), n);
    assert_eq!(load_len(b.addr, "race"), n);
}

#[test]
fn a_replica_holding_a_snapshot_loads_the_newer_version_another_saved_under_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let a = start(ServeConfig::default(), on(dir.path()));
    let b = start(ServeConfig::default(), on(dir.path()));
    // A saves and holds version 1; B restores it from the file, and holds it too.
    let ctx = context_with(a.addr, &tokens(100, 5));
    save(a.addr, &ctx, "shared");
    assert_eq!(load_len(a.addr, "shared"), 100);
    assert_eq!(load_len(b.addr, "shared"), 100);

    // B saves version 2 under the name: A's next load is B's version.
    let ctx = context_with(b.addr, &tokens(60, 6));
    save(b.addr, &ctx, "shared");
    let old = ok(a.addr, "/v1/snapshots/shared/load", json!({}));
    assert_eq!(old["seq_len"].as_u64(), Some(60), "A loaded {old}");
    assert_eq!(
        listed(a.addr),
        vec![("shared".to_string(), 60)],
        "A lists the version it holds now"
    );

    // And back: A saves version 3, B (holding version 2, its own save) loads it.
    let ctx = context_with(a.addr, &tokens(40, 7));
    save(a.addr, &ctx, "shared");
    assert_eq!(load_len(b.addr, "shared"), 40);
    // An unchanged file is not read again: loads keep giving the version held.
    assert_eq!(load_len(b.addr, "shared"), 40);
    assert_eq!(load_len(a.addr, "shared"), 40);

    // The contexts loaded from older versions keep their pages: version 2's context
    // on A still answers with its 60 tokens.
    let id = old["id"].as_str().expect("the context's id");
    let info = get(a.addr, &format!("/v1/contexts/{id}")).json();
    assert_eq!(info["seq_len"].as_u64(), Some(60), "{info}");
}
