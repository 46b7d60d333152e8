//! The public handles: [`Engine`] (start, submit, embed, stats, contexts, shutdown),
//! [`Stream`] (a request's events; dropping it cancels), [`Embedding`] (an embedding
//! on its way; dropping it cancels) and [`Context`] (a program's own sequence). Each call travels to the engine thread over a channel and runs there
//! between steps; a handle never touches the pool itself.

use super::context::{ContextInfo, Role};
use super::core::{Call, Cmd, Core};
use super::error::EngineError;
use super::pagemap::PageMap;
use super::pooling::{pool, Pooling};
use super::request::{Completion, EngineConfig, EngineStats, Event, Request};
use super::seq::Sink;
use crate::model::Model;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A handle to the engine thread. Cloning the handle is cheap; the thread stops when
/// [`Engine::shutdown`] is called or the last handle is dropped.
pub struct Engine {
    shared: Arc<Shared>,
}

struct Shared {
    tx: Sender<Cmd>,
    model: Arc<Model>,
    /// The most tokens one sequence holds.
    window: usize,
    next_id: AtomicU64,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// The model's grammar table, built when first asked for (`grammar::lazy`).
    grammars: crate::grammar::LazyGrammars,
    /// The element type of the pool's K/V (part of [`Engine::fingerprint`]).
    kv_dtype: crate::kv::KvDtype,
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
        let core = Core::new(model, &config)?;
        let model = core.model.clone();
        let window = core.sched.window();
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("folio-engine".into())
            .spawn(move || core.run(rx))
            .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            shared: Arc::new(Shared {
                tx,
                model,
                window,
                next_id: AtomicU64::new(1),
                thread: std::sync::Mutex::new(Some(thread)),
                grammars: crate::grammar::LazyGrammars::new(),
                kv_dtype: config.kv_dtype,
            }),
        })
    }

    /// The model (tokenizer, config) the engine serves.
    pub fn model(&self) -> &Model {
        &self.shared.model
    }

    /// The model's grammar table, which every clone of this engine shares: built by
    /// the first [`GrammarTable::get`](crate::grammar::GrammarTable::get), not before
    /// (it is large; see `grammar::lazy`).
    pub fn grammars(&self) -> crate::grammar::GrammarTable<'_> {
        let m = &self.shared.model;
        self.shared.grammars.table(&m.tokenizer, m.config.vocab)
    }

    /// What the answers come from: the model's fingerprint (file, RoPE set, backend)
    /// and, where the K/V is stored in other than f16 (whose answers the model's
    /// fingerprint alone names), its element type. The server's `system_fingerprint`
    /// is made of it, so it changes when the weights, the arithmetic or the stored
    /// K/V behind the answers do.
    pub fn fingerprint(&self) -> [u8; 16] {
        let model = self.shared.model.fingerprint();
        match self.shared.kv_dtype {
            crate::kv::KvDtype::F16 => model,
            other => {
                let all = [&model[..], b"kv:", other.name().as_bytes()].concat();
                xxhash_rust::xxh3::xxh3_128(&all).to_le_bytes()
            }
        }
    }

    /// The most tokens one sequence holds (prompt and generated).
    pub fn window(&self) -> usize {
        self.shared.window
    }

    /// Queues a request; its events arrive on the returned stream. Dropping the stream
    /// cancels the request and frees its pages.
    pub fn submit(&self, req: Request) -> Result<Stream, EngineError> {
        let (tx, rx) = channel();
        let id = self.send_request(req, tx.into())?;
        Ok(Stream {
            id,
            rx,
            shared: self.shared.clone(),
            done: false,
        })
    }

    /// Queues a request whose events go to `sink`, called on the engine thread for
    /// each event in order; it must not block (hand the event to a channel: an async
    /// runtime's unbounded sender, say). When it returns false the request is
    /// cancelled. Returns the request's id for [`Engine::cancel`]. A request refused
    /// up front (a bad parameter, a prompt too long) reports through the sink too.
    pub fn submit_with(
        &self,
        req: Request,
        sink: impl Fn(Event) -> bool + Send + Sync + 'static,
    ) -> Result<u64, EngineError> {
        self.send_request(req, Sink::new(sink))
    }

    fn send_request(&self, req: Request, tx: Sink) -> Result<u64, EngineError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared
            .tx
            .send(Cmd::Submit {
                id,
                req: Box::new(req),
                tx,
            })
            .map_err(|_| EngineError::Closed)?;
        Ok(id)
    }

    /// Queues an embedding of `tokens`: every token's hidden state after the model's
    /// final norm (the LM head's input, HF's `last_hidden_state`), computed by the
    /// scheduler as a sequence like any request's prompt, so it batches with the
    /// other work (chunked, preempted and resumed alike; it never stalls the others).
    /// It attaches no cached prefix (every row's state is wanted) and releases its
    /// pages when done. Refusals come from [`Embedding::wait`]: an empty prompt
    /// ([`EngineError::EmptyPrompt`]), an id outside the vocabulary, a prompt the
    /// window cannot hold ([`EngineError::PromptTooLong`]) or the pool never could
    /// ([`EngineError::TooLargeForPool`]).
    pub fn submit_embedding(&self, tokens: Vec<u32>) -> Result<Embedding, EngineError> {
        let (tx, rx) = channel();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let len = tokens.len();
        let call: Call = Box::new(move |core| core.submit_embed(id, tokens, tx));
        self.shared
            .tx
            .send(Cmd::Call(call))
            .map_err(|_| EngineError::Closed)?;
        Ok(Embedding {
            id,
            rx,
            len,
            dim: self.shared.model.config.dim,
            shared: self.shared.clone(),
        })
    }

    /// Every token's hidden state of `tokens` (see [`Engine::submit_embedding`]),
    /// `hidden size` floats each, in order.
    pub fn embed(&self, tokens: Vec<u32>) -> Result<Vec<Vec<f32>>, EngineError> {
        self.submit_embedding(tokens)?.wait()
    }

    /// The embedding of `tokens` pooled by `how` (see [`super::pooling`]), scaled to
    /// unit length when `normalize`. [`Pooling::Cls`] is refused as
    /// [`Engine::check_pooling`] says.
    pub fn embed_pooled(
        &self,
        tokens: Vec<u32>,
        how: Pooling,
        normalize: bool,
    ) -> Result<Vec<f32>, EngineError> {
        self.check_pooling(&tokens, how)?;
        self.submit_embedding(tokens)?.wait_pooled(how, normalize)
    }

    /// The token the tokenizer puts first (its BOS, which plays CLS), if it puts one.
    pub fn cls_token(&self) -> Option<u32> {
        super::pooling::cls_token(&self.shared.model.tokenizer)
    }

    /// Whether `tokens` can be pooled by `how` (see [`super::pooling::check`]: cls
    /// pooling needs a model with a CLS token and an input that starts with it).
    pub fn check_pooling(&self, tokens: &[u32], how: Pooling) -> Result<(), EngineError> {
        super::pooling::check(self.cls_token(), tokens, how)
    }

    /// Cancels request `id` (from [`Engine::submit_with`] or [`Stream::id`]): its
    /// pages go back before the next step. Cancelling a finished request does nothing.
    pub fn cancel(&self, id: u64) {
        let _ = self.shared.tx.send(Cmd::Cancel(id));
    }

    /// Runs `f` on the engine thread between steps and returns its result.
    fn call<R: Send + 'static>(
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

    /// Names of the snapshots held, and with a snapshot directory, those of the files
    /// there (other processes sharing it save there too), sorted.
    pub fn snapshots(&self) -> Result<Vec<String>, EngineError> {
        Ok(self.snapshot_list()?.into_iter().map(|(n, _)| n).collect())
    }

    /// Each snapshot's name and token count, sorted by name.
    /// With a snapshot directory, the files there that this engine has not restored
    /// yet are listed too (their header's token count; read on this thread): another
    /// process sharing the directory saved them, and a load restores them.
    pub fn snapshot_list(&self) -> Result<Vec<(String, usize)>, EngineError> {
        let (mut held, dir, rejected) = self.call(|core| {
            let dir = core.kv.snapshot_dir_path().map(|d| d.to_path_buf());
            (core.kv.snapshot_list(), dir, core.kv.snapshot_rejected())
        })?;
        if let Some(dir) = dir {
            for (name, n, stamp) in crate::kv::list_snapshot_files(&dir) {
                let bad = rejected.get(&name) == Some(&stamp);
                if !bad && !held.iter().any(|(h, _)| *h == name) {
                    held.push((name, n));
                }
            }
            held.sort();
        }
        Ok(held)
    }

    /// Writes the file of a save pinned on the engine thread ([`Context::save_by`]),
    /// on the caller's thread: the pinned pages' K/V come over in chunks of about
    /// [`crate::kv::SAVE_CHUNK_BYTES`], one short call each (pinned pages are never
    /// written, so every chunk reads what the pin holds); serializing, hashing,
    /// writing and syncing run here. Any error, or a panic here, releases the pin and
    /// leaves an older snapshot of that name as it was.
    fn write_snapshot(&self, ticket: crate::kv::SaveTicket) -> Result<(), EngineError> {
        /// Releases the pin when dropped before the save is recorded.
        struct Pin<'a> {
            engine: &'a Engine,
            id: u64,
            recorded: bool,
        }
        impl Drop for Pin<'_> {
            fn drop(&mut self) {
                if !self.recorded {
                    let id = self.id;
                    let abort: Call = Box::new(move |c| c.kv.abort_save(id));
                    let _ = self.engine.shared.tx.send(Cmd::Call(abort));
                }
            }
        }
        let id = ticket.id();
        let mut pin = Pin {
            engine: self,
            id,
            recorded: false,
        };
        let written = ticket.write(|from, n, out: &mut Vec<u8>| {
            let buf = std::mem::take(out);
            *out = self.call(move |c| {
                let mut buf = buf;
                c.kv.save_chunk(id, from, n, &mut buf).map(|()| buf)
            })??;
            Ok::<_, EngineError>(())
        })?;
        let file = written.file_id();
        written.publish(|| {
            self.call(move |c| c.kv.finish_save(id, file))??;
            pin.recorded = true;
            Ok::<_, EngineError>(())
        })
    }

    /// Checks the page store's invariants (states, reference counts against every
    /// table, free list, eviction order, prefix index) between two steps; a violation
    /// is [`EngineError::Internal`] naming the first page at fault. For tests and the
    /// server's debug route: it walks every page.
    pub fn check_invariants(&self) -> Result<(), EngineError> {
        self.call(|core| core.check_invariants())?
            .map_err(|e| EngineError::Internal(format!("page store invariant broken: {e}")))
    }

    /// A new, empty context (optionally salted per tenant).
    pub fn context(&self, salt: Option<Vec<u8>>) -> Result<Context, EngineError> {
        let id = self.call(move |core| core.contexts.new_context(&core.kv, salt))?;
        Ok(Context::new(self.clone(), id))
    }

    /// The pool page by page: state, references, who holds it (see [`PageMap`]).
    pub fn page_map(&self) -> Result<PageMap, EngineError> {
        self.call(|core| core.page_map())
    }

    /// How many leading tokens of `prompt` the pool holds for a request with `salt`
    /// ([`PagedKv::cached_prefix`](crate::kv::PagedKv::cached_prefix)): what a router
    /// asks a replica before sending it a request.
    pub fn cached_prefix(
        &self,
        prompt: Vec<u32>,
        salt: Option<Vec<u8>>,
    ) -> Result<usize, EngineError> {
        self.call(move |core| core.kv.cached_prefix(salt.as_deref(), &prompt))
    }

    /// [`Engine::cached_prefix`] by tier: (in memory, then on disk only).
    pub fn cached_prefix_tiers(
        &self,
        prompt: Vec<u32>,
        salt: Option<Vec<u8>>,
    ) -> Result<(usize, usize), EngineError> {
        self.call(move |core| core.kv.cached_prefix_tiers(salt.as_deref(), &prompt))
    }

    /// Waits until every page committed so far is on disk (`--kv-disk`; nothing to do
    /// without it): before a planned restart, and in tests.
    pub fn flush_kv_disk(&self) -> Result<(), EngineError> {
        self.call(|core| core.kv.flush_disk())
    }

    /// (free, cached) page counts: after a drain, every page is one or the other.
    pub fn idle_pages(&self) -> Result<(usize, usize), EngineError> {
        self.call(|c| c.page_counts())
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
        let mut prompt_logprobs = Vec::new();
        for ev in self {
            let index = match &ev {
                Event::Token { index, .. } | Event::Done { index, .. } => *index,
                Event::PromptLogprobs(lp) => {
                    prompt_logprobs.clone_from(lp);
                    continue;
                }
                Event::Error(e) => return Err(e.clone()),
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
                Event::Error(_) | Event::PromptLogprobs(_) => unreachable!("handled above"),
            }
        }
        for c in &mut out {
            c.prompt_logprobs.clone_from(&prompt_logprobs);
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

/// An embedding on its way ([`Engine::submit_embedding`]). Dropping it before it is
/// done cancels it and frees its pages.
pub struct Embedding {
    id: u64,
    rx: Receiver<Result<Vec<f32>, EngineError>>,
    /// Tokens, and floats per token's state.
    len: usize,
    dim: usize,
    shared: Arc<Shared>,
}

impl Embedding {
    /// The request's id (for [`Engine::cancel`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Tokens embedded.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no tokens (the embedding then fails as an empty prompt).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the states: one vector of `hidden size` floats per token, in order.
    pub fn wait(self) -> Result<Vec<Vec<f32>>, EngineError> {
        let dim = self.dim;
        let flat = self.wait_flat()?;
        Ok(flat.chunks_exact(dim).map(<[f32]>::to_vec).collect())
    }

    /// Waits for the states and pools them (see [`super::pooling::pool`]).
    pub fn wait_pooled(self, how: Pooling, normalize: bool) -> Result<Vec<f32>, EngineError> {
        let dim = self.dim;
        pool(&self.wait_flat()?, dim, how, normalize)
    }

    /// The states back to back.
    fn wait_flat(&self) -> Result<Vec<f32>, EngineError> {
        let flat = self.rx.recv().map_err(|_| EngineError::Closed)??;
        if flat.len() != self.len * self.dim {
            return Err(EngineError::Internal(format!(
                "an embedding of {} tokens came back with {} values",
                self.len,
                flat.len()
            )));
        }
        Ok(flat)
    }
}

impl Drop for Embedding {
    fn drop(&mut self) {
        // After the answer this finds nothing to cancel.
        let _ = self.shared.tx.send(Cmd::Cancel(self.id));
    }
}

/// A program's sequence in the engine. Dropping it releases its pages (snapshots
/// keep theirs).
pub struct Context {
    engine: Engine,
    id: u64,
}

impl Context {
    pub(crate) fn new(engine: Engine, id: u64) -> Self {
        Self { engine, id }
    }

    /// The context's id (as [`super::Holder::Context`] names it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The engine it lives in.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Appends token ids (computed at the next flush or generate).
    pub fn append_tokens(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let (id, t) = (self.id, tokens.to_vec());
        self.engine.call(move |c| {
            c.contexts.check_window(id, t.len(), c.sched.window())?;
            c.check_context_room(id, t.len(), 0)?;
            c.contexts.append(&c.model, c.sched.window(), id, t)
        })?
    }

    /// Appends text (special-token text becomes the special token; a BOS goes first
    /// when the context is empty and the model wants one).
    ///
    /// The text is tokenized on the caller's thread, not the engine's: a long text
    /// (up to the tokenizer's input cap) would otherwise stall every request's next
    /// step. Whether the BOS goes first is checked again when the tokens are appended
    /// (another caller may have appended meanwhile; then it is tokenized again).
    pub fn append_text(&self, text: &str) -> Result<(), EngineError> {
        let id = self.id;
        loop {
            let empty = self.engine.call(move |c| c.contexts.is_empty(id))??;
            let toks = self.engine.model().tokenizer.try_encode(text, empty)?;
            let appended = self.engine.call(move |c| {
                if c.contexts.is_empty(id)? != empty {
                    return Ok(false);
                }
                c.contexts.check_window(id, toks.len(), c.sched.window())?;
                c.check_context_room(id, toks.len(), 0)?;
                c.contexts
                    .append(&c.model, c.sched.window(), id, toks)
                    .map(|()| true)
            })??;
            if appended {
                return Ok(());
            }
        }
    }

    /// Appends a chat message rendered with the model's template.
    ///
    /// The chat is rendered and tokenized on the caller's thread, not the engine's (a
    /// long message would otherwise stall every request's next step); if another
    /// caller changed the context meanwhile, it is rendered again.
    pub fn message(&self, role: Role, text: &str) -> Result<(), EngineError> {
        let id = self.id;
        loop {
            let was = self.engine.call(move |c| c.contexts.chat(id))??;
            let added = was.add(self.engine.model(), role, text)?;
            let done = self.engine.call(move |c| {
                c.contexts.check_window(id, added.len(), c.sched.window())?;
                c.check_context_room(id, added.len(), 0)?;
                c.contexts
                    .add_message(&c.model, c.sched.window(), id, &was, added)
            })??;
            if done {
                return Ok(());
            }
        }
    }

    pub fn system(&self, text: &str) -> Result<(), EngineError> {
        self.message(Role::System, text)
    }

    pub fn user(&self, text: &str) -> Result<(), EngineError> {
        self.message(Role::User, text)
    }

    pub fn assistant(&self, text: &str) -> Result<(), EngineError> {
        self.message(Role::Assistant, text)
    }

    /// Computes every pending token (their full pages are committed and shareable).
    pub fn flush(&self) -> Result<(), EngineError> {
        self.flush_by(None)
    }

    /// [`Context::flush`] within a time limit: `deadline` is when to give up, and the
    /// limit it reports. Past it the answer is [`EngineError::TimedOut`] (also when the
    /// flush ended just as time ran out) and the flush is cancelled: the pages it
    /// computed stay the context's, the rest of its tokens are pending again. The
    /// answer comes at the deadline, unless the engine is busy with a step when the
    /// flush is queued (then up to one step late).
    pub fn flush_by(&self, deadline: Option<(Instant, Duration)>) -> Result<(), EngineError> {
        let id = self.id;
        let req = self.engine.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.engine.call(move |c| {
            let (rx, job) = c.contexts.flush(&mut c.kv, id, req)?;
            if let Some(j) = job {
                c.push_job(j);
            }
            Ok::<_, EngineError>(rx)
        })??;
        let Some((at, limit)) = deadline else {
            return rx.recv().map_err(|_| EngineError::Closed)?;
        };
        match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
            Ok(done) if Instant::now() < at => done,
            Ok(_) => Err(EngineError::TimedOut { limit }),
            Err(RecvTimeoutError::Timeout) => {
                // Not waited for: the engine takes commands in order, so the cancel is
                // handled (at the end of the step it is in) before any later call,
                // which then finds the context idle.
                self.engine.cancel(req);
                Err(EngineError::TimedOut { limit })
            }
            Err(RecvTimeoutError::Disconnected) => Err(EngineError::Closed),
        }
    }

    /// Generates a continuation of everything the context holds (plus `req.prompt`,
    /// appended first). The tokens stream like a request's, and end up in the context.
    pub fn generate(&self, req: Request) -> Result<Stream, EngineError> {
        self.start(req, false)
    }

    /// Like [`Context::generate`] for a chat: appends the template's generation prompt
    /// first, and records the reply as the assistant's message when it ends.
    pub fn reply(&self, req: Request) -> Result<Stream, EngineError> {
        self.start(req, true)
    }

    /// [`Context::generate`] (or with `chat`, [`Context::reply`]) whose events go to
    /// `sink`, as with [`Engine::submit_with`]; returns the request id for
    /// [`Engine::cancel`].
    pub fn generate_with(
        &self,
        req: Request,
        chat: bool,
        sink: impl Fn(Event) -> bool + Send + Sync + 'static,
    ) -> Result<u64, EngineError> {
        self.start_sink(req, chat, Sink::new(sink))
    }

    fn start(&self, req: Request, chat: bool) -> Result<Stream, EngineError> {
        let (tx, rx) = channel();
        let rid = self.start_sink(req, chat, tx.into())?;
        Ok(Stream {
            id: rid,
            rx,
            shared: self.engine.shared.clone(),
            done: false,
        })
    }

    fn start_sink(&self, req: Request, chat: bool, tx: Sink) -> Result<u64, EngineError> {
        let id = self.id;
        let rid = self
            .engine
            .shared
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.engine.call(move |c| {
            // What the generation may add, its prompt and its tokens, stays within the
            // contexts' share of the pool.
            let mut req = req;
            let prompt = match &req.prompt {
                super::request::Prompt::Tokens(t) => t.len(),
                super::request::Prompt::Text(_) => 0,
            };
            c.contexts.check_window(id, prompt, c.sched.window())?;
            req.max_tokens = req.max_tokens.min(c.context_room_tokens(id, prompt)?);
            let (kv, model, window) = (&mut c.kv, &c.model, c.sched.window());
            let job = c
                .contexts
                .generate(kv, model, window, id, rid, req, chat, tx)?;
            c.push_job(job);
            Ok::<_, EngineError>(())
        })??;
        Ok(rid)
    }

    /// A new context with the same tokens: committed pages shared, the partial page
    /// copied.
    pub fn fork(&self) -> Result<Context, EngineError> {
        let id = self.id;
        let new = self.engine.call(move |c| {
            c.check_context_room(id, 0, 1)?;
            c.contexts.fork(&mut c.kv, id)
        })??;
        Ok(Context::new(self.engine.clone(), new))
    }

    /// Drops the last `n` tokens (pending ones first). Crossing into a committed page
    /// copies its kept part; the shared page is never changed.
    pub fn truncate(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine
            .call(move |c| c.contexts.truncate(&mut c.kv, id, n))?
    }

    /// Tokens a generation into this context may sample after a prompt of `prompt`
    /// tokens, within the contexts' share of the pool (where a generation stops as
    /// at the window), now; an error where the prompt and one token do not fit. A
    /// caller that must not be cut short (an explicit token limit) checks it first.
    pub fn room(&self, prompt: usize) -> Result<usize, EngineError> {
        let id = self.id;
        self.engine
            .call(move |c| c.context_room_tokens(id, prompt))?
    }

    /// Counters: seq_len, page_size, committed and working pages.
    pub fn info(&self) -> Result<ContextInfo, EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.contexts.info(&c.kv, id))?
    }

    /// Its tenant salt, if it has one (a context loaded from a snapshot has the salt
    /// the snapshot was saved with).
    pub fn salt(&self) -> Result<Option<Vec<u8>>, EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.contexts.salt(id))?
    }

    /// The ids of the pool pages it holds (pages shared with forks and the prefix
    /// cache included: a caller counting a group of contexts' pages counts each id
    /// once).
    pub fn page_ids(&self) -> Result<Vec<u32>, EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.contexts.page_ids(id))?
    }

    /// The tokens held, computed then pending.
    pub fn tokens(&self) -> Result<Vec<u32>, EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.contexts.tokens(&c.kv, id))?
    }

    /// Pins the context's pages under `name` (persisted with a snapshot directory).
    pub fn save(&self, name: &str) -> Result<(), EngineError> {
        self.save_by(name, None)
    }

    /// [`Context::save`] within a time limit (as [`Context::flush_by`]). The name is
    /// checked before any work. Time runs out during the flush: it is cancelled as
    /// there, and nothing is saved: a snapshot of that name stays as it was, in memory
    /// and on disk. The deadline is checked once more on the engine thread just
    /// before the pages are pinned; a write that has begun is finished (it is atomic,
    /// and bounded by the pool's size), so past the flush the answer may come after
    /// the deadline by one engine step and the write.
    ///
    /// The engine thread only pins the pages (a fork of the table) and reserves the
    /// file's size against the quota; the file is serialized, hashed, written and
    /// synced on this thread (see [`Engine::write_snapshot`]), so a save never stalls
    /// other requests. Two saves of one name at once: the one that ends last is the
    /// snapshot, in memory and on disk.
    pub fn save_by(
        &self,
        name: &str,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<(), EngineError> {
        Self::check_name(name)?;
        self.flush_by(deadline)?;
        let (id, name) = (self.id, name.to_string());
        let ticket = self.engine.call(move |c| {
            if let Some((at, limit)) = deadline {
                if Instant::now() >= at {
                    return Err(EngineError::TimedOut { limit });
                }
            }
            c.contexts.save(&mut c.kv, id, &name)
        })??;
        match ticket {
            // No snapshot directory: pinned in memory, nothing to write.
            None => Ok(()),
            Some(t) => self.engine.write_snapshot(t),
        }
    }

    /// Whether `name` can name a snapshot (letters, digits, '-', '_' and '.', 1 to 128
    /// of them, not starting with '.'): a caller checks before work that ends in a save.
    pub fn check_name(name: &str) -> Result<(), EngineError> {
        Ok(crate::kv::check_snapshot_name(name)?)
    }

    /// A new context sharing snapshot `name`'s pages.
    /// With a snapshot directory, a name this engine does not hold is looked for
    /// there: another process sharing the directory may have saved it since this one
    /// started. The file is read on this thread, then checked and restored (as at
    /// start) on the engine's. A name it holds whose file is another than the one it
    /// restored or wrote (another process saved a newer version) is re-read first;
    /// if that file fails its checks, the version held is loaded.
    pub fn load(engine: &Engine, name: &str) -> Result<Context, EngineError> {
        Self::reload_if_replaced(engine, name)?;
        let owned = name.to_string();
        let missing = |e: &EngineError| {
            matches!(
                e,
                EngineError::Snapshot(crate::kv::SnapshotError::NotFound(_))
            )
        };
        let id = match engine.call(move |c| c.contexts.load(&mut c.kv, &owned))? {
            Ok(id) => id,
            Err(e) if missing(&e) => {
                let n = name.to_string();
                let Some((path, limit)) = engine.call(move |c| c.kv.snapshot_file(&n))? else {
                    return Err(e);
                };
                let (bytes, file) = crate::kv::read_snapshot_file_id(&path, limit)?;
                let n = name.to_string();
                engine.call(move |c| {
                    c.kv.restore_snapshot(&path, bytes, Some(file))?;
                    tracing::info!("snapshot {n:?} restored from {}", path.display());
                    c.contexts.load(&mut c.kv, &n)
                })??
            }
            Err(e) => return Err(e),
        };
        Ok(Context::new(engine.clone(), id))
    }

    /// Re-reads held snapshot `name` when its file is no longer the one this engine
    /// restored or wrote: another process sharing the directory saved it since.
    fn reload_if_replaced(engine: &Engine, name: &str) -> Result<(), EngineError> {
        let n = name.to_string();
        let Some((path, limit, held, rejected)) =
            engine.call(move |c| c.kv.held_snapshot_file(&n))?
        else {
            return Ok(());
        };
        let Ok(meta) = std::fs::metadata(&path) else {
            // Deleted elsewhere: the version held stays until it is deleted here.
            return Ok(());
        };
        let now = crate::kv::SnapFileId::of(&meta);
        if held == Some(now)
            || !meta.is_file()
            || rejected == Some((meta.len(), meta.modified().ok()))
        {
            return Ok(());
        }
        let (bytes, file) = match crate::kv::read_snapshot_file_id(&path, limit) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("snapshot {name:?}: its newer file is not loaded: {e}");
                return Ok(());
            }
        };
        let p = path.clone();
        match engine.call(move |c| c.kv.reload_snapshot(&p, bytes, Some(file)))? {
            Ok(()) => tracing::info!(
                "snapshot {name:?} re-read from {}: saved anew since it was loaded",
                path.display()
            ),
            Err(e) => tracing::warn!("snapshot {name:?}: its newer file is not loaded: {e}"),
        }
        Ok(())
    }

    /// Unpins snapshot `name` (and removes its file, off the engine thread, under the
    /// lock a save's rename takes: a save and a delete of one name never interleave).
    pub fn delete(engine: &Engine, name: &str) -> Result<(), EngineError> {
        let name = name.to_string();
        let lock = engine.call(|c| c.kv.snapshot_lock())?;
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = engine.call(move |c| c.kv.unpin(&name))?? {
            crate::kv::remove_snapshot_file(&path)?;
        }
        Ok(())
    }

    /// Raw page operations, for hand-written loops (see the seed's manual pages).
    /// Reserves `n` working pages ahead, so later input does not wait on allocation.
    pub fn reserve_working_pages(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine.call(move |c| {
            c.contexts.raw_reserve(&mut c.kv, id, n)?;
            if let Err(e) = c.check_context_share() {
                c.contexts.raw_release(&mut c.kv, id, n)?;
                return Err(e);
            }
            Ok(())
        })?
    }

    /// Commits the first `k` full working pages (an error if the k-th is partial).
    pub fn commit_working_pages(&self, k: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine
            .call(move |c| c.contexts.raw_commit(&mut c.kv, id, k))?
    }

    /// Releases `n` working pages from the tail (reserved spares first).
    pub fn release_working_pages(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine
            .call(move |c| c.contexts.raw_release(&mut c.kv, id, n))?
    }

    /// Drops the last `n` tokens within the working pages (never a committed one).
    pub fn truncate_working_page_tokens(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine
            .call(move |c| c.contexts.raw_truncate_working(&mut c.kv, id, n))?
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let id = self.id;
        let _ = self.engine.shared.tx.send(Cmd::Call(Box::new(move |c| {
            c.contexts.drop_context(&mut c.kv, id)
        })));
    }
}
