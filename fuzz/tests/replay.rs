//! The corpus replay that CI runs: every committed input of every target
//! (`fuzz/corpus/<target>/`), through the same function the fuzzer runs. A panic here
//! is a regression of something fuzzing found (or a new find).

use std::path::PathBuf;

fn corpus(name: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(name: &str) {
    let target = folio_fuzz::target(name).expect("a target");
    let files = corpus(name);
    assert!(!files.is_empty(), "the {name} corpus is empty");
    (target.warm_up)();
    for f in &files {
        let data = std::fs::read(f).expect("reading a corpus file");
        eprintln!("{name}: {}", f.display());
        (target.run)(&data);
    }
    eprintln!("{name}: {} inputs replayed", files.len());
}

#[test]
fn gguf_corpus_replays_without_a_panic() {
    replay("gguf");
}

#[test]
fn tokenizer_corpus_replays_without_a_panic() {
    replay("tokenizer");
}

#[test]
fn template_corpus_replays_without_a_panic() {
    replay("template");
}

#[test]
fn snapshot_corpus_replays_without_a_panic() {
    replay("snapshot");
}

#[test]
fn http_corpus_replays_without_a_panic() {
    replay("http");
}
