//! The GGUF target: the input is a whole file. It is opened as a GGUF (the reader's
//! header, metadata and tensor-info checks), every tensor's bytes are taken, and then
//! it is loaded as a model (config, tokenizer and weight checks), on one thread.
//! Property: a tensor's bytes are as long as its info says.

use crate::fixtures::scratch;
use folio::gguf::Gguf;
use folio::Model;
use std::path::PathBuf;
use std::sync::OnceLock;

fn file() -> &'static PathBuf {
    static F: OnceLock<PathBuf> = OnceLock::new();
    F.get_or_init(|| scratch("gguf").join("input.gguf"))
}

pub fn warm_up() {
    file();
}

pub fn run(data: &[u8]) {
    let path = file();
    std::fs::write(path, data).expect("writing the input file");
    let Ok(g) = Gguf::open(path) else { return };
    for t in g.tensors() {
        assert_eq!(
            g.tensor_bytes(t).len() as u64,
            t.size,
            "tensor {:?}",
            t.name
        );
    }
    for (k, _) in g.metadata() {
        assert!(g.get(k).is_some(), "metadata key {k:?}");
    }
    drop(g);
    if let Ok(m) = Model::load(path, 1) {
        let _ = m.tokenizer.encode("Hello, world", true);
    }
}
