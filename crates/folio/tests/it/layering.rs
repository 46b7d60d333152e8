//! The layers' one-way imports, checked on the source tree: engine → model → kv →
//! kernels → gguf (tokenizer beside model, grammar on the tokenizer). A file that
//! imports a layer above its own fails here with its path and line; no module reaches
//! back up to the crate root's facade (`lib.rs` re-exports, it is not imported from);
//! `folio-cli` reaches the library only through its public API, never `kernels`, and
//! only its benchmark files drive the pool and the model.

use crate::common::root;
use std::path::Path;

/// Each layer and the modules it must not import.
const RULES: &[(&str, &[&str])] = &[
    ("gguf", &["kernels", "kv", "model", "tokenizer", "engine"]),
    ("kernels", &["kv", "model", "tokenizer", "engine"]),
    ("kv", &["model", "tokenizer", "engine"]),
    ("tokenizer", &["kernels", "kv", "model", "engine"]),
    ("model", &["engine"]),
    ("grammar", &["kernels", "kv", "model", "engine"]),
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines of `file` that name `crate::<module>` (in a `use` or a path).
fn mentions(file: &Path, module: &str) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let needle = format!("crate::{module}");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            l.match_indices(&needle).any(|(i, _)| {
                let after = l[i + needle.len()..].chars().next();
                !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
        .map(|(n, l)| format!("{}:{}: {}", file.display(), n + 1, l.trim()))
        .collect()
}

#[test]
fn lower_layers_never_import_higher_ones() {
    let src = root().join("crates/folio/src");
    let mut bad = Vec::new();
    for (layer, forbidden) in RULES {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "no files under {layer}");
        for f in &files {
            for m in *forbidden {
                bad.extend(mentions(f, m));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against the layering:\n{}",
        bad.join("\n")
    );
}

/// Lines of the Rust files under `dir` that name any of `forbidden`.
fn naming(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&root().join(dir), &mut files);
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .enumerate()
                .filter(|(_, l)| forbidden.iter().any(|x| l.contains(x)))
                .map(|(n, l)| format!("{}:{}: {}", f.display(), n + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Lines of `file` that name an item of the crate root (`crate::` then a capital: the
/// facade's re-exports), outside comments.
fn root_items(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            l.match_indices("crate::").any(|(i, m)| {
                l[i + m.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_uppercase())
            })
        })
        .map(|(n, l)| format!("{}:{}: {}", file.display(), n + 1, l.trim()))
        .collect()
}

/// `lib.rs` only re-exports: a module that imports through it (`crate::ErrorKind`
/// rather than `crate::error::ErrorKind`) points up at whatever the facade gathers.
#[test]
fn no_module_imports_the_crate_roots_facade() {
    let src = root().join("crates/folio/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let bad: Vec<String> = files
        .iter()
        .filter(|f| **f != src.join("lib.rs"))
        .flat_map(|f| root_items(f))
        .collect();
    assert!(
        bad.is_empty(),
        "imports through the crate root:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_cli_uses_only_the_public_facade() {
    let bad = naming(
        "crates/folio-cli/src",
        &["folio::kernels", "folio::internals"],
    );
    assert!(
        bad.is_empty(),
        "the CLI reaches below the facade:\n{}",
        bad.join("\n")
    );
}

/// The CLI's commands go through the engine; only its benchmark files (`bench*.rs`,
/// `figures.rs`) drive the pool and the model themselves, to measure a step without
/// the engine.
#[test]
fn only_the_clis_benchmarks_drive_the_pool_and_the_model() {
    let bench = |p: &Path| {
        let name = p.file_name().unwrap().to_string_lossy();
        name.starts_with("bench") || name == "figures.rs"
    };
    let mut files = Vec::new();
    rust_files(&root().join("crates/folio-cli/src"), &mut files);
    let below = [
        "PagedKv",
        "BasicCache",
        "KvSeq",
        "forward_one",
        ".forward(",
        "Batch",
    ];
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| !bench(f)) {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, l) in text.lines().enumerate() {
            if below.iter().any(|x| l.contains(x)) {
                bad.push(format!("{}:{}: {}", f.display(), n + 1, l.trim()));
            }
        }
    }
    assert!(files.iter().any(|f| bench(f)), "the benchmark files moved");
    assert!(
        bad.is_empty(),
        "a CLI command drives the pool or the model directly:\n{}",
        bad.join("\n")
    );
}

/// The server sits on the engine's handles: no pages, kernels, model internals or
/// file parsing of its own.
#[test]
fn the_server_uses_only_the_engine_facade() {
    let bad = naming(
        "crates/folio-server/src",
        &[
            "folio::kernels",
            "folio::internals",
            "folio::kv",
            "folio::gguf",
            "folio::model::",
            "PagedKv",
            "forward_one",
        ],
    );
    assert!(
        bad.is_empty(),
        "the server reaches below the engine:\n{}",
        bad.join("\n")
    );
}

/// The inferlet host sits on the engine's handles too (contexts, requests, the
/// tokenizer's text calls), and the server names only its public items.
#[test]
fn the_inferlet_host_uses_only_the_engine_facade() {
    let bad = naming(
        "crates/folio-inferlet/src",
        &[
            "folio::kernels",
            "folio::internals",
            "folio::kv",
            "folio::gguf",
            "PagedKv",
            "forward_one",
        ],
    );
    assert!(
        bad.is_empty(),
        "the inferlet host reaches below the engine:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_finds_a_forbidden_import() {
    // The check itself: a file that imports upward is reported.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x.rs");
    std::fs::write(
        &f,
        "use crate::engine::Engine;\n// crate::engine in a comment\nuse crate::engines;\n",
    )
    .unwrap();
    assert_eq!(mentions(&f, "engine").len(), 1);
    std::fs::write(
        &f,
        "use crate::ErrorKind;\n// crate::Engine in a comment\nuse crate::error::ErrorKind;\n",
    )
    .unwrap();
    assert_eq!(root_items(&f).len(), 1);
}

#[test]
fn the_engine_files_import_each_other_without_a_circle() {
    let dir = root().join("crates/folio/src/engine");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let name = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    let names: Vec<String> = files.iter().map(|f| name(f)).collect();
    // Edges: file -> the sibling modules it names as `super::<module>` (mod.rs is the
    // root that declares them all, not a sibling).
    let edges: Vec<(String, String)> = files
        .iter()
        .filter(|f| name(f) != "mod")
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let from = name(f);
            names
                .iter()
                .filter(|m| *m != "mod" && **m != from)
                .filter(|m| {
                    let needle = format!("super::{m}");
                    text.match_indices(&needle).any(|(i, _)| {
                        let after = text[i + needle.len()..].chars().next();
                        !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    })
                })
                .map(|m| (from.clone(), m.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    // Repeatedly remove files that import nothing left: a circle is what remains.
    let mut left: Vec<String> = names.into_iter().filter(|n| n != "mod").collect();
    loop {
        let before = left.len();
        let keep: Vec<String> = left
            .iter()
            .filter(|n| edges.iter().any(|(a, b)| a == *n && left.contains(b)))
            .cloned()
            .collect();
        left = keep;
        if left.len() == before {
            break;
        }
    }
    assert!(
        left.is_empty(),
        "engine files in an import circle: {left:?} ({edges:?})"
    );
}
