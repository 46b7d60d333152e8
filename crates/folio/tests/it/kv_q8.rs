//! 8-bit K/V (`--kv-dtype q8_0`, issue 39): the paged pool equals the contiguous cache
//! of the same dtype bit for bit, shares no prefix with another dtype's chain, holds at
//! least 1.9x the sequences of f16 in the same bytes, and its snapshots restore, while
//! a snapshot of another dtype is refused with a typed error. (Batch, chunking and
//! thread invariance: `batch.rs`' `…_over_q8_kv` tests; distance from the exact model:
//! `fidelity_f64_long.rs`.)

use crate::common::{self, ModelExt};
use folio::kv::{KvDtype, KvSeq, Logits, PagedKv, SnapshotError};
use folio::model::Model;

fn tiny() -> (tempfile::TempDir, Model) {
    common::tiny_model(11, 2)
}

fn prompt(m: &Model, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 5) % m.config.vocab as u32)
        .collect()
}

#[test]
fn q8_kv_pages_equal_the_q8_basic_cache_and_differ_from_f16() {
    let (_d, m) = tiny();
    let toks = prompt(&m, 70);
    let mut basic = m.new_cache_as(KvDtype::Q8, 128);
    let want = m.run(&mut basic, &toks, Logits::All).unwrap();
    assert!(want.iter().all(|x| x.is_finite()));
    for ps in [1, 3, 16] {
        let mut kv = m.new_paged_as(KvDtype::Q8, 256, ps, 512);
        let mut t = kv.new_table(None);
        let got = m.run(&mut kv.seq(&mut t), &toks, Logits::All).unwrap();
        assert_eq!(got, want, "page size {ps}");
        // A second sequence finds the first one's pages in the same pool.
        let mut t2 = kv.new_table(None);
        assert_eq!(kv.seq(&mut t2).reuse_prefix(&toks), (69 / ps) * ps);
    }
    let mut f16 = m.new_cache(128);
    let half = m.run(&mut f16, &toks, Logits::All).unwrap();
    assert_ne!(half, want, "8-bit storage must not read like f16");
    // The dtype is in the prefix chain: a q8 pool's pages never match an f16 pool's
    // hashes, so a table of one never attaches the other's (each pool is its own chain).
    let kv8 = m.new_paged_as(KvDtype::Q8, 8, 16, 512);
    let kv16 = m.new_paged(8, 16, 512);
    assert_ne!(
        kv8.new_table(None).tail_hash(),
        kv16.new_table(None).tail_hash(),
        "the chain roots of q8 and f16 pools"
    );
}

#[test]
fn q8_kv_holds_at_least_1_9x_the_sequences_per_gib_of_f16() {
    let m = Model::load(&common::model_path(), 1).expect("load the default model");
    let gib = 1u64 << 30;
    // Sequences of 4096 tokens in pages of 16, as `--kv-memory 1GiB` sizes the pool.
    let per_gib = |dtype| {
        let shape = m.pool_shape(0, 16, dtype);
        (shape.pages_in(gib) * 16 / 4096, shape.page_bytes())
    };
    let ((s16, b16), (s8, b8)) = (per_gib(KvDtype::F16), per_gib(KvDtype::Q8));
    let c = &m.config;
    // The page's real size: every layer's K and V, one byte per value and two per
    // head row's scale.
    assert_eq!(b8, c.n_layers * 2 * 16 * (c.kv_dim() + 2 * c.n_kv_heads));
    assert_eq!(b16, c.n_layers * 2 * 16 * 2 * c.kv_dim());
    let ratio = s8 as f64 / s16 as f64;
    println!(
        "sequences of 4096 tokens per GiB: f16 {s16}, q8_0 {s8} ({ratio:.3}x); bytes per token f16 {}, q8_0 {}",
        b16 / 16,
        b8 / 16
    );
    assert!(
        ratio >= 1.9,
        "q8_0 holds {s8} sequences per GiB against f16's {s16}: {ratio:.3}x < 1.9x"
    );
}

#[test]
fn q8_snapshots_restore_and_a_file_of_another_dtype_is_refused() {
    let (_d, m) = tiny();
    let toks = prompt(&m, 45);
    let dir = tempfile::tempdir().unwrap();
    let pool = |dtype| PagedKv::with_shape(m.pool_shape(12, 8, dtype), 512, &m.fingerprint());
    let mut kv = pool(KvDtype::Q8);
    kv.open_snapshot_dir(dir.path()).unwrap();
    let mut t = kv.new_table(None);
    m.run(&mut kv.seq(&mut t), &toks[..40], Logits::Last)
        .unwrap();
    kv.save("q8-agent", &mut t).unwrap();
    kv.release(t).unwrap();
    let mut basic = m.new_cache_as(KvDtype::Q8, 64);
    let want = m.run(&mut basic, &toks, Logits::Last).unwrap();
    // A restart with the same dtype: the snapshot continues to the same bits.
    let mut kv2 = pool(KvDtype::Q8);
    let (names, skipped) = kv2.open_snapshot_dir(dir.path()).unwrap();
    assert_eq!((names, skipped.len()), (vec!["q8-agent".to_string()], 0));
    let mut s = kv2.load("q8-agent").unwrap();
    let got = m
        .run(&mut kv2.seq(&mut s), &toks[40..], Logits::Last)
        .unwrap();
    assert_eq!(got, want);
    // An f16 pool (and an f32 one) refuses the 8-bit file by name of both dtypes.
    for other in [KvDtype::F16, KvDtype::F32] {
        let mut kv3 = pool(other);
        let (names, skipped) = kv3.open_snapshot_dir(dir.path()).unwrap();
        assert!(names.is_empty(), "{other}: {names:?}");
        assert!(
            matches!(&skipped[..], [SnapshotError::WrongDtype { file: KvDtype::Q8, pool, .. }] if *pool == other),
            "{other}: {skipped:?}"
        );
        assert!(skipped[0].to_string().contains("q8_0"), "{}", skipped[0]);
    }
    // And an 8-bit pool refuses an f16 file.
    let dir16 = tempfile::tempdir().unwrap();
    let mut kv16 = pool(KvDtype::F16);
    kv16.open_snapshot_dir(dir16.path()).unwrap();
    let mut t = kv16.new_table(None);
    m.run(&mut kv16.seq(&mut t), &toks[..20], Logits::Last)
        .unwrap();
    kv16.save("f16-agent", &mut t).unwrap();
    let mut kv4 = pool(KvDtype::Q8);
    let (names, skipped) = kv4.open_snapshot_dir(dir16.path()).unwrap();
    assert!(names.is_empty());
    assert!(
        matches!(
            &skipped[..],
            [SnapshotError::WrongDtype {
                file: KvDtype::F16,
                pool: KvDtype::Q8,
                ..
            }]
        ),
        "{skipped:?}"
    );
}

/// The engine's fingerprint (the server's `system_fingerprint`) names the K/V type when
/// it is not f16: 8-bit K/V gives other answers (the hostile probe of 2026-12-07 found
/// both under one fingerprint). f16's is the model's, as before; f32's differs too.
#[test]
fn the_engines_fingerprint_changes_with_the_kv_type() {
    use folio::engine::{Engine, EngineConfig};
    let fp = |kv_dtype| {
        let (_d, m) = tiny();
        let cfg = EngineConfig {
            kv_pages: 64,
            kv_dtype,
            ..Default::default()
        };
        Engine::new(m, cfg).unwrap().fingerprint()
    };
    let (_d, m) = tiny();
    let (f16, q8, f32) = (fp(KvDtype::F16), fp(KvDtype::Q8), fp(KvDtype::F32));
    assert_eq!(f16, m.fingerprint(), "f16's is the model's");
    assert_ne!(q8, f16);
    assert_ne!(f32, f16);
    assert_ne!(q8, f32);
}

/// A save under a name whose file another pool made (here an f16 pool's, shared with
/// an 8-bit one, which neither lists nor loads it) is refused and the file kept: the
/// hostile probe of 2026-12-08 saw the 8-bit server replace the f16 snapshot unseen.
/// A name that holds no snapshot file, or a file that is no snapshot, is saved over.
#[test]
fn a_save_never_replaces_another_pools_snapshot_file() {
    let (_d, m) = tiny();
    let toks = prompt(&m, 20);
    let dir = tempfile::tempdir().unwrap();
    let pool = |dtype| PagedKv::with_shape(m.pool_shape(12, 8, dtype), 512, &m.fingerprint());
    let saved = |kv: &mut PagedKv, name: &str| {
        let mut t = kv.new_table(None);
        m.run(&mut kv.seq(&mut t), &toks, Logits::Last).unwrap();
        let r = kv.save(name, &mut t);
        kv.release(t).unwrap();
        r
    };
    let mut f16 = pool(KvDtype::F16);
    f16.open_snapshot_dir(dir.path()).unwrap();
    saved(&mut f16, "shared").unwrap();
    let file = dir.path().join("shared.snap");
    let before = std::fs::read(&file).unwrap();
    let mut q8 = pool(KvDtype::Q8);
    q8.open_snapshot_dir(dir.path()).unwrap();
    let err = saved(&mut q8, "shared").unwrap_err();
    assert!(
        matches!(&err, SnapshotError::TakenByAnother { name, .. } if name == "shared"),
        "{err}"
    );
    assert_eq!(err.kind(), folio::ErrorKind::Invalid);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the f16 file was replaced"
    );
    assert!(q8.snapshot_names().is_empty());
    // Other names are the 8-bit pool's to use, a file that is no snapshot included.
    std::fs::write(dir.path().join("junk.snap"), b"not a snapshot").unwrap();
    saved(&mut q8, "junk").unwrap();
    saved(&mut q8, "mine").unwrap();
    saved(&mut q8, "mine").unwrap();
    assert_eq!(q8.snapshot_names(), ["junk", "mine"]);
    // The f16 pool still restores its own.
    let (names, _) = pool(KvDtype::F16).open_snapshot_dir(dir.path()).unwrap();
    assert_eq!(names, ["shared"]);
}
