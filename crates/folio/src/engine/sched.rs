//! The engine thread's state and its scheduling step.
//!
//! Each step walks the live sequences first come, first served and gives each what
//! the token budget (`max_batch_tokens`) and the pool allow: one token for a decoding
//! sequence, a chunk of the prompt for a prefilling one. A sequence enters (admission)
//! by attaching whatever prefix the index holds, then needs pages only for the rest.
//! When a sequence cannot get its pages, cached pages are evicted (the store does that
//! on reserve), then the newest sequence holding pages is preempted: its pages are
//! released and it is requeued to recompute its tokens later, which gives the same
//! logits (the batched step is deterministic), so its output does not change. No
//! sequence ever touches another's pages.

use super::context::CtxState;
use super::seq::{After, CtxLink, Gen, Purpose, Seq};
use super::{Cmd, EngineConfig, EngineError, EngineStats, Event, Prompt, Request};
use crate::generate::FinishReason;
use crate::kv::{PageState, PageTable, PagedKv};
use crate::model::{KvCache, Logits, Model, Step};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// Counters kept by the scheduler.
#[derive(Debug, Default, Clone)]
struct Counters {
    prefix_hit_tokens: u64,
    prefilled_tokens: u64,
    generated_tokens: u64,
    preemptions: u64,
    steps: u64,
    requests_done: u64,
}

/// Everything the engine thread owns: the model, the pool, the live sequences and the
/// contexts.
pub struct Core {
    pub(crate) model: Arc<Model>,
    pub(crate) kv: PagedKv,
    cfg: EngineConfig,
    pub(crate) seqs: Vec<Seq>,
    next_arrival: u64,
    pub(crate) contexts: HashMap<u64, CtxState>,
    next_ctx: u64,
    /// The most tokens a sequence may hold (the model's context window).
    pub(crate) window: usize,
    counters: Counters,
}

impl Core {
    pub(crate) fn new(model: Arc<Model>, cfg: &EngineConfig) -> Self {
        let window = model.config.context_length;
        let kv = model.new_paged_as(cfg.kv_dtype, cfg.kv_pages, cfg.page_size, window);
        Self {
            model,
            kv,
            cfg: cfg.clone(),
            seqs: Vec::new(),
            next_arrival: 0,
            contexts: HashMap::new(),
            next_ctx: 1,
            window,
            counters: Counters::default(),
        }
    }

    /// The loop: take every waiting command, then run one step while there is work.
    /// A panic (a bug) fails every request with an error instead of leaving callers
    /// waiting, and stops the engine: its state can no longer be trusted.
    pub(crate) fn run(mut self, rx: Receiver<Cmd>) {
        let why = loop {
            let cmd = if self.seqs.is_empty() {
                match rx.recv() {
                    Ok(c) => c,
                    Err(_) => break "the engine has stopped",
                }
            } else {
                match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => {
                        if catch_unwind(AssertUnwindSafe(|| self.step())).is_err() {
                            break "internal error: the engine stopped";
                        }
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break "the engine has stopped",
                }
            };
            let done = catch_unwind(AssertUnwindSafe(|| match cmd {
                Cmd::Submit { id, req, tx } => {
                    self.submit(id, req, tx);
                    false
                }
                Cmd::Cancel(id) => {
                    self.cancel(id);
                    false
                }
                Cmd::Call(f) => {
                    f(&mut self);
                    false
                }
                Cmd::Shutdown => true,
            }));
            match done {
                Ok(true) => break "the engine has stopped",
                Ok(false) => {}
                Err(_) => break "internal error: the engine stopped",
            }
        };
        if why.starts_with("internal") {
            tracing::error!("{why}");
        }
        for mut s in std::mem::take(&mut self.seqs) {
            s.fail(why);
        }
    }

    pub(crate) fn stats(&self) -> EngineStats {
        let st = &self.kv.store;
        let c = &self.counters;
        EngineStats {
            pages_total: st.num_pages(),
            pages_free: st.num_free(),
            pages_working: st.count(PageState::Working),
            pages_committed: st.count(PageState::Committed),
            pages_cached: st.count(PageState::Cached),
            pages_shared: self.shared_pages(),
            page_size: st.page_size(),
            prefix_hit_tokens: c.prefix_hit_tokens,
            prefilled_tokens: c.prefilled_tokens,
            generated_tokens: c.generated_tokens,
            evictions: st.stats.evictions,
            preemptions: c.preemptions,
            steps: c.steps,
            running: self.seqs.iter().filter(|s| s.table.is_some()).count(),
            waiting: self.seqs.iter().filter(|s| s.table.is_none()).count(),
            requests_done: c.requests_done,
        }
    }

    /// Pages held by more than one sequence, context or snapshot.
    fn shared_pages(&self) -> usize {
        let tables = self
            .seqs
            .iter()
            .filter_map(|s| s.table.as_ref())
            .chain(self.contexts.values().filter_map(|c| c.table()))
            .chain(self.kv.snapshots.values());
        crate::kv::shared_pages(tables, self.kv.store.num_pages())
    }

    /// The prompt's tokens, or why the request cannot run.
    pub(crate) fn tokens_of(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        let toks = match prompt {
            Prompt::Text(t) => self.model.tokenizer.encode(t, true),
            Prompt::Tokens(t) => t.clone(),
        };
        let vocab = self.model.config.vocab;
        if let Some(&bad) = toks.iter().find(|&&t| t as usize >= vocab) {
            return Err(crate::error::RunError::BadToken(bad).into());
        }
        Ok(toks)
    }

    pub(crate) fn check_request(&self, req: &Request) -> Result<(), EngineError> {
        if req.max_tokens == 0 {
            return Err(EngineError::Invalid("max_tokens must be at least 1".into()));
        }
        if req.n == 0 || req.n > 128 {
            return Err(EngineError::Invalid("n must be between 1 and 128".into()));
        }
        if req.logprobs.is_some_and(|k| k > 20) {
            return Err(EngineError::Invalid("logprobs must be at most 20".into()));
        }
        Ok(())
    }

    fn submit(&mut self, id: u64, req: Request, tx: Sender<Event>) {
        let checked = self.check_request(&req).and_then(|_| {
            let toks = self.tokens_of(&req.prompt)?;
            if toks.is_empty() {
                return Err(crate::error::RunError::EmptyPrompt.into());
            }
            if toks.len() >= self.window {
                return Err(EngineError::PromptTooLong {
                    len: toks.len(),
                    window: self.window,
                });
            }
            Ok(toks)
        });
        let toks = match checked {
            Ok(t) => t,
            Err(e) => {
                let _ = tx.send(Event::Error(e.to_string()));
                return;
            }
        };
        let mut g = Gen::new(
            &req.sampling,
            &req.stop,
            req.max_tokens,
            req.ignore_eos,
            req.logprobs,
            tx,
        );
        g.forks = (1..req.n).collect();
        self.push_seq(id, toks, req.salt, Purpose::Generate(Box::new(g)), None);
    }

    pub(crate) fn push_seq(
        &mut self,
        req: u64,
        tokens: Vec<u32>,
        salt: Option<Vec<u8>>,
        purpose: Purpose,
        ctx: Option<(CtxLink, PageTable)>,
    ) {
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let (ctx, table) = match ctx {
            Some((link, table)) => (Some(link), Some(table)),
            None => (None, None),
        };
        let cached = table.as_ref().map(|t| t.len());
        self.seqs.push(Seq {
            req,
            index: 0,
            arrival,
            salt,
            prompt_len: tokens.len(),
            tokens,
            table,
            cached,
            purpose,
            ctx,
        });
    }

    fn cancel(&mut self, req: u64) {
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].req == req && matches!(self.seqs[i].purpose, Purpose::Generate(_)) {
                let s = self.seqs.swap_remove(i);
                self.retire(s);
            } else {
                i += 1;
            }
        }
    }

    /// Removes a sequence's claim on the pool: its pages go back (or to its context).
    fn retire(&mut self, mut s: Seq) {
        let table = s.table.take();
        if let Some(link) = s.ctx.take() {
            self.return_to_context(&s, link, table);
        } else if let Some(t) = table {
            if let Err(e) = self.kv.release(t) {
                tracing::error!("releasing a finished sequence's pages: {e}");
            }
        }
    }

    /// Frees the pages of sequence `i` and requeues it to recompute.
    fn preempt(&mut self, i: usize) {
        if let Some(t) = self.seqs[i].table.take() {
            if let Err(e) = self.kv.release(t) {
                tracing::error!("releasing a preempted sequence's pages: {e}");
            }
            self.counters.preemptions += 1;
            tracing::debug!(req = self.seqs[i].req, "preempted");
        }
    }

    /// Whether a started sequence is still prefilling at least one more full page of
    /// tokens that sequence `i` starts with (so `i` will find them in the index).
    fn prefix_in_flight(&self, i: usize) -> bool {
        let ps = self.cfg.page_size;
        let s = &self.seqs[i];
        self.seqs.iter().enumerate().any(|(j, o)| {
            let Some(t) = &o.table else { return false };
            if j == i || o.salt != s.salt || o.pending() <= 1 {
                return false;
            }
            let common = s
                .tokens
                .iter()
                .zip(&o.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            common.min(s.tokens.len() - 1) >= t.len() / ps * ps + ps
        })
    }

    /// Undoes an admission within the same step (not counted as a preemption).
    fn preempt_quietly(&mut self, i: usize) {
        if let Some(t) = self.seqs[i].table.take() {
            if let Err(e) = self.kv.release(t) {
                tracing::error!("releasing a sequence's pages: {e}");
            }
        }
    }

    /// Gives sequence `i` a page table holding the longest indexed prefix of its tokens.
    fn admit(&mut self, i: usize) {
        let s = &mut self.seqs[i];
        let mut t = self.kv.new_table(s.salt.as_deref());
        let hit = self.kv.seq(&mut t).reuse_prefix(&s.tokens);
        if s.cached.is_none() {
            s.cached = Some(hit.min(s.prompt_len));
            self.counters.prefix_hit_tokens += hit.min(s.prompt_len) as u64;
        }
        s.table = Some(t);
    }

    /// One step: plan who runs how many tokens, run the batch, sample, retire.
    pub(crate) fn step(&mut self) {
        let ps = self.cfg.page_size;
        let mut order: Vec<usize> = (0..self.seqs.len()).collect();
        order.sort_by_key(|&i| (self.seqs[i].arrival, self.seqs[i].index));
        let mut budget = self.cfg.max_batch_tokens;
        // Pages the planned chunks will take, and what is left for the rest.
        let mut taken = 0;
        let mut avail = self.kv.store.num_available();
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut admitting = true;
        for at in 0..order.len() {
            let i = order[at];
            if budget == 0 {
                break;
            }
            if self.seqs[i].table.is_none() {
                if !admitting {
                    continue;
                }
                if self.prefix_in_flight(i) {
                    // Another sequence is computing this one's prefix right now: wait
                    // for its pages to be committed, then attach them.
                    continue;
                }
                self.admit(i);
                if self.kv.store.num_available() < taken {
                    // Attaching its prefix took pages the planned chunks need: not yet.
                    self.preempt_quietly(i);
                    admitting = false;
                    continue;
                }
                avail = self.kv.store.num_available() - taken;
            }
            let (len, held) = {
                let t = self.seqs[i].table.as_ref().expect("admitted");
                (t.len(), t.num_pages())
            };
            let want = self.seqs[i].pending().min(budget);
            let need = |c: usize| (len + c).div_ceil(ps).saturating_sub(held);
            let mut c = want;
            while need(c) > avail {
                // Make room: preempt the newest sequence (after this one) holding pages.
                let newest = order[at + 1..]
                    .iter()
                    .rev()
                    .copied()
                    .find(|&j| self.seqs[j].table.is_some());
                match newest {
                    Some(j) => {
                        self.preempt(j);
                        avail = self.kv.store.num_available() - taken;
                    }
                    None => {
                        c = c.min(((held + avail) * ps).saturating_sub(len));
                        break;
                    }
                }
            }
            if c == 0 {
                // This one waits, and so does everyone behind it (first come, first served).
                admitting = false;
                continue;
            }
            avail -= need(c);
            taken += need(c);
            budget -= c;
            plan.push((i, c));
        }
        if plan.is_empty() {
            self.unblock();
            return;
        }
        self.run_plan(plan);
    }

    /// Nothing could run: the oldest sequence holding pages (else the oldest) cannot fit
    /// even with every newer one preempted. It fails (the pool is too small for it); the rest go on.
    fn unblock(&mut self) {
        let key = |i: &usize| {
            let s = &self.seqs[*i];
            (s.table.is_none(), s.arrival, s.index)
        };
        let Some(i) = (0..self.seqs.len()).min_by_key(key) else {
            return;
        };
        let ps = self.cfg.page_size;
        let s = &self.seqs[i];
        let needed = s.tokens.len().div_ceil(ps);
        let held = s.table.as_ref().map_or(0, |t| t.num_pages());
        let e = EngineError::PoolTooSmall {
            needed,
            available: held + self.kv.store.num_available(),
        };
        let mut s = self.seqs.swap_remove(i);
        s.fail(&e.to_string());
        self.retire(s);
    }

    fn run_plan(&mut self, mut plan: Vec<(usize, usize)>) {
        plan.sort_unstable();
        self.counters.steps += 1;
        let inputs: Vec<(Vec<u32>, Logits)> = plan
            .iter()
            .map(|&(i, c)| {
                let s = &self.seqs[i];
                let start = s.table.as_ref().map_or(0, |t| t.len());
                let last = start + c == s.tokens.len();
                let want = match s.purpose {
                    Purpose::Generate(_) if last => Logits::Last,
                    _ => Logits::None,
                };
                for p in start..start + c {
                    if p < s.prompt_len {
                        self.counters.prefilled_tokens += 1;
                    }
                }
                (s.tokens[start..start + c].to_vec(), want)
            })
            .collect();
        let steps: Vec<Step> = inputs
            .iter()
            .map(|(t, w)| Step {
                tokens: t,
                want: *w,
            })
            .collect();
        let mut next = plan.iter().map(|p| p.0).peekable();
        let tables: Vec<&mut PageTable> = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| {
                if next.peek() == Some(&i) {
                    next.next();
                    s.table.as_mut()
                } else {
                    None
                }
            })
            .collect();
        let result = self.model.forward_batch(&mut self.kv.batch(tables), &steps);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("forward step failed: {e}");
                let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
                idx.sort_unstable_by(|a, b| b.cmp(a));
                for i in idx {
                    let mut s = self.seqs.swap_remove(i);
                    s.fail(&format!("internal error: {e}"));
                    self.retire(s);
                }
                return;
            }
        };
        let mut done: Vec<(usize, Option<FinishReason>)> = Vec::new();
        let mut children = Vec::new();
        for (&(i, _), l) in plan.iter().zip(&logits) {
            if l.is_empty() {
                if matches!(self.seqs[i].purpose, Purpose::Flush) && self.seqs[i].pending() == 0 {
                    done.push((i, None));
                }
                continue;
            }
            children.extend(self.fork_samples(i, l));
            match self.seqs[i].sample(&self.model.tokenizer, l, self.window) {
                After::Continue => {}
                After::Finished(why) => done.push((i, Some(why))),
                After::Gone => done.push((i, None)),
            }
            self.counters.generated_tokens += 1;
        }
        // Retire from the back so indices stay valid.
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, why) in done {
            let mut s = self.seqs.swap_remove(i);
            if let Some(why) = why {
                s.finish(why);
                self.counters.requests_done += 1;
            }
            if let (Purpose::Flush, Some(link)) = (&s.purpose, s.ctx.as_mut()) {
                if let Some(r) = link.flush_reply.take() {
                    let _ = r.send(Ok(()));
                }
            }
            self.retire(s);
        }
        self.seqs.extend(children);
    }

    /// The first time sample 0 of an `n > 1` request has its prompt's logits, the other
    /// samples fork its pages (no prefill of their own) and sample from the same logits.
    fn fork_samples(&mut self, i: usize, logits: &[f32]) -> Vec<Seq> {
        let s = &mut self.seqs[i];
        let Purpose::Generate(g) = &mut s.purpose else {
            return Vec::new();
        };
        let forks = std::mem::take(&mut g.forks);
        let (mut out, mut ended) = (Vec::new(), Vec::new());
        for k in forks {
            let mut params = g.sampler.params.clone();
            params.seed = params.seed.wrapping_add(k as u64);
            let gen = Gen::new(
                &params,
                g.text.stops(),
                g.max_tokens,
                g.ignore_eos,
                g.logprobs,
                g.tx.clone(),
            );
            // Without a page for the copy of the partial page, the sample starts
            // from the prefix cache instead.
            let table = s.table.as_mut().and_then(|t| self.kv.fork(t).ok());
            let mut child = Seq {
                req: s.req,
                index: k,
                arrival: s.arrival,
                salt: s.salt.clone(),
                tokens: s.tokens.clone(),
                prompt_len: s.prompt_len,
                cached: Some(s.prompt_len),
                table,
                purpose: Purpose::Generate(Box::new(gen)),
                ctx: None,
            };
            match child.sample(&self.model.tokenizer, logits, self.window) {
                After::Continue => out.push(child),
                After::Finished(why) => {
                    child.finish(why);
                    self.counters.requests_done += 1;
                    ended.push(child);
                }
                After::Gone => ended.push(child),
            }
            self.counters.generated_tokens += 1;
        }
        for child in ended {
            self.retire(child);
        }
        out
    }

    pub(crate) fn new_context(&mut self, salt: Option<Vec<u8>>) -> u64 {
        let id = self.next_ctx;
        self.next_ctx += 1;
        let table = self.kv.new_table(salt.as_deref());
        self.contexts.insert(id, CtxState::new(table, salt));
        id
    }
}
