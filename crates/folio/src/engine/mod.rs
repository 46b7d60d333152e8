//! The engine: one model, one KV page pool and a scheduler loop on its own thread,
//! shared by every caller. Callers submit [`Request`]s and read a [`Stream`] of
//! [`Event`]s; programs also drive [`Context`]s (append, flush, generate, fork,
//! truncate, snapshots, raw page operations) that share the pool and batch with the
//! rest of the work.
//!
//! # Layout
//! - `mod.rs`: the public types and [`Engine`]'s handle.
//! - `sched.rs`: the loop's state ([`Core`]) and one scheduling step: continuous
//!   batching, chunked prefill within `max_batch_tokens`, admission by real page need,
//!   eviction then preemption when pages run out.
//! - `seq.rs`: one running sample of a request: tokens, sampler, text and stop strings.
//! - `context.rs`: the [`Context`] API.
//!
//! NOTE: everything that touches the pool runs on the engine thread; handles talk to
//! it over channels, so no lock guards the KV cache.

mod context;
mod sched;
mod seq;

pub use context::{Context, Role};
pub use sched::Core;

use crate::error::{RunError, TokenizerError};
use crate::generate::FinishReason;
use crate::kv::{KvDtype, KvError, SnapshotError};
use crate::model::{Model, SamplingParams};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use thiserror::Error;

/// What the engine reports when a request or call cannot be served.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("the engine has stopped")]
    Closed,
    #[error("{0}")]
    Run(#[from] RunError),
    #[error("{0}")]
    Kv(#[from] KvError),
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("the prompt has {len} tokens; the context window holds {window}")]
    PromptTooLong { len: usize, window: usize },
    #[error("the request needs {needed} KV pages; the pool can give it at most {available}")]
    PoolTooSmall { needed: usize, available: usize },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("the context is busy with a generation")]
    Busy,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Pages in the pool.
    pub kv_pages: usize,
    /// Token slots per page.
    pub page_size: usize,
    /// Most token rows in one forward step (decode tokens plus prefill chunks).
    pub max_batch_tokens: usize,
    /// Where snapshots persist (restored at start).
    pub snapshot_dir: Option<PathBuf>,
    /// Element type of the stored K/V.
    pub kv_dtype: KvDtype,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_pages: 4096,
            page_size: 16,
            max_batch_tokens: 512,
            snapshot_dir: None,
            kv_dtype: KvDtype::F16,
        }
    }
}

/// A prompt: text (tokenized with the model's special-token rules) or token ids.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// One completion request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Stop strings: generation ends before the first one, which is never emitted.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Report each token's log-probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Independent samples of the same prompt; they fork the prompt's pages.
    pub n: usize,
    /// Tenant salt: requests with different salts never share KV pages.
    pub salt: Option<Vec<u8>>,
}

impl Request {
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            n: 1,
            salt: None,
        }
    }
}

/// A token's log-probability and the top alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Token counts of one sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache (or a fork), not computed.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What a request's stream delivers. `index` says which of the `n` samples.
#[derive(Debug, Clone)]
pub enum Event {
    /// A sampled token and the text it made final (may be empty: held back for a stop
    /// string or an incomplete UTF-8 sequence).
    Token {
        index: usize,
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// A sample ended; `text` is what was still held back (empty after a stop).
    Done {
        index: usize,
        text: String,
        finish: FinishReason,
        usage: Usage,
    },
    /// The request failed; nothing more comes.
    Error(String),
}

/// Counters of the pool and the scheduler.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub pages_total: usize,
    pub pages_free: usize,
    pub pages_working: usize,
    pub pages_committed: usize,
    pub pages_cached: usize,
    pub pages_shared: usize,
    pub page_size: usize,
    pub prefix_hit_tokens: u64,
    pub prefilled_tokens: u64,
    pub generated_tokens: u64,
    pub evictions: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub running: usize,
    pub waiting: usize,
    pub requests_done: u64,
}

pub(crate) type Call = Box<dyn FnOnce(&mut Core) + Send>;

pub(crate) enum Cmd {
    Submit {
        id: u64,
        req: Request,
        tx: Sender<Event>,
    },
    Cancel(u64),
    Call(Call),
    Shutdown,
}

/// A handle to the engine thread. Cloning the handle is cheap; the thread stops when
/// [`Engine::shutdown`] is called or the last handle is dropped.
pub struct Engine {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) tx: Sender<Cmd>,
    model: Arc<Model>,
    next_id: AtomicU64,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.tx.send(Cmd::Shutdown);
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

impl Clone for Engine {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl Engine {
    /// Starts the engine thread with a pool of `config.kv_pages` pages. Snapshots in
    /// `config.snapshot_dir` are restored; a corrupt or foreign file is logged and
    /// skipped.
    pub fn new(model: Model, config: EngineConfig) -> Result<Self, EngineError> {
        if config.page_size == 0 || config.kv_pages == 0 || config.max_batch_tokens == 0 {
            return Err(EngineError::Invalid(
                "page size, pages and max batch tokens must be positive".into(),
            ));
        }
        let model = Arc::new(model);
        let mut core = Core::new(model.clone(), &config);
        if let Some(dir) = &config.snapshot_dir {
            let (restored, skipped) = core.kv.open_snapshot_dir(dir)?;
            for e in skipped {
                tracing::warn!("snapshot skipped: {e}");
            }
            if !restored.is_empty() {
                tracing::info!(?restored, "snapshots restored");
            }
        }
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("folio-engine".into())
            .spawn(move || core.run(rx))
            .map_err(|e| EngineError::Invalid(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            shared: Arc::new(Shared {
                tx,
                model,
                next_id: AtomicU64::new(1),
                thread: std::sync::Mutex::new(Some(thread)),
            }),
        })
    }

    /// The model (tokenizer, config) the engine serves.
    pub fn model(&self) -> &Model {
        &self.shared.model
    }

    /// Queues a request; its events arrive on the returned stream. Dropping the stream
    /// cancels the request and frees its pages.
    pub fn submit(&self, req: Request) -> Result<Stream, EngineError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        self.shared
            .tx
            .send(Cmd::Submit { id, req, tx })
            .map_err(|_| EngineError::Closed)?;
        Ok(Stream {
            id,
            rx,
            shared: self.shared.clone(),
            done: false,
        })
    }

    /// Runs `f` on the engine thread between steps and returns its result.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> Result<R, EngineError> {
        let (tx, rx) = channel();
        let call: Call = Box::new(move |core| {
            let _ = tx.send(f(core));
        });
        self.shared
            .tx
            .send(Cmd::Call(call))
            .map_err(|_| EngineError::Closed)?;
        rx.recv().map_err(|_| EngineError::Closed)
    }

    /// The pool's and the scheduler's counters.
    pub fn stats(&self) -> Result<EngineStats, EngineError> {
        self.call(|core| core.stats())
    }

    /// Names of the snapshots held.
    pub fn snapshots(&self) -> Result<Vec<String>, EngineError> {
        self.call(|core| core.kv.snapshot_names())
    }

    /// A new, empty context (optionally salted per tenant).
    pub fn context(&self, salt: Option<Vec<u8>>) -> Result<Context, EngineError> {
        let id = self.call(move |core| core.new_context(salt))?;
        Ok(Context::new(self.clone(), id))
    }

    /// Stops the engine thread once the current step ends. Streams still open end
    /// with an error event.
    pub fn shutdown(&self) {
        let _ = self.shared.tx.send(Cmd::Shutdown);
    }
}

/// The events of one request. Iterate it; dropping it cancels the request.
pub struct Stream {
    id: u64,
    rx: Receiver<Event>,
    shared: Arc<Shared>,
    done: bool,
}

impl Stream {
    /// The request's id (for cancellation from elsewhere).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for every sample to finish and gathers them.
    pub fn collect_all(self) -> Result<Vec<Completion>, EngineError> {
        let mut out: Vec<Completion> = Vec::new();
        for ev in self {
            let index = match &ev {
                Event::Token { index, .. } | Event::Done { index, .. } => *index,
                Event::Error(e) => return Err(EngineError::Invalid(e.clone())),
            };
            while out.len() <= index {
                out.push(Completion::default());
            }
            let c = &mut out[index];
            match ev {
                Event::Token {
                    id, text, logprob, ..
                } => {
                    c.ids.push(id);
                    c.text.push_str(&text);
                    c.logprobs.extend(logprob);
                }
                Event::Done {
                    text,
                    finish,
                    usage,
                    ..
                } => {
                    c.text.push_str(&text);
                    c.finish = Some(finish);
                    c.usage = usage;
                }
                Event::Error(_) => unreachable!("returned above"),
            }
        }
        Ok(out)
    }
}

impl Iterator for Stream {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        match self.rx.recv() {
            Ok(ev) => {
                if matches!(ev, Event::Error(_)) {
                    self.done = true;
                }
                Some(ev)
            }
            Err(_) => {
                self.done = true;
                None
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.shared.tx.send(Cmd::Cancel(self.id));
    }
}

/// One sample gathered by [`Stream::collect_all`].
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    pub logprobs: Vec<TokenLogprob>,
}
