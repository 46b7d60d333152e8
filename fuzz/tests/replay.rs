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

/// Found by the snapshot target: a file claiming u32::MAX K/V halves per token made
/// the error message's `2 * halves` overflow (a panic with overflow checks, a wrong
/// figure without). The message now gives the true figure.
#[test]
fn snapshot_with_a_huge_slot_width_is_refused_with_the_true_figure() {
    let mut kv = folio_fuzz::snapshot::pool();
    let mut body = b"FOLIOSNP".to_vec();
    body.extend_from_slice(&1u32.to_le_bytes());
    let mut fp = folio_fuzz::snapshot::FINGERPRINT.to_vec();
    fp.resize(16, 0);
    body.extend_from_slice(&fp);
    body.extend_from_slice(&(kv.page_size() as u32).to_le_bytes());
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(&body).to_le_bytes());
    let dir = folio_fuzz::fixtures::scratch("huge-slot");
    std::fs::write(dir.join("huge.snap"), &body).unwrap();
    let (names, skipped) = kv.open_snapshot_dir(&dir).unwrap();
    assert!(names.is_empty());
    let msg = skipped
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(msg.contains("(8589934590 bytes per token"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}
