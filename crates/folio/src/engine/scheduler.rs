//! The scheduler: the live sequences, and the only code that reserves or releases
//! their pages.
//!
//! [`Scheduler::schedule`] walks the sequences first come, first served and gives each
//! what the token budget (`max_batch_tokens`) and the pool allow: one token for a
//! decoding sequence, a chunk of the prompt for a prefilling one (at most half the
//! budget while other sequences have work, so the next ones always get a share). A sequence enters
//! (admission) by attaching whatever prefix the index holds, then needs pages only for
//! the rest. When a sequence cannot get its pages, cached pages are evicted (the store
//! does that on reserve), then the newest sequence holding pages is preempted: its
//! pages are released and it is requeued to recompute its tokens later, which gives
//! the same logits (the batched step is deterministic), so its output does not change.
//! The planned chunks' slots are reserved right there, so the [`Plan`]'s batch runs
//! without allocating. [`Scheduler::update`] then samples from the step's logits,
//! forks `n > 1` samples and retires finished sequences. No sequence ever touches
//! another's pages.
//!
//! An embedding is a sequence like the others that never samples: every chunk of its
//! prompt asks for hidden states ([`Logits::Hidden`]), it attaches no cached prefix
//! (every row's state is wanted, as for prompt log-probabilities), and it retires
//! with its states once its prompt is computed, its pages released like a finished
//! request's (its full pages stay in the prefix index for others).
//!
//! Sliding windows: a page holds its tokens' K/V for every layer, so it can go only
//! when no layer reads it any more ([`crate::model::Config::kv_needed_from`]). Where
//! every layer slides (Mistral-style), after each commit and at admission a plain
//! request's table forgets the own committed pages wholly behind its window
//! (`PagedKv::forget`; they become cached like any released page), so a sequence holds
//! a bounded number of pages whatever its length and `check_fits` asks the pool for
//! that bound, not the whole sequence (`EngineConfig::free_window_pages`, on by
//! default; off gives the same bits). Models with global layers (Gemma) keep every
//! page: per-layer-group pages, which would free the local layers' K/V, are not done.
//! Context jobs never forget: a context reads its tokens back from its pages.

use super::error::EngineError;
use super::request::STEP_TOKEN_BOUNDS;
use super::seq::{After, Gen, GrammarSteps, Purpose, Seq};
use super::spec::{cost::RowCost, history::History, salt_key, SpecMode, SPEC_ROWS};
use crate::kv::{Batch, KvError, Logits, PageTable, PagedKv};
use crate::model::StepLogits;
use crate::tokenizer::Tokenizer;

/// Refuses up front a sample that could never finish: its prompt and `max_tokens`
/// (capped at the window) need more pages than the whole pool has. A sequence that
/// frees the pages its sliding window left holds at most `sliding` pages at once.
pub(crate) fn check_fits(
    kv: &PagedKv,
    window: usize,
    prompt: usize,
    max_tokens: usize,
    sliding: Option<usize>,
) -> Result<(), EngineError> {
    let longest = prompt.saturating_add(max_tokens).min(window);
    let needed = kv.pages_needed(longest, sliding);
    if !kv.fits(needed) {
        return Err(EngineError::TooLargeForPool {
            needed,
            pages: kv.num_pages(),
        });
    }
    Ok(())
}

/// Counters kept by the scheduler.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub prefix_hit_tokens: u64,
    pub prefilled_tokens: u64,
    pub generated_tokens: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub requests_done: u64,
    pub forks: u64,
    /// Pages plain requests gave up once out of every layer's sliding window.
    pub window_pages_released: u64,
    /// Steps by token rows (see [`super::request::STEP_TOKEN_BOUNDS`]), and the rows.
    pub step_tokens: [u64; STEP_TOKEN_BOUNDS.len() + 1],
    pub step_tokens_sum: u64,
    /// Samples chosen on the forward pass's threads ([`Scheduler::choose_ahead`]).
    pub samples_chosen_ahead: u64,
    /// Decode steps of a sample that carried a draft, tokens drafted, tokens accepted.
    pub spec_drafts: u64,
    pub spec_drafted_tokens: u64,
    pub spec_accepted_tokens: u64,
}

/// One planned step: `seqs[i]` is the index of the sequence that runs
/// `batch.seqs[i]`, whose slots are reserved. `drafts[i]` of its tokens (after the
/// first) are a draft to verify (see `engine/spec`).
pub(crate) struct Plan {
    pub seqs: Vec<usize>,
    pub batch: Batch,
    pub drafts: Vec<usize>,
}

/// How a [`Scheduler`] runs, fixed for its life: from the engine's configuration,
/// the model and the machine (`Core::new` makes it). No `Default`: the step's token
/// budget and the window come from those, and every knob below is set there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchedulerConfig {
    /// Token rows one step takes, all sequences together (`EngineConfig::max_batch_tokens`).
    pub max_batch_tokens: usize,
    /// The most tokens a sequence may hold.
    pub window: usize,
    /// Ask the grammar about single tokens before masking (`EngineConfig::grammar_checks`;
    /// off: always mask, the reference the tests compare with).
    pub grammar_checks: bool,
    /// The machine has a core the forward pass leaves idle, for grammar masks
    /// computed ahead.
    pub spare_core: bool,
    /// Threads that choose a step's samples (those of the forward pass, idle then); 1
    /// chooses them one after another.
    pub sample_threads: usize,
    /// The widest window when every layer of the model slides and plain requests free
    /// the pages it left (`EngineConfig::free_window_pages`); `None` otherwise.
    pub sliding_window: Option<usize>,
    /// Speculative decoding (`EngineConfig::speculative`).
    pub speculative: SpecMode,
}

/// The live sequences and the rules that run them.
pub(crate) struct Scheduler {
    cfg: SchedulerConfig,
    seqs: Vec<Seq>,
    next_arrival: u64,
    counters: Counters,
    /// How constrained samples are drawn, and their counts.
    grammar: GrammarSteps,
    /// Finished or failed sequences that belong to a context: the core hands their
    /// tables back (others release their pages here).
    retired: Vec<Seq>,
    /// Recent outputs per salt, which drafts may continue.
    history: History,
    /// What a row adds to a step here, which drafts must pay for.
    row_cost: RowCost,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        Self {
            seqs: Vec::new(),
            next_arrival: 0,
            counters: Counters::default(),
            grammar: GrammarSteps {
                checks: cfg.grammar_checks,
                spare_core: cfg.spare_core,
                checked: 0,
                masked: 0,
                masks_ahead: 0,
                masks_ahead_used: 0,
            },
            retired: Vec::new(),
            history: History::new(),
            row_cost: RowCost::default(),
            cfg,
        }
    }

    /// The most tokens a sequence may hold.
    pub fn window(&self) -> usize {
        self.cfg.window
    }

    /// The live sequences, running or waiting.
    pub fn seqs(&self) -> &[Seq] {
        &self.seqs
    }

    /// Finished or failed context jobs whose tables have not gone back yet.
    pub fn retired(&self) -> &[Seq] {
        &self.retired
    }

    /// Takes the retired context jobs, for the core to hand their tables back.
    pub fn take_retired(&mut self) -> Vec<Seq> {
        std::mem::take(&mut self.retired)
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// How constrained samples are drawn, and their counts.
    pub fn grammar(&self) -> &GrammarSteps {
        &self.grammar
    }

    /// The sequences of `plan` whose samples will likely need a grammar mask, for
    /// [`Scheduler::prepare_masks`] to compute while the forward pass runs; counted
    /// as masks computed ahead.
    pub fn masks_wanted(&mut self, plan: &Plan) -> Vec<usize> {
        let wanted: Vec<usize> = plan
            .seqs
            .iter()
            .zip(&plan.batch.seqs)
            .filter(|(i, step)| {
                step.logits != Logits::None && self.seqs[**i].wants_mask_ahead(&self.grammar)
            })
            .map(|(i, _)| *i)
            .collect();
        self.grammar.masks_ahead += wanted.len() as u64;
        wanted
    }

    /// Computes the grammar masks of sequences `wanted` (see [`Scheduler::masks_wanted`]).
    pub fn prepare_masks(&mut self, wanted: &[usize]) {
        for &i in wanted {
            self.seqs[i].prepare_mask();
        }
    }

    /// Fails the sequence just pushed before it ever ran (a context's job: it goes
    /// to the retired list for its table to go back, with no reply to record).
    pub fn refuse_last(&mut self, e: &EngineError) {
        let mut s = self.seqs.pop().expect("just pushed");
        if let Some(link) = s.ctx.as_mut() {
            // Nothing was generated: no reply to record.
            link.chat_reply = false;
        }
        s.fail(e);
        self.retired.push(s);
    }

    /// The most pages a plain sequence holds at once when it frees the pages its window
    /// left: after a step it keeps the `w - 1` positions before the next query, and a
    /// step adds at most `max_batch_tokens` positions after them.
    pub fn most_pages_held(&self, kv: &PagedKv) -> Option<usize> {
        self.cfg
            .sliding_window
            .map(|w| kv.most_pages_spanned(w - 1 + self.cfg.max_batch_tokens))
    }

    /// Every plain request gives up the committed pages that no later query reads
    /// (they become cached). Context jobs keep theirs: a context reads its tokens back
    /// from its pages. After each step's commit, and at admission (a prefix attached
    /// from the cache may reach far behind the window).
    pub fn forget_out_of_window(&mut self, kv: &mut PagedKv) {
        let Some(w) = self.cfg.sliding_window else {
            return;
        };
        for s in self.seqs.iter_mut().filter(|s| s.ctx.is_none()) {
            if let Some(t) = s.table.as_mut() {
                Self::forget(kv, t, w, &mut self.counters);
            }
        }
    }

    fn forget(kv: &mut PagedKv, t: &mut PageTable, w: usize, counters: &mut Counters) {
        match kv.forget(t, crate::model::Config::first_key(w, t.len())) {
            Ok(n) => counters.window_pages_released += n as u64,
            Err(e) => tracing::error!("releasing pages behind the sliding window: {e}"),
        }
    }

    /// Queues a sequence; `table` is what it already holds (a context's pages).
    pub fn push(
        &mut self,
        req: u64,
        tokens: Vec<u32>,
        salt: Option<Vec<u8>>,
        purpose: Purpose,
        ctx: Option<(super::seq::CtxLink, PageTable)>,
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
            arrived: std::time::Instant::now(),
            queued: None,
            purpose,
            ctx,
        });
    }

    /// Keeps a finished sample's output for later drafts under its salt.
    fn remember(&mut self, s: &Seq) {
        if self.cfg.speculative == SpecMode::Off {
            return;
        }
        if let Purpose::Generate(g) = &s.purpose {
            if g.spec.is_some() {
                let salt = salt_key(s.salt.as_deref());
                self.history
                    .record(salt, &s.tokens[s.prompt_len.min(s.tokens.len())..]);
            }
        }
    }

    /// Drops every sample of request `req` (its stream is gone), or stops a context's
    /// flush: its table goes back with what was computed, the rest pending again.
    pub fn cancel(&mut self, kv: &mut PagedKv, req: u64) {
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].req == req {
                let s = self.seqs.swap_remove(i);
                self.retire(kv, s);
            } else {
                i += 1;
            }
        }
    }

    /// Fails every sequence (the engine is stopping).
    pub fn fail_all(&mut self, kv: &mut PagedKv, e: &EngineError) {
        for mut s in std::mem::take(&mut self.seqs) {
            s.fail(e);
            self.retire(kv, s);
        }
    }

    /// Removes a sequence's claim on the pool: its pages go back, or (a context's) to
    /// the retired list for the core to return.
    fn retire(&mut self, kv: &mut PagedKv, mut s: Seq) {
        if s.ctx.is_some() {
            self.retired.push(s);
        } else if let Some(t) = s.table.take() {
            if let Err(e) = kv.release(t) {
                tracing::error!("releasing a finished sequence's pages: {e}");
            }
        }
    }

    /// Frees the pages of sequence `i` and requeues it to recompute.
    fn preempt(&mut self, kv: &mut PagedKv, i: usize) {
        if let Some(t) = self.seqs[i].table.take() {
            if let Err(e) = kv.release(t) {
                tracing::error!("releasing a preempted sequence's pages: {e}");
            }
            self.counters.preemptions += 1;
            tracing::debug!(req = self.seqs[i].req, "preempted");
        }
    }

    /// Whether a started sequence is still prefilling at least one more full page of
    /// tokens that sequence `i` starts with (so `i` will find them in the index).
    fn prefix_in_flight(&self, kv: &PagedKv, i: usize) -> bool {
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
            common.min(s.tokens.len() - 1) >= kv.page_end(t.len())
        })
    }

    /// Gives sequence `i` a page table holding the longest indexed prefix of its tokens.
    fn admit(&mut self, kv: &mut PagedKv, i: usize) {
        let s = &mut self.seqs[i];
        let mut t = kv.new_table(s.salt.as_deref());
        // Scoring and embeddings need every prompt row computed: no prefix attached.
        let hit = if s.computes_every_row() {
            0
        } else {
            kv.reuse_prefix(&mut t, &s.tokens)
        };
        // A context's job (readmitted after a preemption) keeps its pages.
        if let (Some(w), None) = (self.cfg.sliding_window, &s.ctx) {
            Self::forget(kv, &mut t, w, &mut self.counters);
        }
        s.queued.get_or_insert_with(|| s.arrived.elapsed());
        if s.cached.is_none() {
            s.cached = Some(hit.min(s.prompt_len));
            self.counters.prefix_hit_tokens += hit.min(s.prompt_len) as u64;
        }
        s.table = Some(t);
    }

    /// Plans one step: who runs how many tokens, with their slots reserved. `None` when
    /// nothing can run (a sequence that can never fit is failed then).
    pub fn schedule(&mut self, kv: &mut PagedKv) -> Option<Plan> {
        let mut order: Vec<usize> = (0..self.seqs.len()).collect();
        order.sort_by_key(|&i| (self.seqs[i].arrival, self.seqs[i].index));
        let mut budget = self.cfg.max_batch_tokens;
        let mut plan = Plan {
            seqs: Vec::new(),
            batch: Batch::default(),
            drafts: Vec::new(),
        };
        let mut admitting = true;
        let mut failed = Vec::new();
        // While others have work, one prompt's chunk takes at most half the step, so
        // a long prompt never holds a short one (or new decoders) out until it is done.
        let chunk_cap = if self.seqs.len() > 1 {
            (self.cfg.max_batch_tokens / 2).max(1)
        } else {
            self.cfg.max_batch_tokens
        };
        for at in 0..order.len() {
            let i = order[at];
            if budget == 0 {
                break;
            }
            if self.seqs[i].table.is_none() {
                let waits_for_prefix =
                    !self.seqs[i].computes_every_row() && self.prefix_in_flight(kv, i);
                if !admitting || waits_for_prefix {
                    // Another sequence is computing this one's prefix right now: wait
                    // for its pages to be committed, then attach them.
                    continue;
                }
                // Its prefix continues on disk: while others run, wait for the read
                // ahead (the files are read beside the steps, not in one).
                let others_run = self.seqs.iter().any(|s| s.table.is_some());
                let s = &self.seqs[i];
                if others_run
                    && !s.computes_every_row()
                    && kv.disk_prefetching(s.salt.as_deref(), &s.tokens)
                {
                    continue;
                }
                self.admit(kv, i);
            }
            let len = self.seqs[i].table.as_ref().expect("admitted").len();
            let mut c = self.seqs[i].pending().min(budget).min(chunk_cap);
            loop {
                let t = self.seqs[i].table.as_ref().expect("admitted");
                if kv.pages_to_grow(t, c) <= kv.num_available() {
                    break;
                }
                // Make room: preempt the newest sequence (after this one) holding pages.
                let newest = order[at + 1..]
                    .iter()
                    .rev()
                    .copied()
                    .find(|&j| self.seqs[j].table.is_some());
                match newest {
                    Some(j) => self.preempt(kv, j),
                    None => {
                        c = c.min(kv.room_to_grow(t));
                        break;
                    }
                }
            }
            if c == 0 {
                // This one waits, and so does everyone behind it (first come, first served).
                admitting = false;
                continue;
            }
            let s = &mut self.seqs[i];
            let logits = match s.purpose {
                // Scoring: every prompt row's logits, until the prompt is done.
                Purpose::Generate(_) if s.wants_prompt_logprobs() => Logits::All,
                Purpose::Generate(_) if len + c == s.tokens.len() => Logits::Last,
                // An embedding: every row's hidden state, no logits.
                Purpose::Embed(_) => Logits::Hidden,
                _ => Logits::None,
            };
            let t = s.table.as_mut().expect("admitted");
            match kv.plan(t, &s.tokens[len..len + c], logits) {
                Ok(step) => {
                    self.counters.prefilled_tokens +=
                        s.prompt_len.saturating_sub(len).min(c) as u64;
                    plan.seqs.push(i);
                    plan.batch.seqs.push(step);
                    plan.drafts.push(0);
                    budget -= c;
                }
                Err(KvError::OutOfPages { .. }) => admitting = false,
                Err(e) => failed.push((i, e)),
            }
        }
        // Retire what could not be planned, from the back, keeping the plan's indices.
        failed.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for (i, e) in failed {
            let last = self.seqs.len() - 1;
            let mut s = self.seqs.swap_remove(i);
            plan.seqs
                .iter_mut()
                .filter(|j| **j == last)
                .for_each(|j| *j = i);
            s.fail(&e.into());
            self.retire(kv, s);
        }
        if plan.seqs.is_empty() {
            self.unblock(kv);
            return None;
        }
        self.add_drafts(kv, &mut plan, budget);
        self.counters.steps += 1;
        let rows = plan.batch.num_tokens();
        let bucket = STEP_TOKEN_BOUNDS.partition_point(|&b| b < rows);
        self.counters.step_tokens[bucket] += 1;
        self.counters.step_tokens_sum += rows as u64;
        Some(plan)
    }

    /// A step of one sequence's `rows` rows (a decode row and its draft, every row
    /// taking logits) took `secs` seconds, forward pass and sampling: a measure of
    /// what a drafted row costs.
    pub fn observe_step(&mut self, rows: usize, secs: f64) {
        self.row_cost.observe(rows, secs);
    }

    /// What an added row costs a step, in one-row steps, as measured so far.
    pub fn row_cost(&self) -> f32 {
        self.row_cost.estimate()
    }

    /// Extends decoding samples' one-token steps with drafts while the step has few
    /// rows (`SPEC_ROWS`) and `budget` rows are left, each draft's slots reserved from
    /// free pages only (a draft never evicts a cached page or preempts anyone).
    fn add_drafts(&mut self, kv: &mut PagedKv, plan: &mut Plan, budget: usize) {
        if self.cfg.speculative == SpecMode::Off {
            return;
        }
        let mut room = SPEC_ROWS
            .saturating_sub(plan.batch.num_tokens())
            .min(budget);
        let row_cost = self.row_cost();
        for e in 0..plan.seqs.len() {
            if room == 0 {
                break;
            }
            let step = &mut plan.batch.seqs[e];
            let s = &mut self.seqs[plan.seqs[e]];
            if step.tokens.len() != 1 || step.logits != Logits::Last || s.pending() != 0 {
                continue;
            }
            let Purpose::Generate(g) = &mut s.purpose else {
                continue;
            };
            // Past its first token (which may fork `n > 1` samples), within its limits.
            let left = g.max_tokens.saturating_sub(g.generated);
            // Row r of the draft is sampled only while the sequence stays short of the
            // window: r <= window - 1 - len.
            let window_left = self.cfg.window.saturating_sub(s.tokens.len() + 1);
            let Some(spec) = g.spec.as_mut().filter(|_| g.generated > 0) else {
                continue;
            };
            let most = room.min(left.saturating_sub(1)).min(window_left);
            if most == 0 {
                continue;
            }
            let salt = salt_key(s.salt.as_deref());
            let draft = spec.draft(
                &s.tokens,
                s.prompt_len,
                most,
                (&self.history, salt),
                row_cost,
            );
            if draft.is_empty() {
                continue;
            }
            let t = s.table.as_mut().expect("planned");
            if kv.pages_to_grow(t, draft.len()) > kv.num_free() {
                continue;
            }
            let Ok(more) = kv.plan(t, &draft, Logits::All) else {
                continue;
            };
            step.tokens.extend_from_slice(&draft);
            step.pages = more.pages;
            step.logits = Logits::All;
            plan.drafts[e] = draft.len();
            room -= draft.len();
        }
    }

    /// Samples a verified draft's rows in order, as decode steps one at a time would,
    /// and stops at the first token that differs from the draft (or when the sample
    /// ends). The rows not used give their slots back; then the pages are committed.
    fn verify(
        &mut self,
        kv: &mut PagedKv,
        tok: &Tokenizer,
        i: usize,
        step: &crate::kv::SeqStep,
        drafted: usize,
        logits: &[f32],
    ) -> Result<After, EngineError> {
        let rows = drafted + 1;
        let vocab = logits.len() / rows;
        let s = &mut self.seqs[i];
        let (mut used, mut accepted) = (0, 0);
        let mut after = After::Continue;
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            used = r + 1;
            let before = s.tokens.len();
            after = s.sample(tok, row, self.cfg.window, &mut self.grammar);
            self.counters.generated_tokens += (s.tokens.len() - before) as u64;
            let matched =
                r < drafted && s.tokens.len() > before && s.tokens[before] == step.tokens[r + 1];
            accepted += usize::from(matched);
            if !matches!(after, After::Continue) || !matched {
                break;
            }
        }
        // Draft tokens compared with a sampled token (the sample may end before the
        // last). The rows kept are those sampled from: the step's first token and the
        // accepted draft tokens sampled after (a matched token that ended the sample
        // is never computed on).
        let judged = used.min(drafted);
        if let Purpose::Generate(g) = &mut s.purpose {
            if let Some(spec) = g.spec.as_mut() {
                spec.record(drafted, judged, accepted);
            }
        }
        self.counters.spec_drafts += 1;
        self.counters.spec_drafted_tokens += drafted as u64;
        self.counters.spec_accepted_tokens += accepted as u64;
        if let Some(t) = s.table.as_mut() {
            kv.abort(t, rows - used);
            kv.commit(t)
                .map_err(|e| EngineError::Internal(format!("committing pages: {e}")))?;
        }
        Ok(after)
    }

    /// Nothing could run: the oldest sequence holding pages (else the oldest) cannot fit
    /// even with every newer one preempted. It fails (the pool is too small for it); the
    /// rest go on.
    fn unblock(&mut self, kv: &mut PagedKv) {
        let key = |i: &usize| {
            let s = &self.seqs[*i];
            (s.table.is_none(), s.arrival, s.index)
        };
        let Some(i) = (0..self.seqs.len()).min_by_key(key) else {
            return;
        };
        let s = &self.seqs[i];
        let needed = kv.pages_for(s.tokens.len());
        let held = s.table.as_ref().map_or(0, |t| t.num_pages());
        let e = EngineError::PoolTooSmall {
            needed,
            available: held + kv.num_available(),
        };
        let mut s = self.seqs.swap_remove(i);
        s.fail(&e);
        self.retire(kv, s);
    }

    /// The planned step failed: its reserved slots go back and its sequences fail.
    pub fn fail_plan(&mut self, kv: &mut PagedKv, plan: Plan, e: &EngineError) {
        let mut idx = plan.seqs;
        for (&i, step) in idx.iter().zip(&plan.batch.seqs) {
            if let Some(t) = self.seqs[i].table.as_mut() {
                kv.abort(t, step.tokens.len());
            }
        }
        idx.sort_unstable_by(|a, b| b.cmp(a));
        for i in idx {
            let mut s = self.seqs.swap_remove(i);
            s.fail(e);
            self.retire(kv, s);
        }
    }

    /// After the model ran `plan`: commits its full pages, samples from `logits`, forks
    /// `n > 1` samples, and retires what finished.
    pub fn update(&mut self, kv: &mut PagedKv, tok: &Tokenizer, plan: Plan, logits: &StepLogits) {
        self.choose_ahead(&plan, logits);
        let mut done: Vec<(usize, Option<super::FinishReason>)> = Vec::new();
        let mut children = Vec::new();
        let steps = plan.seqs.iter().zip(logits.iter()).zip(&plan.batch.seqs);
        for (k, ((&i, l), step)) in steps.enumerate() {
            if plan.drafts[k] > 0 {
                match self.verify(kv, tok, i, step, plan.drafts[k], l) {
                    Ok(After::Continue) => {}
                    Ok(After::Finished(why)) => done.push((i, Some(why))),
                    Ok(After::Gone) => done.push((i, None)),
                    Err(e) => {
                        self.seqs[i].fail(&e);
                        done.push((i, None));
                    }
                }
                continue;
            }
            if let Some(t) = self.seqs[i].table.as_mut() {
                if let Err(e) = kv.commit(t) {
                    self.seqs[i].fail(&EngineError::Internal(format!("committing pages: {e}")));
                    done.push((i, None));
                    continue;
                }
            }
            if l.is_empty() {
                let pending = self.seqs[i].pending();
                match &mut self.seqs[i].purpose {
                    Purpose::Flush if pending == 0 => done.push((i, None)),
                    Purpose::Embed(e) => {
                        e.gather(step.start, logits.states(k));
                        if pending == 0 {
                            e.finish();
                            self.counters.requests_done += 1;
                            done.push((i, None));
                        }
                    }
                    _ => {}
                }
                continue;
            }
            let vocab = l.len() / step.logit_rows();
            if step.logits == Logits::All {
                self.seqs[i].gather_prompt_logprobs(step.start, l, vocab);
                if self.seqs[i].pending() > 0 {
                    continue; // a prompt chunk: nothing to sample yet
                }
            }
            // The last row is the one to sample from.
            let l = &l[l.len() - vocab..];
            children.extend(self.fork_samples(kv, tok, i, l));
            let before = self.seqs[i].tokens.len();
            match self.seqs[i].sample(tok, l, self.cfg.window, &mut self.grammar) {
                After::Continue => {}
                After::Finished(why) => done.push((i, Some(why))),
                After::Gone => done.push((i, None)),
            }
            // Nothing is sampled when only the prompt was to be scored.
            self.counters.generated_tokens += (self.seqs[i].tokens.len() - before) as u64;
        }
        // Retire from the back so indices stay valid.
        done.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (i, why) in done {
            let mut s = self.seqs.swap_remove(i);
            if let Some(why) = why {
                s.finish(why);
                self.counters.requests_done += 1;
                self.remember(&s);
            }
            if let (Purpose::Flush, Some(link)) = (&s.purpose, s.ctx.as_mut()) {
                if let Some(r) = link.flush_reply.take() {
                    let _ = r.send(Ok(()));
                }
            }
            self.retire(kv, s);
        }
        self.seqs.extend(children);
    }

    /// Chooses the step's next tokens on up to `sample_threads` threads, each sequence
    /// on one of them, before [`Scheduler::update`] records them in order: ranking a
    /// vocabulary, asking a grammar about tokens and masking cost tens to hundreds of
    /// µs per sample, which a batch of 16 would otherwise pay one after another while
    /// the forward pass's threads idle. Each choice touches only its own sequence's
    /// sampler and grammar, so the tokens are the ones a serial loop draws.
    fn choose_ahead(&mut self, plan: &Plan, logits: &StepLogits) {
        /// Fewer samples per thread than this are not worth a thread's start.
        const PER_THREAD: usize = 2;
        let mut rows: Vec<Option<&[f32]>> = vec![None; self.seqs.len()];
        for ((&i, l), step) in plan.seqs.iter().zip(logits.iter()).zip(&plan.batch.seqs) {
            if l.is_empty() || step.logits == Logits::All || !self.seqs[i].can_choose_ahead() {
                continue;
            }
            let vocab = l.len() / step.logit_rows();
            rows[i] = Some(&l[l.len() - vocab..]);
        }
        let n = rows.iter().flatten().count();
        let threads = self.cfg.sample_threads.min(n / PER_THREAD);
        if threads < 2 {
            return; // the serial loop chooses
        }
        let mut work: Vec<(&mut Seq, &[f32])> = self
            .seqs
            .iter_mut()
            .zip(rows)
            .filter_map(|(s, r)| r.map(|r| (s, r)))
            .collect();
        let mut base = self.grammar.clone();
        (base.checked, base.masked, base.masks_ahead_used) = (0, 0, 0);
        let run = |chunk: &mut [(&mut Seq, &[f32])], mut steps: GrammarSteps| {
            for (s, l) in chunk.iter_mut() {
                s.choose_ahead(l, &mut steps);
            }
            steps
        };
        let per = n.div_ceil(threads);
        let counts: Vec<GrammarSteps> = std::thread::scope(|sc| {
            let mut chunks = work.chunks_mut(per);
            let first = chunks.next().expect("two chunks at least");
            let others: Vec<_> = chunks
                .map(|c| {
                    let steps = base.clone();
                    sc.spawn(move || run(c, steps))
                })
                .collect();
            let mut counts = vec![run(first, base.clone())];
            for h in others {
                match h.join() {
                    Ok(c) => counts.push(c),
                    // As a panic on this thread would: choosing again could draw
                    // other tokens (a half-made choice may have used the stream).
                    Err(e) => std::panic::resume_unwind(e),
                }
            }
            counts
        });
        for c in counts {
            self.grammar.checked += c.checked;
            self.grammar.masked += c.masked;
            self.grammar.masks_ahead_used += c.masks_ahead_used;
        }
        self.counters.samples_chosen_ahead += n as u64;
    }

    /// The first time sample 0 of an `n > 1` request has its prompt's logits, the other
    /// samples fork its pages (no prefill of their own) and sample from the same logits.
    fn fork_samples(
        &mut self,
        kv: &mut PagedKv,
        tok: &Tokenizer,
        i: usize,
        logits: &[f32],
    ) -> Vec<Seq> {
        let s = &mut self.seqs[i];
        let Purpose::Generate(g) = &mut s.purpose else {
            return Vec::new();
        };
        let forks = std::mem::take(&mut g.forks);
        let (mut out, mut ended) = (Vec::new(), Vec::new());
        for k in forks {
            let mut params = g.sampler.params.clone();
            params.seed = params.seed.wrapping_add(k as u64);
            let mut gen = Gen::new(
                &params,
                g.text.stops(),
                g.max_tokens,
                g.ignore_eos,
                g.logprobs,
                g.tx.clone(),
            );
            // Each sample walks its own copy of the grammar, from the start.
            gen.grammar = g.grammar.clone();
            if let Some(spec) = &g.spec {
                gen.spec = Some(Box::new(spec.sibling()));
            }
            // Without a page for the copy of the partial page, the sample starts
            // from the prefix cache instead.
            let table = s.table.as_mut().and_then(|t| kv.fork(t).ok());
            self.counters.forks += u64::from(table.is_some());
            let mut child = Seq {
                req: s.req,
                index: k,
                arrival: s.arrival,
                salt: s.salt.clone(),
                tokens: s.tokens.clone(),
                prompt_len: s.prompt_len,
                cached: Some(s.prompt_len),
                arrived: s.arrived,
                queued: s.queued,
                table,
                purpose: Purpose::Generate(Box::new(gen)),
                ctx: None,
            };
            let before = child.tokens.len();
            let after = child.sample(tok, logits, self.cfg.window, &mut self.grammar);
            self.counters.generated_tokens += (child.tokens.len() - before) as u64;
            match after {
                After::Continue => out.push(child),
                After::Finished(why) => {
                    child.finish(why);
                    self.counters.requests_done += 1;
                    ended.push(child);
                }
                After::Gone => ended.push(child),
            }
        }
        for child in ended {
            self.retire(kv, child);
        }
        out
    }
}
