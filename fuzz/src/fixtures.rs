//! What the targets share, loaded once per process: the default model (its path from
//! `FOLIO_FUZZ_MODEL`, else `models/` at the repository root), its tokenizer and chat
//! template, and a scratch directory of the process's own for files.

use folio::gguf::Gguf;
use folio::tokenizer::{ChatTemplate, Tokenizer};
use folio::Model;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The default model's path.
pub fn model_path() -> PathBuf {
    match std::env::var_os("FOLIO_FUZZ_MODEL") {
        Some(p) => p.into(),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// The default model's tokenizer (without its weights).
pub fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = model_path();
        let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Tokenizer::from_gguf(&g).expect("the default model's tokenizer")
    })
}

/// The default model's chat template.
pub fn template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| {
        tokenizer()
            .chat_template()
            .expect("the default model's template")
    })
}

/// The default model, on one thread.
pub fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let path = model_path();
        Model::load(&path, 1).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// An empty directory for this process and thread, under the system's temp dir
/// (the same one on each call from a thread; emptied each time).
pub fn scratch(what: &str) -> PathBuf {
    let thread = format!("{:?}", std::thread::current().id());
    let digits: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir =
        std::env::temp_dir().join(format!("folio-fuzz-{what}-{}-{digits}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}
