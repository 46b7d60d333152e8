//! Coverage-guided fuzz targets for folio's parsers of outside input, and what each
//! does with the bytes it is given. The `folio-fuzz` binary (built by
//! `scripts/fuzz.sh` with cargo-afl) runs one target under AFL++; the replay test
//! (`tests/replay.rs`) runs every target over its committed corpus in `fuzz/corpus/`,
//! so CI replays the corpus with plain `cargo test`.
//!
//! A target panics only on a bug: a panic in folio on bad input, or a property of its
//! own that fails (each says which). Every error folio returns is fine.
//!
//! # Layout
//! - [`gguf`]: a GGUF file: the reader, then the model loader (config, tokenizer,
//!   weights).
//! - [`tokenizer`]: encode of arbitrary text, the streaming decoder on arbitrary ids
//!   and on arbitrary bytes.
//! - [`template`]: the chat template renderer: arbitrary template source, and
//!   arbitrary messages (and tools) through the model's template and ChatML.
//! - [`snapshot`]: a KV snapshot file restored from a snapshot directory.
//! - [`http`]: the HTTP request bodies of the generation, context and snapshot routes.
//! - [`fixtures`]: the default model, loaded once per process.

pub mod fixtures;
pub mod gguf;
pub mod http;
pub mod snapshot;
pub mod template;
pub mod tokenizer;

/// A fuzz target: a name (its corpus folder) and what it does with one input.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Loads what the target needs once, before the fuzzer forks its runs.
    pub warm_up: fn(),
}

/// Every target.
pub const TARGETS: [Target; 5] = [
    Target {
        name: "gguf",
        run: gguf::run,
        warm_up: gguf::warm_up,
    },
    Target {
        name: "tokenizer",
        run: tokenizer::run,
        warm_up: tokenizer::warm_up,
    },
    Target {
        name: "template",
        run: template::run,
        warm_up: template::warm_up,
    },
    Target {
        name: "snapshot",
        run: snapshot::run,
        warm_up: snapshot::warm_up,
    },
    Target {
        name: "http",
        run: http::run,
        warm_up: http::warm_up,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
