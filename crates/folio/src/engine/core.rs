//! The engine thread's state and its loop. One step reads like this:
//! `scheduler.schedule(&mut kv)` plans a batch and reserves its slots;
//! `model.forward(&batch, kv.storage())` computes it; `scheduler.update(...)` commits
//! the full pages, samples and retires. Between steps the loop takes commands: new
//! requests, cancellations, and calls from handles (context operations) that run
//! here, so nothing else ever touches the pool.

use super::context::{Contexts, Job};
use super::error::EngineError;
use super::request::{EngineConfig, EngineStats, Event, Request};
use super::scheduler::{check_fits, Plan, Scheduler, SchedulerConfig};
use super::seq::{Embed, EmbedReply, Gen, PromptScores, Purpose, Sink};
use super::spec::SpecState;
use crate::kv::{PageState, PagedKv};
use crate::model::{Model, StepLogits};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

/// A call from a handle, run on the engine thread between steps.
pub(crate) type Call = Box<dyn FnOnce(&mut Core) + Send>;

/// What handles send the engine thread.
pub(crate) enum Cmd {
    // The request boxed: it is much the largest command.
    Submit {
        id: u64,
        req: Box<Request>,
        tx: Sink,
    },
    Cancel(u64),
    Call(Call),
    Shutdown,
}

/// The most rows of logits the core keeps a buffer for between steps (a decode step
/// of up to this many sequences; bigger steps allocate theirs and free it after).
const KEPT_LOGIT_ROWS: usize = 64;

/// Everything the engine thread owns: the model, the pool, the scheduler and the
/// contexts.
pub(crate) struct Core {
    pub model: Arc<Model>,
    pub kv: PagedKv,
    pub sched: Scheduler,
    pub contexts: Contexts,
    /// The step's logits, a buffer kept from step to step (see [`StepLogits`]).
    logits: StepLogits,
    /// KV events' sender, when someone subscribed (`EngineConfig::kv_events`).
    events: Option<super::events::EventPump>,
}

impl Core {
    /// The pool sized from `cfg`, checked against the model; the model configured for
    /// the window (Phi-3's long-context RoPE chooses its divisors by it).
    pub fn new(model: Model, cfg: &EngineConfig) -> Result<Self, EngineError> {
        let (shape, window) = cfg.validate(&model)?;
        let model = Arc::new(model.with_context(window));
        let mut kv = PagedKv::with_shape(shape, window, &model.fingerprint());
        // A pool the backend cannot hold (a GPU's device memory) fails here, at start.
        let page_size = kv.page_size();
        model.prepare(kv.storage(), page_size)?;
        kv.set_vocab(model.config.vocab);
        kv.set_snapshot_limits(crate::kv::SnapshotLimits {
            max_bytes: cfg.snapshot_max_bytes,
            max_count: cfg.snapshot_max_count,
        });
        if let Some(disk) = &cfg.kv_disk {
            let o = kv.attach_disk(disk)?;
            tracing::info!(
                "kv disk: {} pages ({} MB) indexed in {}{}",
                o.pages,
                o.bytes >> 20,
                o.dir.display(),
                if o.skipped + o.unfinished > 0 {
                    format!(
                        "; removed {} unusable files and {} unfinished writes",
                        o.skipped, o.unfinished
                    )
                } else {
                    String::new()
                }
            );
        }
        // Before snapshots are restored: their pages are stored events too.
        let events = cfg
            .kv_events
            .clone()
            .map(|t| super::events::EventPump::new(t, &mut kv));
        if let Some(dir) = &cfg.snapshot_dir {
            let (_, skipped) = kv.open_snapshot_dir(dir)?;
            let restored = kv.snapshot_list();
            for e in skipped {
                // A save cut short: say which save of that name came back instead.
                let kept = match &e {
                    crate::kv::SnapshotError::Interrupted { name, .. } => {
                        match restored.iter().find(|(n, _)| n == name) {
                            Some((_, tokens)) => format!(" (restored: {tokens} tokens)"),
                            None => " (no complete save of it: none restored)".into(),
                        }
                    }
                    _ => String::new(),
                };
                tracing::warn!("snapshot skipped: {e}{kept}");
            }
            for (name, tokens) in &restored {
                tracing::info!("snapshot {name:?} restored: {tokens} tokens");
            }
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // No step larger than the backend takes (a GPU's dispatch grid).
        let max_batch_tokens = match model.max_step_rows() {
            Some(rows) if rows < cfg.max_batch_tokens => {
                tracing::info!(
                    "max_batch_tokens {} lowered to {rows}: the most rows the backend's step takes",
                    cfg.max_batch_tokens
                );
                rows.max(1)
            }
            _ => cfg.max_batch_tokens,
        };
        let sched = Scheduler::new(SchedulerConfig {
            max_batch_tokens,
            window,
            grammar_checks: cfg.grammar_checks,
            spare_core: cores > model.threads(),
            sample_threads: if cfg.parallel_sampling {
                model.threads().min(cores)
            } else {
                1
            },
            speculative: cfg.speculative,
            sliding_window: if cfg.free_window_pages {
                model.config.sliding_window()
            } else {
                None
            },
        });
        Ok(Self {
            events,
            logits: StepLogits::new(),
            model,
            kv,
            sched,
            contexts: Contexts::with_page_limit(cfg.context_pages.unwrap_or(usize::MAX)),
        })
    }

    /// The loop: take every waiting command, then run one step while there is work.
    /// A panic (a bug) fails every request with an error instead of leaving callers
    /// waiting, and stops the engine: its state can no longer be trusted.
    pub fn run(mut self, rx: Receiver<Cmd>) {
        let why = loop {
            if let Some(e) = &mut self.events {
                e.pump(&mut self.kv);
            }
            let cmd = if self.sched.seqs().is_empty() {
                match rx.recv() {
                    Ok(c) => c,
                    Err(_) => break EngineError::Closed,
                }
            } else {
                match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => {
                        if catch_unwind(AssertUnwindSafe(|| self.step())).is_err() {
                            break EngineError::Internal("the engine stopped".into());
                        }
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break EngineError::Closed,
                }
            };
            let done = catch_unwind(AssertUnwindSafe(|| match cmd {
                Cmd::Submit { id, req, tx } => {
                    self.submit(id, *req, tx);
                    false
                }
                Cmd::Cancel(id) => {
                    self.sched.cancel(&mut self.kv, id);
                    self.give_back_retired();
                    false
                }
                Cmd::Call(f) => {
                    f(&mut self);
                    false
                }
                Cmd::Shutdown => true,
            }));
            match done {
                Ok(true) => break EngineError::Closed,
                Ok(false) => {}
                Err(_) => break EngineError::Internal("the engine stopped".into()),
            }
        };
        if let EngineError::Internal(_) = why {
            tracing::error!("{why}");
        }
        let _ = catch_unwind(AssertUnwindSafe(|| self.sched.fail_all(&mut self.kv, &why)));
    }

    /// One step: plan (slots reserved), compute, then commit, sample and retire.
    pub fn step(&mut self) {
        let plan = self.sched.schedule(&mut self.kv);
        self.give_back_retired();
        let Some(plan) = plan else { return };
        let mut logits = std::mem::take(&mut self.logits);
        let began = std::time::Instant::now();
        let forward = self.forward_with_masks(&plan, &mut logits);
        match forward {
            Ok(()) => {
                let tok = &self.model.tokenizer;
                // A sequence's decode step, with or without a draft, times a row
                // (see `spec::cost`).
                let seqs = &plan.batch.seqs;
                let timed = (seqs.len() == 1 && seqs[0].logit_rows() == seqs[0].tokens.len())
                    .then(|| seqs[0].tokens.len());
                self.sched.update(&mut self.kv, tok, plan, &logits);
                if let Some(rows) = timed {
                    self.sched.observe_step(rows, began.elapsed().as_secs_f64());
                }
                self.sched.forget_out_of_window(&mut self.kv);
            }
            Err(e) => {
                tracing::error!("forward step failed: {e}");
                self.sched.fail_plan(&mut self.kv, plan, &e.into());
            }
        }
        logits.trim(KEPT_LOGIT_ROWS * self.model.config.vocab);
        self.logits = logits;
        self.give_back_retired();
    }

    /// Runs the planned step. Grammar masks that the step's samples will likely need
    /// are computed meanwhile on a thread of their own: a mask depends only on the
    /// tokens already sampled. Most constrained samples need none (the sampler asks
    /// the grammar about single tokens), and a mask computed for nothing takes a
    /// core from the forward pass: so masks are computed ahead only where a core is
    /// spare, for the samples whose last sample needed one.
    fn forward_with_masks(
        &mut self,
        plan: &Plan,
        logits: &mut StepLogits,
    ) -> Result<(), crate::model::StepError> {
        let wanted = self.sched.masks_wanted(plan);
        let (model, kv, sched) = (&self.model, &mut self.kv, &mut self.sched);
        if wanted.is_empty() {
            return model.forward_into(&plan.batch, kv.storage(), logits);
        }
        std::thread::scope(|s| {
            let masks = s.spawn(|| sched.prepare_masks(&wanted));
            let out = model.forward_into(&plan.batch, kv.storage(), logits);
            if masks.join().is_err() {
                tracing::error!("computing grammar masks failed: they are computed at sampling");
            }
            out
        })
    }

    /// Hands the tables of retired context jobs back to their contexts.
    fn give_back_retired(&mut self) {
        for s in self.sched.take_retired() {
            self.contexts.give_back(&mut self.kv, &self.model, s);
        }
    }

    /// Queues a context's job with the scheduler. A context that holds nothing yet
    /// starts from whatever prefix of its tokens the index holds.
    ///
    /// Every token is checked against the vocabulary first (a context's tokens may
    /// come from a snapshot): a token the model cannot embed would fail the whole
    /// step it joins, every sequence in it. Such a job fails alone, here, and its
    /// table goes back to its context.
    pub fn push_job(&mut self, mut j: Job) {
        let vocab = self.model.config.vocab;
        let bad = j.tokens.iter().copied().find(|&t| t as usize >= vocab);
        if bad.is_none() && j.table.is_empty() {
            // A scoring job computes the rows from the one before its first scored
            // token (`reuse_prefix` keeps short of the last token it is given).
            let reusable = match &j.purpose {
                Purpose::Generate(g) => g.prompt_logprobs.as_ref().map(|p| p.from),
                _ => None,
            };
            let upto = reusable.unwrap_or(j.tokens.len()).min(j.tokens.len());
            self.kv.reuse_prefix(&mut j.table, &j.tokens[..upto]);
        }
        let ctx = Some((j.link, j.table));
        self.sched.push(j.req, j.tokens, j.salt, j.purpose, ctx);
        if let Some(bad) = bad {
            self.sched
                .refuse_last(&crate::error::TokenizerError::UnknownId(bad).into());
            self.give_back_retired();
        }
    }

    fn submit(&mut self, id: u64, req: Request, tx: Sink) {
        let window = self.sched.window();
        let vocab = self.model.config.vocab;
        let checked = req.validate().and_then(|_| {
            req.validate_ids(vocab)?;
            let toks = req.prompt.tokens(&self.model)?;
            if toks.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if toks.len() >= window {
                return Err(EngineError::PromptTooLong {
                    len: toks.len(),
                    window,
                });
            }
            let sliding = self.sched.most_pages_held(&self.kv);
            check_fits(&self.kv, window, toks.len(), req.max_tokens, sliding)?;
            Ok(toks)
        });
        let toks = match checked {
            Ok(t) => t,
            Err(e) => {
                tx.send(Event::Error(e));
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
        g.prompt_logprobs = req.prompt_logprobs.map(|k| PromptScores::new(k, 1));
        g.grammar = req.grammar;
        g.forks = (1..req.n).collect();
        if req.speculative {
            g.spec = Some(Box::new(SpecState::new(req.prediction)));
        }
        self.sched
            .push(id, toks, req.salt, Purpose::Generate(Box::new(g)), None);
    }

    /// Queues an embedding of `tokens` as request `id`: checked like a request's
    /// prompt (not empty, in the vocabulary, within the window, able to fit the pool),
    /// then a sequence the scheduler batches with the rest, whose hidden states go to
    /// `reply` when its prompt is computed (or its error, at any point).
    pub fn submit_embed(&mut self, id: u64, tokens: Vec<u32>, reply: EmbedReply) {
        let window = self.sched.window();
        let vocab = self.model.config.vocab;
        let checked = (|| {
            if tokens.is_empty() {
                return Err(EngineError::EmptyPrompt);
            }
            if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(crate::error::TokenizerError::UnknownId(bad).into());
            }
            // Nothing is generated after it: a whole window fits.
            if tokens.len() > window {
                return Err(EngineError::PromptTooLong {
                    len: tokens.len(),
                    window,
                });
            }
            let sliding = self.sched.most_pages_held(&self.kv);
            check_fits(&self.kv, window, tokens.len(), 0, sliding)
        })();
        if let Err(e) = checked {
            let _ = reply.send(Err(e));
            return;
        }
        let e = Embed::new(tokens.len(), self.model.config.dim, reply);
        self.sched
            .push(id, tokens, None, Purpose::Embed(Box::new(e)), None);
    }

    pub fn stats(&self) -> EngineStats {
        let kv = &self.kv;
        let c = self.sched.counters();
        let seqs = self.sched.seqs();
        let grammar = self.sched.grammar();
        EngineStats {
            pages_total: kv.num_pages(),
            pages_free: kv.count(PageState::Free),
            pages_working: kv.count(PageState::Working),
            pages_committed: kv.count(PageState::Committed),
            pages_cached: kv.count(PageState::Cached),
            pages_shared: self.shared_pages(),
            pages_pinned: self.pinned_pages(),
            page_size: kv.page_size(),
            prefix_hit_tokens: c.prefix_hit_tokens,
            prefilled_tokens: c.prefilled_tokens,
            generated_tokens: c.generated_tokens,
            evictions: kv.stats().evictions,
            preemptions: c.preemptions,
            steps: c.steps,
            running: seqs.iter().filter(|s| s.table.is_some()).count(),
            waiting: seqs.iter().filter(|s| s.table.is_none()).count(),
            requests_done: c.requests_done,
            forks: c.forks + self.contexts.forks,
            window_pages_released: c.window_pages_released,
            step_tokens: c.step_tokens.to_vec(),
            step_tokens_sum: c.step_tokens_sum,
            samples_chosen_ahead: c.samples_chosen_ahead,
            grammar_checked: grammar.checked,
            grammar_masked: grammar.masked,
            grammar_masks_ahead: grammar.masks_ahead,
            grammar_masks_ahead_used: grammar.masks_ahead_used,
            spec_drafts: c.spec_drafts,
            spec_drafted_tokens: c.spec_drafted_tokens,
            spec_accepted_tokens: c.spec_accepted_tokens,
            spec_row_cost: self.sched.row_cost(),
            disk: kv.disk_stats(),
            backend: self.model.backend().describe(),
            backend_figures: self.model.backend().figures(),
        }
    }

    /// Pages held by more than one sequence, context or snapshot.
    fn shared_pages(&self) -> usize {
        let tables = self
            .sched
            .seqs()
            .iter()
            .filter_map(|s| s.table.as_ref())
            .chain(self.contexts.tables())
            .chain(self.kv.pinned_tables());
        crate::kv::shared_pages(tables, self.kv.num_pages())
    }

    /// Distinct pages held by snapshots.
    fn pinned_pages(&self) -> usize {
        let mut pages: Vec<u32> = self
            .kv
            .pinned_tables()
            .flat_map(|t| {
                (0..t.num_pages())
                    .filter(|&i| t.holds(i))
                    .map(|i| t.page(i).0)
            })
            .collect();
        pages.sort_unstable();
        pages.dedup();
        pages.len()
    }

    /// Checks the page store's invariants against every table and page held: running
    /// and retired sequences, idle contexts and their spare pages, snapshots. Returns
    /// the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let tables = self
            .sched
            .seqs()
            .iter()
            .chain(self.sched.retired())
            .filter_map(|s| s.table.as_ref())
            .chain(self.contexts.tables())
            .chain(self.kv.pinned_tables());
        let mut holders = crate::kv::holders(tables, self.kv.num_pages());
        for p in self.contexts.spare_pages() {
            if let Some(h) = holders.get_mut(p.0 as usize) {
                *h += 1;
            }
        }
        self.kv.check(&holders)
    }

    /// (free, cached) page counts: after a drain, every page is one or the other.
    pub fn page_counts(&self) -> (usize, usize) {
        (
            self.kv.count(PageState::Free),
            self.kv.count(PageState::Cached),
        )
    }
}
