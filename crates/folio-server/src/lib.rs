//! `folio serve`: an OpenAI-compatible HTTP server over folio's [`folio::Engine`].
//!
//! It sits on the engine's public facade only: requests go in through
//! `Engine::submit_with`, whose events land on an async channel, and leave as JSON
//! or server-sent events; a dropped client cancels through `Engine::cancel`. The
//! server owns no cache logic: cached-token counts, salts and page figures all come
//! from the engine.
//!
//! This file is the wiring: the module list and the public names. Nothing imports
//! from it; the modules import each other one way (`import_graph.rs` checks that
//! they form no circle). The modules, from the outside in:
//!
//! - `serve` (the lifetime: load off-thread, reaper, drain), [`app`] (router and
//!   layers), `guard` and `allowed` (Host, Origin, Content-Type and size checks
//!   before any route);
//! - routes: `generate` (the two generation routes), `contexts` (create, list, get,
//!   delete), `context_edit` (append, fork, truncate), `context_generate`,
//!   `snapshots`, `kv` (`/v1/kv`, `/v1/kv/check`), `cache_match` (`/v1/cache/match`,
//!   a router's prefix probe), `misc` (the page, health,
//!   models, metrics, tokenize), `inferlets` (upload, list, delete and run user
//!   programs, over `folio_inferlet`; the host and the programs are `inferlet_host`'s);
//! - a request's path: `body` (JSON bodies), `api` (wire request shapes), `params`
//!   (wire request → engine request), `tools`, `tool_call` and `tool_stream` (tool
//!   calls), `deadline` (`--request-timeout`), `run` (one request's events and
//!   cancellation), `tally` (a run's events gathered), `answer` (the answer shapes),
//!   `completion` and `chat` (each route's answer, whole or streamed), `sse`
//!   (streams);
//! - shared: `state` (what every route shares), `registry` (the live contexts),
//!   `config`, `metrics`, `clock`, `offload` (engine calls off the async threads), `error`
//!   (a route's failure), `serve_error` (serve's own);
//! - `fuzzing` (the body checks alone, for the fuzz targets);
//! - [`kv_events`] (`--kv-events`: the prefix index's changes published over ZMQ in
//!   vLLM's format, on a thread of its own beside the server).

mod allowed;
mod answer;
mod api;
pub mod app;
mod body;
mod cache_match;
mod chat;
mod clock;
mod completion;
mod config;
mod context_edit;
mod context_generate;
mod contexts;
mod deadline;
mod embeddings;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod generate;
mod guard;
#[cfg(test)]
mod import_graph;
mod inferlet_host;
mod inferlets;
mod kv;
pub mod kv_events;
mod messages;
mod messages_answer;
mod metrics;
mod misc;
mod offload;
mod params;
mod registry;
mod responses;
mod responses_answer;
mod responses_input;
mod responses_store;
mod run;
mod serve;
mod serve_error;
mod snapshots;
mod sse;
mod state;
mod tally;
mod tool_call;
#[cfg(test)]
mod tool_parity;
mod tool_stream;
mod tools;

pub use config::ServeConfig;
pub use error::ApiError;
pub use serve::serve;
pub use serve_error::{LoadError, ServeError};
