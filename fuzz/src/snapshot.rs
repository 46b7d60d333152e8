//! The snapshot target: the input is a snapshot file less its checksum (the target
//! appends the right one, so the fuzzer explores what lies behind it rather than
//! the checksum), restored into a small pool from a snapshot directory. Every
//! snapshot restored is then loaded as a sequence, read, released and deleted.
//! Property: the pool's invariants hold afterwards ([`folio::kv::PagedKv::check`]).
//!
//! The pool: 8 pages of 4 tokens, one layer, K/V width 2, sequences of up to 16
//! tokens, fingerprint `FINGERPRINT` (seeds are saved by this same pool).

use crate::fixtures::scratch;
use folio::kv::{holders, PagedKv};
use std::path::PathBuf;
use std::sync::OnceLock;

pub const FINGERPRINT: &[u8] = b"folio-fuzz";

/// The pool the target restores into.
pub fn pool() -> PagedKv {
    PagedKv::new(8, 4, 1, 2, 16, FINGERPRINT)
}

fn dir() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| scratch("snapshot"))
}

pub fn warm_up() {
    dir();
}

pub fn run(data: &[u8]) {
    let dir = dir();
    let mut file = data.to_vec();
    file.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(data).to_le_bytes());
    let path = dir.join("fuzz.snap");
    std::fs::write(&path, &file).expect("writing the input file");
    let mut kv = pool();
    let restored = kv.open_snapshot_dir(dir);
    let _ = std::fs::remove_file(&path);
    let Ok((names, _skipped)) = restored else {
        return;
    };
    let h = holders(kv.pinned_tables(), kv.num_pages());
    kv.check(&h).expect("the pool's invariants after a restore");
    for name in names {
        let t = kv.load(&name).expect("a restored snapshot loads");
        let _ = kv.read_tokens(&t).expect("its tokens read back");
        kv.release(t).expect("its sequence releases");
        kv.delete(&name).expect("it deletes");
    }
    let h = holders(kv.pinned_tables(), kv.num_pages());
    kv.check(&h)
        .expect("the pool's invariants after the deletes");
}
