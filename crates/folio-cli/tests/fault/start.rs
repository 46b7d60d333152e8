//! Settings the machine cannot honour are refused at start, with the flag named.

use std::process::Command;

#[test]
fn a_kv_memory_larger_than_the_machine_is_a_clear_error_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_folio"))
        .args(["serve", "--port", "0", "--kv-memory", "1000000GiB"])
        .env("FOLIO_MODEL", crate::server::model())
        .output()
        .expect("run folio serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--kv-pages (or --kv-memory)"), "{err}");
    assert!(err.contains("GiB available"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("serving"),
        "it never said it was ready"
    );
}
