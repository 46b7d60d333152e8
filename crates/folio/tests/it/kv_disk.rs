//! The disk tier (`--kv-disk`, issue 39) on a tiny random model: pages written behind
//! are read back after a restart and when the pool evicted them, with the same bits a
//! cold run gives; damaged, cut-short, foreign and unfinished files are skipped and
//! removed, never served; the disk stays under its size; a directory serves one pool.

use folio::engine::{Completion, Engine, EngineConfig, EngineError, Prompt, Request};
use folio::gguf::GgmlType;
use folio::kv::{DiskConfig, DiskError, KvDtype};
use folio::model::{Model, SamplingParams};
use std::path::{Path, PathBuf};

const PAGE: usize = 4;

fn model(dir: &Path) -> Model {
    let path = dir.join("tiny.gguf");
    if !path.exists() {
        folio::tiny::write_model(&path, 5, GgmlType::Q4_1).unwrap();
    }
    Model::load(&path, 1).unwrap()
}

fn config(pages: usize, disk: Option<(&Path, u64)>, dtype: KvDtype) -> EngineConfig {
    EngineConfig {
        kv_pages: pages,
        page_size: PAGE,
        max_batch_tokens: 64,
        kv_dtype: dtype,
        kv_disk: disk.map(|(d, max_bytes)| DiskConfig {
            dir: d.to_path_buf(),
            max_bytes,
        }),
        ..Default::default()
    }
}

fn engine(dir: &Path, pages: usize, disk: Option<(&Path, u64)>) -> Engine {
    Engine::new(model(dir), config(pages, disk, KvDtype::F16)).unwrap()
}

/// A prompt of `n` tokens, different for each `seed`.
fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 31 + seed * 97) % 250 + 1)
        .collect()
}

fn run(e: &Engine, tokens: Vec<u32>) -> Completion {
    let mut r = Request::new(Prompt::Tokens(tokens));
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.logprobs = Some(3);
    r.sampling = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let mut out = e.submit(r).unwrap().collect_all().unwrap();
    out.remove(0)
}

/// The output's tokens and every log-probability's bits.
fn bits(c: &Completion) -> (Vec<u32>, Vec<u32>) {
    let lp = c
        .logprobs
        .iter()
        .flat_map(|l| std::iter::once(l.logprob).chain(l.top.iter().map(|t| t.1)))
        .map(f32::to_bits)
        .collect();
    (c.ids.clone(), lp)
}

fn page_files(disk: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(disk).unwrap().flatten() {
        if sub.path().is_dir() {
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                if f.path().extension().is_some_and(|x| x == "page") {
                    out.push(f.path());
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_restarted_engine_reads_its_prefix_back_from_disk_with_a_cold_runs_bits() {
    for dtype in [KvDtype::F16, KvDtype::Q8] {
        restart_reads_back(dtype);
    }
}

fn restart_reads_back(dtype: KvDtype) {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let p = prompt(1, 203);
    let new = |disk: Option<(&Path, u64)>| {
        Engine::new(model(dir.path()), config(256, disk, dtype)).unwrap()
    };
    let cold = run(&new(None), p.clone());
    let first = {
        let e = new(Some((&disk, 1 << 30)));
        let c = run(&e, p.clone());
        e.flush_kv_disk().unwrap();
        c
    };
    assert_eq!(bits(&first), bits(&cold), "{dtype}");
    let full_pages = (p.len() + 12 - 1) / PAGE;
    assert!(
        page_files(&disk).len() >= full_pages,
        "{dtype}: every committed page is written behind: {} files",
        page_files(&disk).len()
    );
    // A new engine on the same directory: the prompt's pages come from disk.
    let e = new(Some((&disk, 1 << 30)));
    let again = run(&e, p.clone());
    let st = e.stats().unwrap().disk.expect("the disk tier is on");
    assert_eq!(
        again.usage.cached_tokens,
        (p.len() - 1) / PAGE * PAGE,
        "{dtype}: every whole page short of the last token is read back: {st:?}"
    );
    assert_eq!(st.hits as usize, (p.len() - 1) / PAGE);
    assert_eq!(st.skipped, 0);
    assert_eq!(
        bits(&again),
        bits(&cold),
        "{dtype}: the same bits as the cold run"
    );
    e.check_invariants().unwrap();
}

#[test]
fn a_pool_too_small_for_the_working_set_reads_evicted_pages_back() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let (a, b) = (prompt(2, 120), prompt(3, 120));
    let cold = engine(dir.path(), 256, None);
    let (want_a, want_b) = (run(&cold, a.clone()), run(&cold, b.clone()));
    // 40 pages of 4: one prompt (and its output) at a time; b evicts a's pages.
    let e = engine(dir.path(), 40, Some((&disk, 1 << 30)));
    for round in 0..3 {
        assert_eq!(bits(&run(&e, a.clone())), bits(&want_a), "round {round}: a");
        e.flush_kv_disk().unwrap();
        assert_eq!(bits(&run(&e, b.clone())), bits(&want_b), "round {round}: b");
        e.flush_kv_disk().unwrap();
    }
    let st = e.stats().unwrap();
    let d = st.disk.clone().unwrap();
    assert!(st.evictions > 0, "the pool evicted pages: {st:?}");
    assert!(
        d.hits >= 4 * 29,
        "later rounds read the prompts back: {d:?}"
    );
    e.check_invariants().unwrap();
}

/// The files of the pool directory `pool` in chain order from the root (the header
/// holds the pool root at bytes 8..24, the page hash at 24..40, the parent at 40..56).
fn chain(pool: &Path) -> Vec<PathBuf> {
    let field = |b: &[u8], at: usize| b[at..at + 16].to_vec();
    let files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(pool)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .filter(|f| f.extension().is_some_and(|x| x == "page"))
        .map(|f| (f.clone(), std::fs::read(&f).unwrap()))
        .collect();
    let mut out = Vec::new();
    let mut parent = field(&files[0].1, 8);
    while let Some((f, b)) = files.iter().find(|(_, b)| field(b, 40) == parent) {
        out.push(f.clone());
        parent = field(b, 24);
    }
    out
}

#[test]
fn damaged_cut_short_foreign_and_unfinished_files_are_skipped_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let p = prompt(4, 83);
    let cold = run(&engine(dir.path(), 256, None), p.clone());
    for dtype in [KvDtype::F16, KvDtype::Q8] {
        let cfg = config(256, Some((&disk, 1 << 30)), dtype);
        let e = Engine::new(model(dir.path()), cfg).unwrap();
        run(&e, p.clone());
    } // each dropped: its queued writes finish
      // One directory per pool; 8-bit pages are the smaller files.
    let mut pools: Vec<PathBuf> = std::fs::read_dir(&disk)
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .filter(|d| d.is_dir())
        .collect();
    assert_eq!(pools.len(), 2, "one directory per pool");
    pools.sort_by_key(|d| std::fs::metadata(&chain(d)[0]).unwrap().len());
    let (q8, f16) = (chain(&pools[0]), chain(&pools[1]));
    assert!(f16.len() >= 20, "the prompt's 20 pages and the output's");
    // Damage along f16's chain: a flipped K/V byte in page 3, page 6 cut short, a q8
    // page under page 8's name, and a leftover temporary file.
    let good = std::fs::read(&f16[3]).unwrap();
    let mut flipped = good.clone();
    let at = flipped.len() - 100;
    flipped[at] ^= 0x40;
    std::fs::write(&f16[3], flipped).unwrap();
    let cut = std::fs::read(&f16[6]).unwrap();
    std::fs::write(&f16[6], &cut[..cut.len() / 2]).unwrap();
    std::fs::copy(&q8[8], &f16[8]).unwrap();
    let tmp = pools[1].join(".unfinished.1.0.tmp");
    std::fs::write(&tmp, b"half a page").unwrap();
    let e = engine(dir.path(), 256, Some((&disk, 1 << 30)));
    assert!(!tmp.exists(), "an unfinished write is removed at start");
    assert!(
        !f16[6].exists() && !f16[8].exists(),
        "unusable files are removed at start"
    );
    let again = run(&e, p.clone());
    let st = e.stats().unwrap().disk.unwrap();
    assert_eq!(
        again.usage.cached_tokens,
        3 * PAGE,
        "the pages before the damaged one are read back: {st:?}"
    );
    assert_eq!(
        st.skipped, 3,
        "two files skipped at start, and the flipped byte caught on read: {st:?}"
    );
    assert_eq!(bits(&again), bits(&cold), "the same bits as the cold run");
    // The page computed afresh is written behind again, whole: the bytes it had.
    e.flush_kv_disk().unwrap();
    assert!(
        std::fs::read(&f16[3]).unwrap() == good,
        "page 3 rewritten as it was"
    );
    e.check_invariants().unwrap();
}

/// The one pool's directory under the tier's `disk`.
fn pool_dir(disk: &Path) -> PathBuf {
    std::fs::read_dir(disk)
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .find(|d| d.is_dir())
        .expect("the pool's directory")
}

/// Makes a FIFO at `path` (coreutils' `mkfifo`).
fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

/// `f()` on a thread: its value, or a failure naming `what` if it takes longer than a
/// minute (a FIFO's open waits for a writer for ever: this test must fail, not hang).
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not finish within a minute"))
}

/// A FIFO (or a directory) named as a page, found at start or put in a page's place
/// after it, is skipped: the start does not wait on it (the hostile probe of
/// 2026-12-07 found the start blocked for ever in a FIFO's open, and SIGTERM unheard),
/// and a prompt whose page it took is served from the pages before it and computed
/// from there, with the cold run's bits; the one met on reading is removed then.
#[test]
fn fifos_and_directories_named_as_pages_are_skipped_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let p = prompt(6, 83);
    let cold = run(&engine(dir.path(), 256, None), p.clone());
    run(&engine(dir.path(), 256, Some((&disk, 1 << 30))), p.clone());
    let pool = pool_dir(&disk);
    let pages = chain(&pool);
    assert!(pages.len() >= 20, "the prompt's pages");
    // At start: a FIFO in page 5's place, and a FIFO and a directory under other names.
    std::fs::remove_file(&pages[5]).unwrap();
    mkfifo(&pages[5]);
    mkfifo(&pool.join(format!("{:032x}.page", 7)));
    std::fs::create_dir(pool.join(format!("{:032x}.page", 9))).unwrap();
    let root = dir.path().to_path_buf();
    let d = disk.clone();
    let e = within_a_minute("the start", move || engine(&root, 256, Some((&d, 1 << 30))));
    assert!(
        !pages[5].exists(),
        "a FIFO in a page's place is removed at start"
    );
    let st = e.stats().unwrap().disk.unwrap();
    assert_eq!(st.skipped, 3, "the FIFOs and the directory: {st:?}");
    // After start: a FIFO in page 3's place, which the index still lists.
    std::fs::remove_file(&pages[3]).unwrap();
    mkfifo(&pages[3]);
    let e2 = e.clone();
    let again = within_a_minute("the prompt", move || run(&e2, p));
    assert_eq!(
        again.usage.cached_tokens,
        3 * PAGE,
        "the pages before the FIFO met on reading are read back"
    );
    e.flush_kv_disk().unwrap();
    let page3 = std::fs::symlink_metadata(&pages[3]).unwrap();
    assert!(
        page3.file_type().is_file(),
        "the FIFO was removed, and page 3 written behind again"
    );
    assert_eq!(bits(&again), bits(&cold), "the same bits as the cold run");
    e.check_invariants().unwrap();
}

/// Links and FIFOs planted in the tier's directory under the names it writes (the
/// hostile probe of 2026-12-08): a link named `lock` is not followed and a FIFO
/// named so does not block the start (each a clear error naming it); a link under a
/// page's temporary name does not have the page written through it (before, a file
/// outside the directory was overwritten), and a FIFO there does not block the writer
/// (before, the flush and the engine's drop waited for ever). Those writes fail,
/// counted, and what sat under the names is removed.
#[test]
fn planted_links_and_fifos_neither_redirect_nor_block_the_tier() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "ORIGINAL\n").unwrap();
    // The lock: a link (to the victim) and a FIFO.
    for (name, plant) in [("link", true), ("fifo", false)] {
        // The pool's directory and its lock, made by a first start.
        let disk = dir.path().join(name);
        drop(engine(dir.path(), 64, Some((&disk, 1 << 30))));
        let lock = pool_dir(&disk).join("lock");
        std::fs::remove_file(&lock).unwrap();
        match plant {
            true => std::os::unix::fs::symlink(&victim, &lock).unwrap(),
            false => mkfifo(&lock),
        }
        let (root, d) = (dir.path().to_path_buf(), disk.clone());
        let started = within_a_minute("the start", move || {
            Engine::new(model(&root), config(64, Some((&d, 1 << 30)), KvDtype::F16)).err()
        });
        match started {
            Some(EngineError::Disk(e)) => assert!(e.to_string().contains("lock"), "{e}"),
            other => panic!("a {name} named lock: {other:?}"),
        }
    }
    // The pages' temporary names: run once to learn the pages' hashes, then plant a
    // link (even pages) or a FIFO (odd) under every name this process would write
    // them to, and run again on an empty directory.
    let disk = dir.path().join("kv");
    let p = prompt(8, 83);
    let e = engine(dir.path(), 256, Some((&disk, 1 << 30)));
    run(&e, p.clone());
    e.flush_kv_disk().unwrap();
    let written = e.stats().unwrap().disk.unwrap().writes;
    drop(e);
    let pages = page_files(&disk);
    assert!(pages.len() >= 20, "the prompt's pages");
    let pool = pages[0].parent().unwrap().to_path_buf();
    let planted = pages.len() as u64 * written;
    for page in &pages {
        std::fs::remove_file(page).unwrap();
    }
    // Planted after the start (which removes unfinished temporary files).
    let plant = {
        let victim = victim.clone();
        move || {
            for (i, page) in pages.iter().enumerate() {
                let hash = page.file_stem().unwrap().to_str().unwrap();
                for seq in 0..written {
                    let name = format!(".{hash}.{}.{seq}.tmp", std::process::id());
                    let tmp = page.with_file_name(name);
                    match i % 2 {
                        0 => std::os::unix::fs::symlink(&victim, &tmp).unwrap(),
                        _ => mkfifo(&tmp),
                    }
                }
            }
        }
    };
    let (root, d) = (dir.path().to_path_buf(), disk.clone());
    let st = within_a_minute("the run, its flush and the engine's drop", move || {
        let e = engine(&root, 256, Some((&d, 1 << 30)));
        plant();
        run(&e, p);
        e.flush_kv_disk().unwrap();
        e.stats().unwrap().disk.unwrap()
    });
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "ORIGINAL\n");
    assert_eq!(st.writes, 0, "{st:?}");
    assert_eq!(st.write_errors, written, "{st:?}");
    // Each failed write removed what sat under its name; the names no write took stay.
    let left = std::fs::read_dir(pool)
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".tmp"))
        .count() as u64;
    assert_eq!(left, planted - written, "planted names left");
}

/// A page file forged with a NaN in its K/V and a checksum made to match (the
/// checksum is no authentication; the hostile probe of 2026-12-08 made every request
/// of a batch fail so): it is skipped and removed when read back, and the prompt is
/// served from the pages before it and computed from there, with the cold run's bits.
#[test]
fn a_forged_page_holding_a_nan_is_skipped_however_its_checksum_reads() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let p = prompt(9, 83);
    let cold = run(&engine(dir.path(), 256, None), p.clone());
    run(&engine(dir.path(), 256, Some((&disk, 1 << 30))), p.clone());
    let pool = pool_dir(&disk);
    let pages = chain(&pool);
    // Page 4's first K value a NaN (f16), and the checksum over the rest rewritten.
    let mut file = std::fs::read(&pages[4]).unwrap();
    let (kv, end) = (72 + 4 * PAGE, file.len() - 8);
    file[kv..kv + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&file[..end]);
    file[end..].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(&pages[4], &file).unwrap();
    let e = engine(dir.path(), 256, Some((&disk, 1 << 30)));
    let again = run(&e, p);
    assert_eq!(again.usage.cached_tokens, 4 * PAGE, "the pages before it");
    assert_eq!(bits(&again), bits(&cold), "the same bits as the cold run");
    assert_eq!(e.stats().unwrap().disk.unwrap().skipped, 1);
    e.check_invariants().unwrap();
}

#[test]
fn the_disk_stays_under_its_size_evicting_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let e = engine(dir.path(), 256, Some((&disk, u64::MAX)));
    run(&e, prompt(5, 41));
    e.flush_kv_disk().unwrap();
    let one = e.stats().unwrap().disk.unwrap();
    let page_file = one.bytes / one.pages as u64;
    drop(e);
    std::fs::remove_dir_all(&disk).unwrap();
    let max = 30 * page_file + page_file / 2;
    let e = engine(dir.path(), 256, Some((&disk, max)));
    let keep = prompt(6, 41);
    for seed in 7..20 {
        run(&e, keep.clone());
        run(&e, prompt(seed, 41));
        e.flush_kv_disk().unwrap();
        let st = e.stats().unwrap().disk.unwrap();
        assert!(st.bytes <= max, "{st:?}");
        let on_disk: u64 = page_files(&disk)
            .iter()
            .map(|f| std::fs::metadata(f).unwrap().len())
            .sum();
        assert_eq!(on_disk, st.bytes, "the files are what the index counts");
    }
    drop(e);
    // The prompt used every round is still there after a restart (most recently used),
    // read back from its first page.
    let e = engine(dir.path(), 256, Some((&disk, max)));
    let c = run(&e, keep.clone());
    assert_eq!(c.usage.cached_tokens, 40);
}

#[test]
fn a_directory_in_use_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let _first = engine(dir.path(), 64, Some((&disk, 1 << 30)));
    let second = Engine::new(
        model(dir.path()),
        config(64, Some((&disk, 1 << 30)), KvDtype::F16),
    );
    match second {
        Err(EngineError::Disk(DiskError::Locked(_))) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("two pools on one directory"),
    }
}

#[test]
fn a_prompt_waits_for_its_disk_prefix_to_be_read_beside_others_steps() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("kv");
    let p = prompt(8, 203);
    let cold = run(&engine(dir.path(), 256, None), p.clone());
    {
        let e = engine(dir.path(), 256, Some((&disk, 1 << 30)));
        run(&e, p.clone());
    }
    let e = engine(dir.path(), 256, Some((&disk, 1 << 30)));
    // A long generation keeps the engine stepping while the prompt's pages are read.
    let mut long = Request::new(Prompt::Tokens(prompt(9, 20)));
    long.max_tokens = 1500;
    long.ignore_eos = true;
    let busy = e.submit(long).unwrap();
    let mut pieces = busy.into_iter();
    pieces.next().expect("the long generation started");
    let got = run(&e, p.clone());
    let st = e.stats().unwrap();
    let d = st.disk.clone().unwrap();
    assert!(st.running >= 1, "the long generation still runs: {st:?}");
    assert_eq!(bits(&got), bits(&cold), "the same bits as the cold run");
    assert_eq!(got.usage.cached_tokens, (p.len() - 1) / PAGE * PAGE);
    assert_eq!(
        d.prefetched as usize,
        (p.len() - 1) / PAGE,
        "the prompt's pages were read ahead while the other ran: {d:?}"
    );
    drop(pieces);
    e.check_invariants().unwrap();
}
