//! The paged cache under the model, against the contiguous oracle: identical logits and
//! greedy tokens at every page size, cold and warm prefix cache; prefix pages shared
//! between prompts; a pool too small is an error, not a crash.

use crate::common::{generate, GenerateParams, ModelExt};
use folio::kv::{KvSeq, Logits, PageTable, PagedKv};
use folio::model::Model;
use folio::{EngineError, KvError};

fn tiny() -> (tempfile::TempDir, Model) {
    crate::common::tiny_model(11, 2)
}

fn prompt(m: &Model, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 5) % m.config.vocab as u32)
        .collect()
}

#[test]
fn paged_logits_equal_the_basic_cache_at_every_page_size() {
    let (_d, m) = tiny();
    let toks = prompt(&m, 70);
    let mut basic = m.new_cache(128);
    let want = m.run(&mut basic, &toks, Logits::All).unwrap();
    for ps in [1, 3, 16, 64] {
        let mut kv = m.new_paged(256, ps, 512);
        let mut t = kv.new_table(None);
        // Whole, then in uneven chunks, then token by token: always the same bits.
        let got = m.run(&mut kv.seq(&mut t), &toks, Logits::All).unwrap();
        assert_eq!(got, want, "page size {ps}, one pass");
        let mut t2 = kv.new_table(None);
        let v = m.config.vocab;
        let mut at = 0;
        for chunk in toks.chunks(ps + 2) {
            let l = m.run(&mut kv.seq(&mut t2), chunk, Logits::All).unwrap();
            assert_eq!(
                l[..],
                want[at * v..(at + chunk.len()) * v],
                "page size {ps}, chunked"
            );
            at += chunk.len();
        }
        // The second table deduplicated its full pages against the first one's.
        assert_eq!(
            t2.pages()[..t2.num_committed()],
            t.pages()[..t.num_committed()]
        );
    }
}

#[test]
fn a_warm_prefix_is_attached_not_recomputed_and_gives_the_same_tokens() {
    let (_d, m) = tiny();
    let params = GenerateParams {
        max_tokens: 10,
        ignore_eos: true,
        ..Default::default()
    };
    let long = prompt(&m, 100);
    let mut basic = m.new_cache(256);
    let want = generate(&m, &mut basic, &long, &params, &mut |_| {}).unwrap();
    for ps in [1, 16, 64] {
        // Room for three sequences of 110 tokens (the tenant one shares nothing).
        let mut kv = m.new_paged(3 * 110usize.div_ceil(ps) + 2, ps, 512);
        let mut a = kv.new_table(None);
        let cold = generate(&m, &mut kv.seq(&mut a), &long, &params, &mut |_| {}).unwrap();
        assert_eq!(cold.ids, want.ids, "page size {ps}, cold");
        assert_eq!(cold.prefix_hit_tokens, 0);
        // Another request, same prompt: every full page of it comes from the index.
        let mut b = kv.new_table(None);
        let warm = generate(&m, &mut kv.seq(&mut b), &long, &params, &mut |_| {}).unwrap();
        assert_eq!(warm.ids, want.ids, "page size {ps}, warm");
        assert_eq!(
            warm.prefix_hit_tokens,
            (long.len() - 1) / ps * ps,
            "page size {ps}"
        );
        assert!(kv.num_shared() > 0 || ps == 64);
        // A tenant with its own salt shares nothing.
        let mut c = kv.new_table(Some(b"tenant-b"));
        let other = generate(&m, &mut kv.seq(&mut c), &long, &params, &mut |_| {}).unwrap();
        assert_eq!(other.prefix_hit_tokens, 0);
        assert_eq!(other.ids, want.ids);
    }
}

#[test]
fn fork_and_truncate_keep_sequences_apart() {
    let (_d, m) = tiny();
    let toks = prompt(&m, 40);
    let mut kv = m.new_paged(64, 16, 512);
    let mut a = kv.new_table(None);
    m.run(&mut kv.seq(&mut a), &toks[..30], Logits::Last)
        .unwrap();
    let mut b = kv.fork(&mut a).unwrap();
    // Continue both differently; each must equal a fresh basic-cache run of its tokens.
    let la = m
        .run(&mut kv.seq(&mut a), &toks[30..], Logits::Last)
        .unwrap();
    kv.seq(&mut b).truncate(20); // crosses into the committed page 16..32: copied, not cut
    let lb = m
        .run(&mut kv.seq(&mut b), &[1, 2, 3], Logits::Last)
        .unwrap();
    let mut basic = m.new_cache(64);
    assert_eq!(la, m.run(&mut basic, &toks, Logits::Last).unwrap());
    let mut basic = m.new_cache(64);
    let mut bt = toks[..20].to_vec();
    bt.extend([1, 2, 3]);
    assert_eq!(lb, m.run(&mut basic, &bt, Logits::Last).unwrap());
    kv.release(a).unwrap();
    kv.release(b).unwrap();
    assert_eq!(kv.count(folio::kv::PageState::Working), 0);
}

#[test]
fn an_exhausted_pool_is_an_error_that_leaves_the_sequence_intact() {
    let (_d, m) = tiny();
    let mut kv = m.new_paged(2, 16, 512);
    let mut t = kv.new_table(None);
    m.run(&mut kv.seq(&mut t), &prompt(&m, 20), Logits::Last)
        .unwrap();
    let err = m
        .run(&mut kv.seq(&mut t), &prompt(&m, 20), Logits::Last)
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Kv(KvError::OutOfPages { .. })),
        "{err}"
    );
    assert_eq!(err.kind(), folio::ErrorKind::Unavailable);
    assert_eq!(kv.seq(&mut t).len(), 20);
    assert_eq!(kv.seq(&mut t).tokens(), prompt(&m, 20));
}

#[test]
fn snapshots_are_pinned_restored_from_disk_and_checked() {
    use folio::kv::{PagedKv, SnapshotError};
    let (_d, m) = tiny();
    let toks = prompt(&m, 45);
    let dir = tempfile::tempdir().unwrap();
    let mut kv = m.new_paged(12, 8, 512);
    assert_eq!(kv.open_snapshot_dir(dir.path()).unwrap().0.len(), 0);
    let mut t = kv.new_table(None);
    m.run(&mut kv.seq(&mut t), &toks[..40], Logits::Last)
        .unwrap();
    kv.save("agent-1", &mut t).unwrap();
    kv.release(t).unwrap();
    // Pressure: other work takes every page it can; the snapshot's pages stay.
    let mut other = kv.new_table(None);
    let _ = m.run(&mut kv.seq(&mut other), &prompt(&m, 90)[45..], Logits::Last);
    kv.release(other).unwrap();
    let continued = |kv: &mut PagedKv| {
        let mut s = kv.load("agent-1").unwrap();
        let l = m
            .run(&mut kv.seq(&mut s), &toks[40..], Logits::Last)
            .unwrap();
        kv.release(s).unwrap();
        l
    };
    let mut basic = m.new_cache(64);
    let want = m.run(&mut basic, &toks, Logits::Last).unwrap();
    assert_eq!(continued(&mut kv), want);

    // A restart: a new pool restores the snapshot from disk, same logits.
    let mut kv2 = m.new_paged(12, 8, 512);
    let (names, skipped) = kv2.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!((names, skipped.len()), (vec!["agent-1".to_string()], 0));
    assert_eq!(continued(&mut kv2), want);

    // Corrupt and foreign files are reported and skipped, never loaded.
    let file = dir.path().join("agent-1.snap");
    let mut bytes = std::fs::read(&file).unwrap();
    std::fs::write(dir.path().join("copy.snap"), &bytes).unwrap();
    bytes[100] ^= 1;
    std::fs::write(dir.path().join("broken.snap"), &bytes).unwrap();
    let mut kv3 = m.new_paged(12, 8, 512);
    let (names, skipped) = kv3.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!(names, vec!["agent-1".to_string(), "copy".to_string()]);
    assert!(
        matches!(&skipped[..], [SnapshotError::Corrupt { reason, .. }] if reason == "checksum mismatch")
    );
    let mut foreign = PagedKv::new(
        12,
        8,
        m.config.n_layers,
        m.config.kv_dim(),
        512,
        b"another model",
    );
    let (names, skipped) = foreign.open_snapshot_dir(dir.path()).unwrap();
    assert!(names.is_empty() && skipped.len() == 3);

    // Names, deletion.
    let mut t = kv.new_table(None);
    assert!(matches!(
        kv.save("../escape", &mut t),
        Err(SnapshotError::BadName(_))
    ));
    kv.delete("agent-1").unwrap();
    assert!(!file.exists());
    assert!(matches!(
        kv.load("agent-1"),
        Err(SnapshotError::NotFound(_))
    ));
    assert!(matches!(
        kv.delete("agent-1"),
        Err(SnapshotError::NotFound(_))
    ));
}

#[test]
fn a_partly_matching_cached_page_gives_its_matching_slots() {
    let (_d, m) = tiny();
    let params = GenerateParams {
        max_tokens: 10,
        ignore_eos: true,
        ..Default::default()
    };
    let a = prompt(&m, 40);
    let mut kv = m.new_paged(32, 16, 512);
    let mut ta = kv.new_table(None);
    generate(&m, &mut kv.seq(&mut ta), &a, &params, &mut |_| {}).unwrap();
    kv.release(ta).unwrap(); // its pages are cached now
                             // Shares 38 tokens with `a`: two whole pages, then 6 slots of the third.
    let mut b = a[..38].to_vec();
    b.extend([3, 1, 4, 1, 5]);
    let mut tb = kv.new_table(None);
    let got = generate(&m, &mut kv.seq(&mut tb), &b, &params, &mut |_| {}).unwrap();
    assert_eq!(got.prefix_hit_tokens, 38);
    assert_eq!(kv.stats().prefix_hit_slots, 6);
    let mut basic = m.new_cache(128);
    let want = generate(&m, &mut basic, &b, &params, &mut |_| {}).unwrap();
    assert_eq!(got.ids, want.ids);
    // And the logits of a step after the copied slots equal the oracle's.
    let l = m.run(&mut kv.seq(&mut tb), &[7], Logits::Last).unwrap();
    assert_eq!(l, m.run(&mut basic, &[7], Logits::Last).unwrap());
}

#[test]
fn f32_kv_pages_equal_the_f32_basic_cache() {
    use folio::kv::KvDtype;
    let (_d, m) = tiny();
    let toks = prompt(&m, 70);
    let mut basic = m.new_cache_as(KvDtype::F32, 128);
    let want = m.run(&mut basic, &toks, Logits::All).unwrap();
    for ps in [1, 16] {
        let mut kv = m.new_paged_as(KvDtype::F32, 256, ps, 512);
        let mut t = kv.new_table(None);
        let got = m.run(&mut kv.seq(&mut t), &toks, Logits::All).unwrap();
        assert_eq!(got, want, "page size {ps}");
        // Pages of the f16 pool are never shared with an f32 pool's chain.
        let mut t2 = kv.new_table(None);
        assert_eq!(kv.seq(&mut t2).reuse_prefix(&toks), (69 / ps) * ps);
    }
    let mut f16 = m.new_cache(128);
    let half = m.run(&mut f16, &toks, Logits::All).unwrap();
    assert_ne!(half, want, "f32 storage must not round like f16");
}

#[test]
fn snapshot_files_that_are_not_regular_or_too_large_are_skipped_unread() {
    use folio::kv::SnapshotError;
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    // A FIFO (reading it would wait for a writer forever), a link to /dev/zero (endless)
    // and a sparse 4 GB file (would be read whole before its checksum failed).
    assert!(std::process::Command::new("mkfifo")
        .arg(p("fifo.snap"))
        .status()
        .unwrap()
        .success());
    std::os::unix::fs::symlink("/dev/zero", p("zero.snap")).unwrap();
    std::fs::File::create(p("sparse.snap"))
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    std::fs::create_dir(p("dir.snap")).unwrap();
    let mut kv = m.new_paged(12, 8, 512);
    let (tx, rx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let r = kv.open_snapshot_dir(&path).map(|(n, s)| (n, s.len()));
        let _ = tx.send((r, kv.count(folio::kv::PageState::Free)));
    });
    let (got, free) = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("opening the snapshot directory must not block or read without bound");
    assert_eq!(got.unwrap(), (Vec::new(), 4), "every odd file skipped");
    assert_eq!(free, 12, "nothing was loaded");
    // And a plain file in place of the directory is refused with a clear error.
    let file = p("plain");
    std::fs::write(&file, b"x").unwrap();
    let mut kv = m.new_paged(12, 8, 512);
    let err = kv.open_snapshot_dir(&file).unwrap_err();
    assert!(matches!(err, SnapshotError::NotADirectory(_)), "{err}");
}

/// A pool with a snapshot directory, a 20-token sequence in it saved as "s", and the
/// bytes of that save.
fn saved_once(m: &Model) -> (tempfile::TempDir, PagedKv, PageTable, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let mut kv = m.new_paged(12, 8, 512);
    kv.open_snapshot_dir(dir.path()).unwrap();
    let mut t = kv.new_table(None);
    m.run(&mut kv.seq(&mut t), &prompt(m, 20), Logits::Last)
        .unwrap();
    kv.save("s", &mut t).unwrap();
    let old = std::fs::read(dir.path().join("s.snap")).unwrap();
    (dir, kv, t, old)
}

#[test]
fn a_save_cut_short_leaves_the_old_file_and_its_temporary_file_is_removed_at_start() {
    use folio::kv::SnapshotError;
    let (_d, m) = tiny();
    let (dir, _kv, _t, old) = saved_once(&m);
    // A newer save killed halfway: its temporary file holds part of a file.
    let tmp = dir.path().join(".s.snap.tmp");
    std::fs::write(&tmp, &old[..old.len() / 2]).unwrap();
    let mut kv2 = m.new_paged(12, 8, 512);
    let (names, skipped) = kv2.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!(names, vec!["s".to_string()]);
    assert!(
        matches!(&skipped[..], [SnapshotError::Interrupted { name, bytes, .. }]
            if name == "s" && *bytes == (old.len() / 2) as u64),
        "{skipped:?}"
    );
    assert!(!tmp.exists());
    assert_eq!(kv2.snapshot_list(), vec![("s".to_string(), 20)]);
    assert_eq!(std::fs::read(dir.path().join("s.snap")).unwrap(), old);
}

#[cfg(target_os = "linux")]
#[test]
fn a_save_onto_a_full_disk_is_no_space_and_keeps_the_old_snapshot() {
    // A save never writes through a link any more (probe F10), so the full disk is a
    // file-size limit: this test runs again in a child process whose writes stop at
    // the old file's size (SIGXFSZ ignored, so a write past it fails with EFBIG).
    const CHILD: &str = "FOLIO_TEST_FSIZE_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("trap '' XFSZ; exec \"$0\" \"$@\"")
            .arg(exe)
            .args([
                "--exact",
                "paged::a_save_onto_a_full_disk_is_no_space_and_keeps_the_old_snapshot",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    use folio::kv::SnapshotError;
    let (_d, m) = tiny();
    let (dir, mut kv, mut t, old) = saved_once(&m);
    m.run(&mut kv.seq(&mut t), &prompt(&m, 30)[20..], Logits::Last)
        .unwrap();
    // From here on no file of this process grows past the old save's size.
    let limit = old.len() + 1;
    let set = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", std::process::id()))
        .arg(format!("--fsize={limit}:{limit}"))
        .status()
        .unwrap();
    assert!(set.success(), "prlimit");
    let err = kv.save("s", &mut t).unwrap_err();
    assert!(matches!(err, SnapshotError::NoSpace { .. }), "{err}");
    assert_eq!(err.kind(), folio::ErrorKind::Unavailable);
    assert!(err.to_string().contains("previous save"), "{err}");
    // The old snapshot stays pinned and on disk; the failed save's file is gone.
    assert_eq!(kv.snapshot_list(), vec![("s".to_string(), 20)]);
    assert_eq!(std::fs::read(dir.path().join("s.snap")).unwrap(), old);
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["s.snap".to_string()]);
    kv.release(t).unwrap();
    let mut kv2 = m.new_paged(12, 8, 512);
    kv2.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!(kv2.snapshot_list(), vec![("s".to_string(), 20)]);
}

/// A salted sequence's snapshot keeps its tenant salt across a restart: the restored
/// pages serve that salt's prompts and no other's (unsalted or another salt), and a
/// load is in that salt's chain. The hostile probe of 2026-12-08 found them restored
/// unsalted: any tenant's prompt hit another's secret prefix. A file of version 2 (no
/// salt field) is still restored, unsalted.
#[test]
fn a_snapshot_keeps_its_tenant_salt_across_a_restart() {
    let (_d, m) = tiny();
    let toks = prompt(&m, 40);
    let dir = tempfile::tempdir().unwrap();
    let mut kv = m.new_paged(12, 8, 512);
    kv.open_snapshot_dir(dir.path()).unwrap();
    let mut t = kv.new_table(Some(b"alice"));
    m.run(&mut kv.seq(&mut t), &toks, Logits::Last).unwrap();
    kv.save("alice-notes", &mut t).unwrap();
    kv.release(t).unwrap();
    let hits = |kv: &PagedKv| {
        let salts: [Option<&[u8]>; 3] = [None, Some(b"bob"), Some(b"alice")];
        salts.map(|s| kv.cached_prefix(s, &toks))
    };
    assert_eq!(hits(&kv), [0, 0, 40]);
    // A salt longer than a file keeps (4096 bytes; the server takes 1024) is refused
    // whole where snapshots are files.
    let long = vec![b'x'; 4097];
    let mut t = kv.new_table(Some(&long));
    m.run(&mut kv.seq(&mut t), &toks[..8], Logits::Last)
        .unwrap();
    let e = kv.save("long-salt", &mut t).unwrap_err();
    assert!(
        matches!(e, folio::kv::SnapshotError::SaltTooLong { bytes: 4097, .. }),
        "{e}"
    );
    assert_eq!(e.kind(), folio::ErrorKind::Invalid);
    kv.release(t).unwrap();
    assert_eq!(kv.snapshot_names(), ["alice-notes"]);
    drop(kv);
    let mut kv2 = m.new_paged(12, 8, 512);
    let (names, skipped) = kv2.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!((names.len(), skipped.len()), (1, 0));
    assert_eq!(hits(&kv2), [0, 0, 40]);
    let s = kv2.load("alice-notes").unwrap();
    assert_eq!(s.salt(), Some(&b"alice"[..]));
    kv2.release(s).unwrap();
    drop(kv2);

    // The same file as version 2 wrote it (no salt field): restored, unsalted.
    let file = dir.path().join("alice-notes.snap");
    let v3 = std::fs::read(&file).unwrap();
    let head = 8 + 4 + 16 + 4 + 4 + 4 + 8;
    let salt_len = u32::from_le_bytes(v3[head..head + 4].try_into().unwrap()) as usize;
    assert_eq!(&v3[head + 4..head + 4 + salt_len], b"alice");
    let mut v2 = v3[..head].to_vec();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    v2.extend_from_slice(&v3[head + 4 + salt_len..v3.len() - 16]);
    let sum = xxhash_rust::xxh3::xxh3_128(&v2).to_le_bytes();
    v2.extend_from_slice(&sum);
    std::fs::write(&file, &v2).unwrap();
    let mut kv3 = m.new_paged(12, 8, 512);
    let (names, skipped) = kv3.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!((names.len(), skipped.len()), (1, 0), "{skipped:?}");
    assert_eq!(hits(&kv3), [40, 0, 0]);
}
