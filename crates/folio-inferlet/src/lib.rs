//! Inferlets: user programs that run inside `folio serve`, next to the KV cache.
//!
//! An inferlet is a WebAssembly component of the `folio:inferlet` world
//! (`wit/folio.wit`): it imports contexts (create, append, flush, fork, truncate,
//! generate, a forward pass's top log-probabilities), the tokenizer and `emit`, and
//! exports `run(input)`. Its loops (best-of-n, search, agents with tools, speculative
//! schemes) then run where the cache lives: no network round trip per step, no
//! re-prefill between turns.
//!
//! It sits above the engine and uses only its public API ([`folio::Engine`],
//! [`folio::Context`], [`folio::Request`]); the server names it, never the reverse.
//!
//! - [`host`]: the wasmtime engine, the linker, compiling ([`Host::compile`]) and
//!   running ([`Host::run`]) under the sandbox's bounds;
//! - [`run`]: one run's store data and the host functions (the guest's contexts are
//!   host resources: a handle the guest does not hold traps);
//! - [`library`]: programs stored by name in a directory, compiled at upload;
//! - [`compiled`]: the process's cache of compiled functions, so the runtime every
//!   Python (or JavaScript) program embeds is compiled once, not once per upload;
//! - [`limits`]: the sandbox's bounds; [`error`]: [`InferletError`].
//!
//! The sandbox: WASI 0.2 with nothing granted (no files, sockets, environment or
//! clock beyond the monotonic one), linear memory bounded per instance, a wall-clock
//! deadline per run enforced by epoch interruption (a spinning guest is stopped within
//! a tick) and at every host call, a cap on contexts per run and on output bytes, at
//! most N runs at once. Whatever ends a run, the store is dropped and with it every
//! context the run held, so their pages return to the pool.

mod bindings;
pub mod compiled;
pub mod error;
pub mod host;
pub mod library;
pub mod limits;
pub mod run;

pub use compiled::FunctionCache;
pub use error::InferletError;
pub use host::{Cancel, Host, Permit, Program, RunReport};
pub use library::Library;
pub use limits::Limits;
pub use run::Chunk;
