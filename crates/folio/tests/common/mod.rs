//! Shared helpers of the integration tests: where the default model and the fixtures are.
#![allow(dead_code)]

use std::path::PathBuf;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model, fetched by `scripts/setup.sh`. Tests run the real model: a
/// missing file is a failure with instructions, never a skip.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run `scripts/setup.sh` (it fetches the default model)",
        p.display()
    );
    p
}

pub fn fixtures(name: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture file")).expect("fixture JSON")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
