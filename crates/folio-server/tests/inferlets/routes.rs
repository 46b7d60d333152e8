//! The inferlet routes' contract: upload, list, delete, persistence in
//! `--inferlet-dir`, and the errors a caller can cause (never a 500).

use crate::client::{self, get};
use crate::{guest, raw, run, serial, server, upload};
use serde_json::json;

#[test]
fn upload_list_run_delete_and_persist_across_restarts() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = folio_server::ServeConfig {
        inferlet_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let wasm = guest("generate");
    {
        let s = server::start(cfg.clone(), server::small_engine());
        let a = s.addr;
        let r = upload(a, "gen", &wasm);
        assert_eq!(r.status, 201, "{}", r.text());
        let v = r.json();
        assert_eq!(v["id"], "gen");
        assert_eq!(v["bytes"], wasm.len());
        let list = get(a, "/v1/inferlets").json();
        assert_eq!(list["object"], "list");
        assert_eq!(list["data"][0]["id"], "gen");
        let r = run(
            a,
            "gen",
            json!({"prompt": "Hello", "max_tokens": 4, "stream": false}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["output"][0]["json"]["tokens"], 4);
        assert!(dir.path().join("gen.wasm").exists());
    }
    // A new server on the same directory has it.
    let s = server::start(cfg, server::small_engine());
    let a = s.addr;
    assert_eq!(get(a, "/v1/inferlets").json()["data"][0]["id"], "gen");
    let r = run(
        a,
        "gen",
        json!({"prompt": "Hello", "max_tokens": 2, "stream": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let d = client::request(a, "DELETE", "/v1/inferlets/gen", &[], b"");
    assert_eq!(d.status, 200, "{}", d.text());
    assert_eq!(d.json()["deleted"], true);
    assert!(!dir.path().join("gen.wasm").exists());
    client::request(a, "DELETE", "/v1/inferlets/gen", &[], b"").error(404);
    run(a, "gen", json!({})).error(404);
    assert_eq!(get(a, "/v1/inferlets").json()["data"], json!([]));
}

#[test]
fn bad_uploads_and_runs_are_the_callers_errors() {
    let _s = serial();
    let s = server::start(Default::default(), server::small_engine());
    let a = s.addr;
    let wasm_type = [("Content-Type", "application/wasm")];
    // Not a component.
    let e = raw(
        a,
        "POST",
        "/v1/inferlets?name=x",
        &wasm_type,
        b"\0asm not really",
    )
    .error(400);
    assert_eq!(e["code"], "inferlet_invalid", "{e}");
    // A core module, not a component.
    let module = b"\0asm\x01\0\0\0";
    let e = raw(a, "POST", "/v1/inferlets?name=x", &wasm_type, module).error(400);
    assert_eq!(e["code"], "inferlet_invalid", "{e}");
    // No name, a bad name, an empty body.
    let e = raw(a, "POST", "/v1/inferlets", &wasm_type, module).error(400);
    assert_eq!(e["param"], "name");
    let e = raw(a, "POST", "/v1/inferlets?name=..%2Fetc", &wasm_type, module).error(400);
    assert_eq!(e["param"], "name");
    raw(a, "POST", "/v1/inferlets?name=x", &wasm_type, b"").error(400);
    // JSON is not an upload.
    client::request(a, "POST", "/v1/inferlets?name=x", &[], b"{}").error(415);
    // Running what is not there, or with a body that is not JSON.
    run(a, "nothing", json!({})).error(404);
    assert_eq!(get(a, "/v1/inferlets").json()["data"], json!([]));
    assert_eq!(get(a, "/health").status, 200);
}
