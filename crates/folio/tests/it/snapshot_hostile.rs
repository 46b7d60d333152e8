//! Snapshot files against someone who can write the snapshot directory (probe
//! 2026-11-27, F9 and F10): a planted link is never followed by a save, a crafted file
//! that passes the checksum but holds a token outside the vocabulary (or non-finite
//! K/V) is skipped at start, and the quota of bytes and count is kept.

use crate::common::ModelExt;
use folio::kv::{Logits, PagedKv, SnapshotError, SnapshotLimits};
use folio::model::Model;
use std::path::Path;

fn tiny() -> (tempfile::TempDir, Model) {
    crate::common::tiny_model(11, 2)
}

fn prompt(m: &Model, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 7) % (m.config.vocab as u32 - 3))
        .collect()
}

/// A pool on `dir` that knows the model's vocabulary, as the engine makes it.
fn pool(m: &Model, dir: &Path) -> (PagedKv, Vec<String>, Vec<SnapshotError>) {
    let mut kv = m.new_paged(12, 8, 512);
    kv.set_vocab(m.config.vocab);
    let (names, skipped) = kv.open_snapshot_dir(dir).unwrap();
    (kv, names, skipped)
}

/// Saves `n` tokens as `name` in `kv`.
fn save(m: &Model, kv: &mut PagedKv, name: &str, n: usize) {
    let mut t = kv.new_table(None);
    m.run(&mut kv.seq(&mut t), &prompt(m, n), Logits::Last)
        .unwrap();
    kv.save(name, &mut t).unwrap();
    kv.release(t).unwrap();
}

/// `body` with its xxh3-128 checksum recomputed, as a forger would.
fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
    body.truncate(body.len() - 16);
    let sum = xxhash_rust::xxh3::xxh3_128(&body).to_le_bytes();
    body.extend_from_slice(&sum);
    body
}

/// An unsalted snapshot file's header (version 3: magic, version, fingerprint, page
/// size, slot halves, K/V dtype, token count, salt length u32::MAX): where its tokens
/// start.
const HEAD: usize = 8 + 4 + 16 + 4 + 4 + 4 + 8 + 4;

#[test]
fn a_save_never_follows_a_link_planted_at_a_temporary_name() {
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, b"victim data\n").unwrap();
    let (mut kv, _, _) = pool(&m, dir.path());
    // The name earlier versions used, names of the new shape, and the final name.
    let planted = [
        ".s.snap.tmp".to_string(),
        ".s.snap.0000000000000000.tmp".to_string(),
        ".s.snap.ffffffffffffffff.tmp".to_string(),
    ];
    for p in &planted {
        std::os::unix::fs::symlink(&victim, dir.path().join(p)).unwrap();
    }
    for _ in 0..3 {
        save(&m, &mut kv, "s", 20);
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"victim data\n");
    let snap = dir.path().join("s.snap");
    let meta = std::fs::symlink_metadata(&snap).unwrap();
    assert!(meta.file_type().is_file(), "s.snap is a file of its own");
    for p in &planted {
        let link = std::fs::symlink_metadata(dir.path().join(p)).unwrap();
        assert!(link.file_type().is_symlink(), "{p} was left as planted");
    }
    // A restart restores the save and removes the planted links (never their target).
    let (kv2, names, skipped) = pool(&m, dir.path());
    assert_eq!(names, vec!["s".to_string()]);
    assert_eq!(skipped.len(), planted.len(), "{skipped:?}");
    assert!(skipped
        .iter()
        .all(|e| matches!(e, SnapshotError::Interrupted { name, .. } if name == "s")));
    assert_eq!(kv2.snapshot_list(), vec![("s".to_string(), 20)]);
    for p in &planted {
        assert!(std::fs::symlink_metadata(dir.path().join(p)).is_err());
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"victim data\n");
    // And a save whose final name is a planted link replaces the link, not its target.
    std::fs::remove_file(&snap).unwrap();
    std::os::unix::fs::symlink(&victim, &snap).unwrap();
    let (mut kv3, _, _) = pool(&m, dir.path());
    save(&m, &mut kv3, "s", 20);
    assert_eq!(std::fs::read(&victim).unwrap(), b"victim data\n");
    assert!(std::fs::symlink_metadata(&snap)
        .unwrap()
        .file_type()
        .is_file());
    // Nothing but the snapshot is left in the directory.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["s.snap".to_string()]);
}

#[test]
fn a_snapshot_with_a_token_outside_the_vocabulary_or_non_finite_kv_is_skipped_at_start() {
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let (mut kv, _, _) = pool(&m, dir.path());
    save(&m, &mut kv, "good", 20);
    drop(kv);
    let good = std::fs::read(dir.path().join("good.snap")).unwrap();
    let n = 20;
    // The last token replaced by an id far outside the vocabulary, checksum recomputed.
    let mut evil = good.clone();
    let at = HEAD + 4 * (n - 1);
    evil[at..at + 4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    std::fs::write(dir.path().join("evil.snap"), with_checksum(evil)).unwrap();
    // The first token at exactly the vocabulary's size.
    let mut edge = good.clone();
    edge[HEAD..HEAD + 4].copy_from_slice(&(m.config.vocab as u32).to_le_bytes());
    std::fs::write(dir.path().join("edge.snap"), with_checksum(edge)).unwrap();
    // A K/V element of the third token made NaN (f16 0x7e00).
    let mut nan = good.clone();
    let slot = (good.len() - 16 - HEAD - 4 * n) / n;
    let at = HEAD + 4 * n + 2 * slot + 6;
    nan[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    std::fs::write(dir.path().join("nan.snap"), with_checksum(nan)).unwrap();

    let (kv, names, skipped) = pool(&m, dir.path());
    assert_eq!(names, vec!["good".to_string()]);
    let reasons: Vec<String> = skipped
        .iter()
        .map(|e| match e {
            SnapshotError::Corrupt { reason, .. } => reason.clone(),
            other => panic!("expected corrupt, got {other}"),
        })
        .collect();
    let vocab = m.config.vocab;
    assert_eq!(
        reasons,
        vec![
            format!("token {vocab} at position 0 is outside the model's vocabulary of {vocab}"),
            format!(
                "token {} at position {} is outside the model's vocabulary of {vocab}",
                0xFFFF_FFF0u32,
                n - 1
            ),
            "a K/V element of token 2 is not a finite number".to_string(),
        ]
    );
    assert_eq!(kv.snapshot_list(), vec![("good".to_string(), 20)]);
    // Nothing of the skipped files holds a page: only the good snapshot's pages.
    assert_eq!(
        kv.count(folio::kv::PageState::Committed),
        20 / 8,
        "only the good snapshot's full pages are pinned"
    );
}

#[test]
fn saves_past_the_quota_of_bytes_or_count_are_refused_and_write_nothing() {
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let (mut kv, _, _) = pool(&m, dir.path());
    save(&m, &mut kv, "a", 20);
    let one = std::fs::metadata(dir.path().join("a.snap")).unwrap().len();
    assert_eq!(kv.snapshot_bytes(), one);
    // Room for two saves of 20 tokens, at most 3 snapshots.
    kv.set_snapshot_limits(SnapshotLimits {
        max_bytes: 2 * one + one / 2,
        max_count: 3,
    });
    save(&m, &mut kv, "b", 20);
    let files = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let mut t = kv.new_table(None);
    m.run(&mut kv.seq(&mut t), &prompt(&m, 20), Logits::Last)
        .unwrap();
    let err = kv.save("c", &mut t).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::OverBytes { name, bytes, used, limit }
            if name == "c" && *bytes == one && *used == 2 * one && *limit == 2 * one + one / 2),
        "{err}"
    );
    assert_eq!(err.kind(), folio::ErrorKind::Unavailable);
    assert!(err.to_string().contains("--snapshot-max-bytes"), "{err}");
    assert_eq!(files(dir.path()), vec!["a.snap", "b.snap"]);
    // Replacing a snapshot counts only the difference: "a" again fits.
    kv.save("a", &mut t).unwrap();
    assert_eq!(kv.snapshot_bytes(), 2 * one);
    // The count: with bytes to spare, a fourth name is refused, an old name is not.
    kv.set_snapshot_limits(SnapshotLimits {
        max_bytes: 1 << 30,
        max_count: 3,
    });
    kv.save("c", &mut t).unwrap();
    let err = kv.save("d", &mut t).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::TooMany { name, limit: 3 } if name == "d"),
        "{err}"
    );
    assert!(err.to_string().contains("--max-snapshots"), "{err}");
    kv.save("b", &mut t).unwrap();
    assert_eq!(files(dir.path()), vec!["a.snap", "b.snap", "c.snap"]);
    // A delete frees its bytes and its place.
    kv.delete("c").unwrap();
    assert_eq!(kv.snapshot_bytes(), 2 * one);
    kv.save("d", &mut t).unwrap();
    kv.release(t).unwrap();
    drop(kv);
    // Files restored at start count: a quota below them refuses any new name.
    let mut kv2 = m.new_paged(12, 8, 512);
    kv2.set_snapshot_limits(SnapshotLimits {
        max_bytes: 3 * one - 1,
        max_count: 256,
    });
    let (names, _) = kv2.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!(names, vec!["a", "b", "d"]);
    assert_eq!(kv2.snapshot_bytes(), 3 * one);
    let mut t = kv2.new_table(None);
    m.run(&mut kv2.seq(&mut t), &prompt(&m, 20), Logits::Last)
        .unwrap();
    assert!(matches!(
        kv2.save("e", &mut t),
        Err(SnapshotError::OverBytes { .. })
    ));
    assert_eq!(files(dir.path()), vec!["a.snap", "b.snap", "d.snap"]);
    kv2.release(t).unwrap();
}
