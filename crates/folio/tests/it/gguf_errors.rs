//! Truncated, bit-flipped, size-lying and foreign GGUF files, and paths that are not
//! files at all: every one gives a typed error (or, for a harmless flip, a model), never
//! a panic, an absurd allocation or a wait.

use folio::error::{FileKind, GgufError};
use folio::gguf::{GgmlType, Gguf, GgufWriter, Value};
use folio::model::Model;
use folio::ModelError;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn open(bytes: &[u8]) -> Result<Gguf, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    Gguf::open(&write(dir.path(), "f.gguf", bytes))
}

/// Loads a model from bytes without letting a panic escape unnoticed.
fn load(bytes: &[u8]) -> Result<(), ModelError> {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "m.gguf", bytes);
    catch_unwind(AssertUnwindSafe(|| Model::load(&p, 1).map(|_| ())))
        .unwrap_or_else(|_| panic!("Model::load panicked"))
}

#[test]
fn every_truncation_is_an_error() {
    let full = folio::tiny::model_bytes(3, GgmlType::Q4_1);
    assert!(load(&full).is_ok());
    let mut cuts: Vec<usize> = (0..6000.min(full.len())).collect();
    cuts.extend((6000..full.len()).step_by(997));
    cuts.push(full.len() - 1);
    for n in cuts {
        match open(&full[..n]) {
            Err(GgufError::Truncated { .. }) | Err(GgufError::BadMagic(_)) => {}
            Err(e) => panic!("cut at {n}: unexpected error {e}"),
            Ok(_) => panic!("cut at {n}: a truncated file parsed"),
        }
    }
}

#[test]
fn bit_flips_never_panic() {
    let full = folio::tiny::model_bytes(4, GgmlType::Q4_1);
    let header_end = 6000.min(full.len());
    let mut errors = 0;
    for i in 0..header_end {
        let mut b = full.clone();
        b[i] ^= 1 << (i % 8);
        errors += usize::from(load(&b).is_err());
    }
    // Flips inside tensor data change weights, not structure: still a model.
    for i in (header_end..full.len()).step_by(4099) {
        let mut b = full.clone();
        b[i] ^= 0xFF;
        let _ = load(&b);
    }
    assert!(errors > 0, "no flip was caught at all");
}

/// A file with one string metadata entry, then patched.
fn one_key() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.meta("general.name", Value::String("x".into()));
    w.to_bytes()
}

#[test]
fn lying_sizes_are_caught_before_allocating() {
    // Key length (at byte 24) claims 2^62 bytes.
    let mut b = one_key();
    b[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(
        matches!(open(&b), Err(GgufError::TooLarge { .. })),
        "{:?}",
        open(&b).err()
    );

    // Tensor count (bytes 8..16) claims 2^40 tensors.
    let mut b = one_key();
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(open(&b), Err(GgufError::TooLarge { .. })));

    // An array that claims more elements than the file has bytes.
    let mut w = GgufWriter::new();
    w.meta("a", Value::Array(vec![Value::U32(1), Value::U32(2)]));
    let mut b = w.to_bytes();
    // header 24 + key (8 + 1) + type 4 + element type 4 = 41: the count follows.
    b[41..49].copy_from_slice(&(1u64 << 20).to_le_bytes());
    assert!(
        matches!(open(&b), Err(GgufError::Truncated { .. })),
        "{:?}",
        open(&b).err()
    );

    // A tensor whose data would run past the end of the file.
    let mut w = GgufWriter::new();
    w.tensor("t", &[32, 2], GgmlType::F32, vec![0; 256]);
    let good = w.to_bytes();
    assert!(open(&good).is_ok());
    let mut b = good.clone();
    let dims_at = 24 + 8 + 1 + 4; // header, name, n_dims
    b[dims_at + 8..dims_at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(
        matches!(open(&b), Err(GgufError::Truncated { .. })),
        "{:?}",
        open(&b).err()
    );

    // Dimensions whose product overflows u64.
    let mut b = good.clone();
    b[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 33).to_le_bytes());
    b[dims_at + 8..dims_at + 16].copy_from_slice(&(1u64 << 33).to_le_bytes());
    assert!(
        matches!(open(&b), Err(GgufError::BadTensor { .. })),
        "{:?}",
        open(&b).err()
    );

    // Too many dimensions.
    let mut b = good.clone();
    b[dims_at - 4..dims_at].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(open(&b), Err(GgufError::BadTensor { .. })));

    // Unknown tensor type id, and an unaligned data offset.
    let ty_at = dims_at + 16;
    let mut b = good.clone();
    b[ty_at..ty_at + 4].copy_from_slice(&77u32.to_le_bytes());
    assert!(matches!(
        open(&b),
        Err(GgufError::UnknownTensorType { ty: 77, .. })
    ));
    let mut b = good;
    b[ty_at + 4..ty_at + 12].copy_from_slice(&3u64.to_le_bytes());
    assert!(matches!(open(&b), Err(GgufError::BadTensor { .. })));
}

#[test]
fn foreign_and_malformed_headers_are_named() {
    assert!(matches!(
        open(b"GGML\x03\0\0\0"),
        Err(GgufError::BadMagic(_))
    ));
    let mut b = one_key();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(open(&b), Err(GgufError::UnsupportedVersion(1))));
    let mut b = one_key();
    b[44..48].copy_from_slice(&99u32.to_le_bytes()); // value type: after 24 + 8 + "general.name"
    assert!(
        matches!(open(&b), Err(GgufError::BadValueType { ty: 99, .. })),
        "{:?}",
        open(&b).err()
    );
    let mut w = GgufWriter::new();
    w.meta("k", Value::String("\u{e9}".into()));
    let mut b = w.to_bytes();
    let at = b.windows(2).position(|w| w == [0xC3, 0xA9]).unwrap();
    b[at + 1] = 0xFF; // break the UTF-8 of the value
    assert!(
        matches!(open(&b), Err(GgufError::BadUtf8(_))),
        "{:?}",
        open(&b).err()
    );
    let mut w = GgufWriter::new();
    w.meta("k", Value::U8(1)).meta("k", Value::U8(2));
    assert!(matches!(
        open(&w.to_bytes()),
        Err(GgufError::Duplicate { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Gguf::open(&dir.path().join("missing.gguf")),
        Err(GgufError::Io { .. })
    ));
}

#[test]
fn models_folio_cannot_run_are_refused_by_name() {
    let good = folio::tiny::model_bytes(5, GgmlType::Q4_1);
    let g = open(&good).unwrap();
    let rebuild = |edit: &dyn Fn(&str, &Value) -> Option<Value>, drop_tensor: Option<&str>| {
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            w.meta(k, edit(k, v).unwrap_or_else(|| v.clone()));
        }
        for t in g.tensors() {
            if Some(t.name.as_str()) != drop_tensor {
                w.tensor(&t.name, &t.dims, t.ty, g.tensor_bytes(t).to_vec());
            }
        }
        w.to_bytes()
    };
    let arch = rebuild(
        &|k, _| (k == "general.architecture").then(|| Value::String("mamba".into())),
        None,
    );
    assert!(
        matches!(load(&arch), Err(ModelError::UnsupportedArchitecture { arch, .. }) if arch == "mamba")
    );
    let missing = rebuild(&|_, _| None, Some("blk.1.ffn_down.weight"));
    assert!(
        matches!(load(&missing), Err(ModelError::MissingTensor(t)) if t == "blk.1.ffn_down.weight")
    );
    let heads = rebuild(
        &|k, _| (k == "llama.attention.head_count").then_some(Value::U32(3)),
        None,
    );
    assert!(matches!(load(&heads), Err(ModelError::BadMetadata { .. })));
    let wide = rebuild(
        &|k, _| (k == "llama.embedding_length").then_some(Value::U32(128)),
        None,
    );
    assert!(matches!(load(&wide), Err(ModelError::BadShape { .. })));
    let tok = rebuild(
        &|k, _| (k == "tokenizer.ggml.model").then(|| Value::String("rwkv".into())),
        None,
    );
    assert!(matches!(load(&tok), Err(ModelError::Tokenizer(_))));
    // A weight type folio reads but cannot compute with.
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.meta(k, v.clone());
    }
    for t in g.tensors() {
        if t.name == "blk.0.ffn_up.weight" {
            let (_, bb) = GgmlType::Q5_K.block_layout();
            let n = t.num_elements() / 256 * bb;
            w.tensor(
                &t.name,
                &[256, t.dims[1] / 4],
                GgmlType::Q5_K,
                vec![0; n as usize],
            );
        } else {
            w.tensor(&t.name, &t.dims, t.ty, g.tensor_bytes(t).to_vec());
        }
    }
    let r = load(&w.to_bytes());
    assert!(
        matches!(
            r,
            Err(ModelError::BadShape { .. }) | Err(ModelError::UnsupportedType { .. })
        ),
        "{r:?}"
    );
}

/// `Gguf::open(path)` on another thread; a test failure, not a hung test, if it has not
/// returned within 10 s. Returns the kind of a `NotAFile` error (or panics on any other
/// outcome) and how long the open took.
fn not_a_file_kind(path: &Path) -> (FileKind, Duration) {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(Gguf::open(&p).map(|_| ()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("opening {} blocked", path.display()));
    match r {
        Err(GgufError::NotAFile { path: p, kind }) => {
            assert_eq!(p, path.display().to_string());
            (kind, start.elapsed())
        }
        other => panic!("{}: expected NotAFile, got {other:?}", path.display()),
    }
}

#[test]
fn a_directory_is_refused_as_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (kind, _) = not_a_file_kind(dir.path());
    assert_eq!(kind, FileKind::Directory);
    let e = Gguf::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("is a directory, not a regular file"), "{e}");
    // Through the model loader too.
    assert!(matches!(
        Model::load(dir.path(), 1),
        Err(ModelError::Gguf(GgufError::NotAFile {
            kind: FileKind::Directory,
            ..
        }))
    ));
}

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_at_once_without_waiting_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let (kind, took) = not_a_file_kind(&fifo);
    assert_eq!(kind, FileKind::Fifo);
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let e = Gguf::open(&fifo).err().unwrap().to_string();
    assert!(e.contains("is a FIFO/named pipe"), "{e}");
}

#[cfg(unix)]
#[test]
fn dev_zero_is_refused_as_a_device() {
    let (kind, took) = not_a_file_kind(Path::new("/dev/zero"));
    assert_eq!(kind, FileKind::Device);
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[cfg(unix)]
#[test]
fn symlinks_are_followed_to_what_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "real.gguf", &one_key());
    let link = dir.path().join("link.gguf");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert!(Gguf::open(&link).is_ok());
    let to_dir: PathBuf = dir.path().join("to_dir.gguf");
    std::os::unix::fs::symlink(dir.path(), &to_dir).unwrap();
    assert_eq!(not_a_file_kind(&to_dir).0, FileKind::Directory);
}

/// The model's fingerprint, hashed a piece at a time with each piece's pages released
/// after (so load never holds the whole file), is the one-shot xxh3 of the whole file
/// (the identity snapshots and prefix hashes were made with).
#[test]
fn the_fingerprint_read_in_pieces_is_the_whole_files_hash() {
    let g = folio::gguf::Gguf::open(&crate::common::model_path()).unwrap();
    assert!(
        g.bytes().len() > 8 << 20,
        "the default model spans several pieces"
    );
    let whole = xxhash_rust::xxh3::xxh3_128(g.bytes()).to_le_bytes();
    assert_eq!(g.fingerprint(), whole);
    // The bytes read back the same after their pages were released.
    assert_eq!(xxhash_rust::xxh3::xxh3_128(g.bytes()).to_le_bytes(), whole);
}
