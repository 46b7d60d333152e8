//! One run's state ([`RunState`], the data of its wasmtime store) and the host
//! functions the guest calls: contexts (a resource table of engine
//! [`folio::Context`]s: a guest holds only indices the table checks, so a forged or
//! dropped handle traps, and dropping the table at the run's end drops every context
//! it still holds, returning their pages), generation, the forward pass, the
//! tokenizer and `emit`.
//!
//! Every host call first checks that the run may go on (not cancelled, within its
//! time); a call that waits on the engine (flush, generate) waits no longer than the
//! run's deadline and cancels the engine's work past it.

mod generation;

use crate::bindings::folio::inferlet::{contexts, host, types};
use crate::limits::Limits;
use folio::{EngineError, Prompt, Request, SamplingParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Resource, ResourceTable};
use wasmtime::StoreLimits;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// A chunk a program sends its caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    Text(String),
    Json(serde_json::Value),
}

/// Why a run was stopped by the host (set before the trap that stops it).
#[derive(Debug, Clone)]
pub enum Stop {
    TimedOut,
    Cancelled,
    Quota(String),
}

/// A context the guest holds.
pub struct CtxEntry {
    ctx: folio::Context,
}

/// The receiving end of a run's chunks: false when the caller is gone.
pub type Sink = Box<dyn FnMut(Chunk) -> bool + Send>;

/// A run's store data.
pub struct RunState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: StoreLimits,
    pub(crate) engine: folio::Engine,
    pub(crate) sink: Sink,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
    pub(crate) quota: Limits,
    /// The table indices of the contexts the run holds (for the page quota).
    pub(crate) live: Vec<u32>,
    pub(crate) emitted_bytes: usize,
    pub(crate) host_calls: u64,
    /// The token counts of the run's finished generations, summed.
    pub(crate) usage: folio::Usage,
    pub(crate) stop: Option<Stop>,
}

impl WasiView for RunState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A host call's answer: the outer error traps (stops the run), the inner one is the
/// guest's to handle.
type Answer<T> = wasmtime::Result<Result<T, types::Error>>;

fn err(kind: types::ErrorKind, message: impl Into<String>) -> types::Error {
    types::Error {
        kind,
        message: message.into(),
    }
}

/// An engine error as the guest sees it.
fn guest_error(e: &EngineError) -> types::Error {
    use folio::ErrorKind as K;
    use types::ErrorKind as G;
    let kind = match e.kind() {
        K::Invalid => G::Invalid,
        K::NotFound => G::NotFound,
        K::Busy => G::Busy,
        K::Limit => G::Limit,
        K::Unavailable => G::Unavailable,
        K::Internal => G::Internal,
    };
    err(kind, e.to_string())
}

impl RunState {
    /// Whether the run may go on; otherwise records why and returns the trap.
    fn go_on(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        self.still_wanted()
    }

    /// [`RunState::go_on`]'s check alone, for work inside one host call (a generation's
    /// every event, a job list's every job): the run stops once cancelled or past its
    /// deadline.
    pub(super) fn still_wanted(&mut self) -> wasmtime::Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(self.halt(Stop::Cancelled));
        }
        if Instant::now() >= self.deadline {
            return Err(self.halt(Stop::TimedOut));
        }
        Ok(())
    }

    /// Records why the run stops; the error to trap with.
    pub(crate) fn halt(&mut self, why: Stop) -> wasmtime::Error {
        let msg = match &why {
            Stop::TimedOut => "the run's time limit passed".to_string(),
            Stop::Cancelled => "the run was cancelled".to_string(),
            Stop::Quota(m) => m.clone(),
        };
        self.stop.get_or_insert(why);
        wasmtime::Error::msg(msg)
    }

    /// An engine error, for the guest: the run's own deadline passing in the engine
    /// (a flush cut short) stops the run instead.
    fn engine_answer<T>(&mut self, r: Result<T, EngineError>) -> Answer<T> {
        match r {
            Ok(v) => Ok(Ok(v)),
            Err(EngineError::TimedOut { .. }) => Err(self.halt(Stop::TimedOut)),
            Err(e) => Ok(Err(guest_error(&e))),
        }
    }

    fn entry(&self, r: &Resource<CtxEntry>) -> wasmtime::Result<&CtxEntry> {
        Ok(self.table.get(r)?)
    }

    /// Adds a context to the table within the run's quota.
    fn hold(&mut self, ctx: folio::Context) -> Answer<Resource<CtxEntry>> {
        let r = self.table.push(CtxEntry { ctx })?;
        self.live.push(r.rep());
        self.pages_within_quota()?;
        Ok(Ok(r))
    }

    /// The pool pages the run's contexts hold, each counted once (forks share).
    fn pages_held(&self) -> wasmtime::Result<usize> {
        let mut ids = Vec::new();
        for &rep in &self.live {
            let e: &CtxEntry = self.table.get(&Resource::new_borrow(rep))?;
            // A context busy elsewhere cannot be: the run is sequential.
            ids.extend(e.ctx.page_ids().unwrap_or_default());
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids.len())
    }

    /// After a call that may have taken pages: past the run's page quota, the run
    /// stops (its contexts are dropped with it and their pages return).
    fn pages_within_quota(&mut self) -> wasmtime::Result<()> {
        let held = self.pages_held()?;
        if held > self.quota.pages {
            let m = format!(
                "the run's contexts held {held} pages, over its quota of {}",
                self.quota.pages
            );
            return Err(self.halt(Stop::Quota(m)));
        }
        Ok(())
    }

    /// Tokens a generation may still add before the run's page quota (the pages
    /// left, each filled).
    fn tokens_within_quota(&self, ctx: &Resource<CtxEntry>) -> wasmtime::Result<usize> {
        let left = self.quota.pages.saturating_sub(self.pages_held()?);
        let page = self
            .entry(ctx)?
            .ctx
            .info()
            .map_or(1, |i| i.page_size.max(1));
        Ok(left * page)
    }

    fn no_pages_left(&self) -> types::Error {
        err(
            types::ErrorKind::Limit,
            format!(
                "the run's contexts hold its quota of {} pages; drop or truncate one first",
                self.quota.pages
            ),
        )
    }

    fn room_for_context(&self) -> Result<(), types::Error> {
        if self.live.len() >= self.quota.contexts {
            return Err(err(
                types::ErrorKind::Limit,
                format!(
                    "a run may hold at most {} contexts at once; drop one first",
                    self.quota.contexts
                ),
            ));
        }
        Ok(())
    }

    fn remaining(&self) -> (Instant, Duration) {
        (self.deadline, self.quota.run_time)
    }

    fn send(&mut self, chunk: Chunk, bytes: usize) -> wasmtime::Result<()> {
        self.emitted_bytes = self.emitted_bytes.saturating_add(bytes);
        if self.emitted_bytes > self.quota.output_bytes {
            let m = format!(
                "the run emitted more than {} bytes, its output limit",
                self.quota.output_bytes
            );
            return Err(self.halt(Stop::Quota(m)));
        }
        if !(self.sink)(chunk) {
            self.cancel.store(true, Ordering::Relaxed);
            return Err(self.halt(Stop::Cancelled));
        }
        Ok(())
    }

    /// The engine request of a `generate`.
    fn request(
        &self,
        p: &types::GenParams,
        logprobs: Option<usize>,
    ) -> Result<Request, types::Error> {
        let mut req = Request::new(Prompt::Tokens(Vec::new()));
        req.max_tokens = p.max_tokens.min(self.quota.max_tokens) as usize;
        req.sampling = match &p.sampling {
            None => SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            Some(s) => SamplingParams {
                temperature: s.temperature,
                top_k: s.top_k as usize,
                top_p: s.top_p,
                min_p: s.min_p,
                seed: s.seed,
                ..SamplingParams::default()
            },
        };
        req.stop = p.stop.clone();
        req.logprobs = logprobs.or(p.logprobs.then_some(0));
        if let Some(g) = &p.grammar {
            let spec = match g {
                types::Grammar::JsonSchema(s) => {
                    let v = serde_json::from_str(s).map_err(|e| {
                        err(
                            types::ErrorKind::Invalid,
                            format!("the JSON schema is not JSON: {e}"),
                        )
                    })?;
                    folio::grammar::GrammarSpec::JsonSchema(v)
                }
                types::Grammar::JsonObject => folio::grammar::GrammarSpec::JsonObject,
                types::Grammar::Regex(r) => folio::grammar::GrammarSpec::Regex(r.clone()),
                types::Grammar::Choice(c) => folio::grammar::GrammarSpec::Choice(c.clone()),
            };
            let grammars = self.engine.grammars().get().map_err(|_| {
                err(
                    types::ErrorKind::Invalid,
                    "this model's vocabulary cannot serve grammars",
                )
            })?;
            let g = grammars
                .compile(&spec)
                .map_err(|e| guest_error(&EngineError::from(e)))?;
            req.grammar = Some(g);
        }
        req.validate().map_err(|e| guest_error(&e))?;
        Ok(req)
    }
}

impl RunState {
    /// One forward pass over `tokens` appended to `ctx` (and what was pending): each
    /// appended token's log-probability and top `k`, and the top `k` after the last
    /// (a one-token greedy generation, taken back). The appended tokens stay.
    fn pass(
        &mut self,
        ctx: &Resource<CtxEntry>,
        tokens: Vec<u32>,
        k: u32,
    ) -> Answer<types::Scores> {
        let k = k as usize;
        if k > folio::engine::MAX_LOGPROBS {
            return Ok(Err(err(
                types::ErrorKind::Invalid,
                format!("k is {k}; at most {}", folio::engine::MAX_LOGPROBS),
            )));
        }
        if self.tokens_within_quota(ctx)? <= tokens.len() {
            return Ok(Err(self.no_pages_left()));
        }
        let before = match self.engine_answer(self.entry(ctx)?.ctx.info())? {
            Ok(i) => i.seq_len,
            Err(e) => return Ok(Err(e)),
        };
        let scored = !tokens.is_empty();
        let mut req = Request::new(Prompt::Tokens(tokens));
        req.max_tokens = 1;
        req.ignore_eos = true;
        req.speculative = false;
        req.sampling.temperature = 0.0;
        req.logprobs = Some(k);
        req.prompt_logprobs = scored.then_some(k);
        // A scoring pass is not a generation: the run's usage leaves it out.
        let usage = self.usage;
        let scored_pass = self.generation(ctx, req, false, false);
        self.usage = usage;
        let (_, probs, prompt) = match scored_pass? {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        // The sampled token is taken back: the context ends with the scored tokens.
        let after = match self.engine_answer(self.entry(ctx)?.ctx.info())? {
            Ok(i) => i.seq_len,
            Err(e) => return Ok(Err(e)),
        };
        let added = before + prompt.len();
        if after > added {
            let r = self.entry(ctx)?.ctx.truncate(after - added);
            if let Err(e) = self.engine_answer(r)? {
                return Ok(Err(e));
            }
        }
        let tok = &self.engine.model().tokenizer;
        let top = |list: Vec<(u32, f32)>| -> Vec<types::TokenLogprob> {
            list.into_iter()
                .take(k)
                .map(|(token, logprob)| types::TokenLogprob {
                    token,
                    text: tok.decode(&[token]),
                    logprob,
                })
                .collect()
        };
        let next = probs
            .into_iter()
            .flatten()
            .next()
            .map(|lp| top(lp.top))
            .unwrap_or_default();
        let tokens = prompt
            .into_iter()
            .map(|lp| types::Scored {
                logprob: lp.logprob,
                top: top(lp.top),
            })
            .collect();
        Ok(Ok(types::Scores { tokens, next }))
    }
}

impl types::Host for RunState {}

impl contexts::Host for RunState {
    fn generate_all(
        &mut self,
        jobs: Vec<(Resource<CtxEntry>, types::GenParams)>,
    ) -> wasmtime::Result<Vec<Result<types::Generation, types::Error>>> {
        self.go_on()?;
        let mut answers: Vec<Option<Result<types::Generation, types::Error>>> =
            (0..jobs.len()).map(|_| None).collect();
        // A context named again is busy with its first job: answered so without its
        // request made (a grammar compiled) again, so a long list costs what its
        // distinct contexts do (the 2026-12-08 probe: 10 000 jobs on one context
        // compiled 10 000 grammars, 20 s past a 3 s limit).
        let mut seen = std::collections::HashSet::new();
        let first: Vec<bool> = jobs.iter().map(|(c, _)| seen.insert(c.rep())).collect();
        // The run's page room, shared out among the jobs that run.
        let room = match jobs.first() {
            Some((ctx, _)) => self.tokens_within_quota(ctx)? / seen.len(),
            None => 0,
        };
        let mut ready = Vec::new();
        for (i, (ctx, p)) in jobs.iter().enumerate() {
            self.still_wanted()?;
            self.entry(ctx)?;
            if !first[i] {
                answers[i] = Some(Err(guest_error(&EngineError::Busy)));
                continue;
            }
            match self.request(p, None) {
                Ok(_) if room == 0 => answers[i] = Some(Err(self.no_pages_left())),
                Ok(mut req) => {
                    req.max_tokens = req.max_tokens.min(room);
                    ready.push((i, (ctx, req, p.chat, p.stream)));
                }
                Err(e) => answers[i] = Some(Err(e)),
            }
        }
        let (at, started): (Vec<usize>, Vec<_>) = ready.into_iter().unzip();
        for (i, r) in at.into_iter().zip(self.generations(started)?) {
            answers[i] = Some(r.map(|(g, _, _)| g));
        }
        self.pages_within_quota()?;
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every job answered"))
            .collect())
    }
}

impl contexts::HostContext for RunState {
    fn create(
        &mut self,
        system: Option<String>,
        salt: Option<String>,
    ) -> Answer<Resource<CtxEntry>> {
        self.go_on()?;
        if let Err(e) = self.room_for_context() {
            return Ok(Err(e));
        }
        let made = self
            .engine
            .context(salt.map(String::into_bytes))
            .and_then(|ctx| {
                if let Some(s) = &system {
                    ctx.system(s)?;
                }
                Ok(ctx)
            });
        match self.engine_answer(made)? {
            Ok(ctx) => self.hold(ctx),
            Err(e) => Ok(Err(e)),
        }
    }

    fn append_text(&mut self, me: Resource<CtxEntry>, text: String) -> Answer<()> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.append_text(&text);
        self.engine_answer(r)
    }

    fn append_tokens(&mut self, me: Resource<CtxEntry>, tokens: Vec<u32>) -> Answer<()> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.append_tokens(&tokens);
        self.engine_answer(r)
    }

    fn append_message(
        &mut self,
        me: Resource<CtxEntry>,
        role: types::Role,
        text: String,
    ) -> Answer<()> {
        self.go_on()?;
        let role = match role {
            types::Role::System => folio::Role::System,
            types::Role::User => folio::Role::User,
            types::Role::Assistant => folio::Role::Assistant,
        };
        let r = self.entry(&me)?.ctx.message(role, &text);
        self.engine_answer(r)
    }

    fn flush(&mut self, me: Resource<CtxEntry>) -> Answer<()> {
        self.go_on()?;
        let deadline = self.remaining();
        let r = self.entry(&me)?.ctx.flush_by(Some(deadline));
        let r = self.engine_answer(r)?;
        self.pages_within_quota()?;
        Ok(r)
    }

    fn fork(&mut self, me: Resource<CtxEntry>) -> Answer<Resource<CtxEntry>> {
        self.go_on()?;
        if let Err(e) = self.room_for_context() {
            return Ok(Err(e));
        }
        let r = self.entry(&me)?.ctx.fork();
        match self.engine_answer(r)? {
            Ok(ctx) => self.hold(ctx),
            Err(e) => Ok(Err(e)),
        }
    }

    fn truncate(&mut self, me: Resource<CtxEntry>, n: u32) -> Answer<()> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.truncate(n as usize);
        self.engine_answer(r)
    }

    fn info(&mut self, me: Resource<CtxEntry>) -> Answer<types::Info> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.info();
        let to32 = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(self.engine_answer(r)?.map(|i| types::Info {
            seq_len: to32(i.seq_len),
            page_size: to32(i.page_size),
            committed_pages: to32(i.committed_pages),
            working_pages: to32(i.working_pages),
            pending_tokens: to32(i.pending_tokens),
            spare_pages: to32(i.spare_pages),
        }))
    }

    fn tokens(&mut self, me: Resource<CtxEntry>) -> Answer<Vec<u32>> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.tokens();
        self.engine_answer(r)
    }

    fn generate(
        &mut self,
        me: Resource<CtxEntry>,
        params: types::GenParams,
    ) -> Answer<types::Generation> {
        self.go_on()?;
        self.entry(&me)?;
        let mut req = match self.request(&params, None) {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let room = self.tokens_within_quota(&me)?;
        if room == 0 {
            return Ok(Err(self.no_pages_left()));
        }
        req.max_tokens = req.max_tokens.min(room);
        let r = self
            .generation(&me, req, params.chat, params.stream)?
            .map(|(g, _, _)| g);
        self.pages_within_quota()?;
        Ok(r)
    }

    fn next_logprobs(
        &mut self,
        me: Resource<CtxEntry>,
        k: u32,
    ) -> Answer<Vec<types::TokenLogprob>> {
        self.go_on()?;
        Ok(self.pass(&me, Vec::new(), k.max(1))?.map(|s| s.next))
    }

    fn score(&mut self, me: Resource<CtxEntry>, tokens: Vec<u32>, k: u32) -> Answer<types::Scores> {
        self.go_on()?;
        let r = self.pass(&me, tokens, k)?;
        self.pages_within_quota()?;
        Ok(r)
    }

    fn save(&mut self, me: Resource<CtxEntry>, name: String) -> Answer<()> {
        self.go_on()?;
        let deadline = self.remaining();
        let r = self.entry(&me)?.ctx.save_by(&name, Some(deadline));
        self.engine_answer(r)
    }

    fn open(&mut self, name: String) -> Answer<Resource<CtxEntry>> {
        self.go_on()?;
        if let Err(e) = self.room_for_context() {
            return Ok(Err(e));
        }
        let r = folio::Context::load(&self.engine, &name);
        match self.engine_answer(r)? {
            Ok(ctx) => self.hold(ctx),
            Err(e) => Ok(Err(e)),
        }
    }

    fn reserve_pages(&mut self, me: Resource<CtxEntry>, n: u32) -> Answer<()> {
        self.go_on()?;
        let left = self.quota.pages.saturating_sub(self.pages_held()?);
        if n as usize > left {
            return Ok(Err(self.no_pages_left()));
        }
        let r = self.entry(&me)?.ctx.reserve_working_pages(n as usize);
        self.engine_answer(r)
    }

    fn commit_pages(&mut self, me: Resource<CtxEntry>, k: u32) -> Answer<()> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.commit_working_pages(k as usize);
        self.engine_answer(r)
    }

    fn release_pages(&mut self, me: Resource<CtxEntry>, n: u32) -> Answer<()> {
        self.go_on()?;
        let r = self.entry(&me)?.ctx.release_working_pages(n as usize);
        self.engine_answer(r)
    }

    fn truncate_working(&mut self, me: Resource<CtxEntry>, n: u32) -> Answer<()> {
        self.go_on()?;
        let r = self
            .entry(&me)?
            .ctx
            .truncate_working_page_tokens(n as usize);
        self.engine_answer(r)
    }

    fn drop(&mut self, me: Resource<CtxEntry>) -> wasmtime::Result<()> {
        let rep = me.rep();
        self.table.delete(me)?;
        self.live.retain(|&r| r != rep);
        Ok(())
    }
}

impl host::Host for RunState {
    fn tokenize(&mut self, text: String) -> Answer<Vec<u32>> {
        self.go_on()?;
        let r = self.engine.model().tokenizer.try_encode(&text, false);
        self.engine_answer(r.map_err(EngineError::from))
    }

    fn detokenize(&mut self, tokens: Vec<u32>) -> Answer<String> {
        self.go_on()?;
        let vocab = self.engine.model().config.vocab;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Ok(Err(err(
                types::ErrorKind::Invalid,
                format!("token {bad} is outside the vocabulary (0..{vocab})"),
            )));
        }
        Ok(Ok(self.engine.model().tokenizer.decode(&tokens)))
    }

    fn end_tokens(&mut self) -> wasmtime::Result<Vec<u32>> {
        self.go_on()?;
        Ok(self.engine.model().tokenizer.eog_tokens().to_vec())
    }

    fn emit(&mut self, text: String) -> Answer<()> {
        self.go_on()?;
        let n = text.len();
        self.send(Chunk::Text(text), n)?;
        Ok(Ok(()))
    }

    fn emit_json(&mut self, json: String) -> Answer<()> {
        self.go_on()?;
        let v: serde_json::Value = match serde_json::from_str(&json) {
            Ok(v) => v,
            Err(e) => {
                return Ok(Err(err(
                    types::ErrorKind::Invalid,
                    format!("emit-json: the text is not JSON: {e}"),
                )))
            }
        };
        self.send(Chunk::Json(v), json.len())?;
        Ok(Ok(()))
    }

    fn log(&mut self, message: String) -> wasmtime::Result<()> {
        self.go_on()?;
        let m: String = message.chars().take(1000).collect();
        tracing::info!(target: "inferlet", "{m}");
        Ok(())
    }

    fn elapsed_us(&mut self) -> wasmtime::Result<u64> {
        self.go_on()?;
        Ok(self.started.elapsed().as_micros() as u64)
    }
}
