//! One sample the scheduler runs: its tokens (prompt, then generated), its page table
//! while it holds pages, and what it is for: generating (sampler, text, stop strings,
//! limits), only computing a context's pending tokens (a flush), or gathering every
//! prompt token's hidden state (an embedding).

use super::error::EngineError;
use super::request::{Event, FinishReason, TokenLogprob, Usage};
use super::spec::SpecState;
use super::text::TextOut;
use crate::kv::PageTable;
use crate::model::{sampler::log_softmax, Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most tokens a constrained sample asks the grammar about before it masks. A
/// question walks one token's bytes and a mask the whole vocabulary, some hundreds of
/// times longer; 256 (against 64) needs a mask for markedly fewer samples
/// (docs/BENCHMARKS.md, "Design measurements").
const MAX_CHECKS: usize = 256;

/// How constrained samples are drawn, and what that cost so far.
#[derive(Debug, Clone)]
pub(crate) struct GrammarSteps {
    /// Ask the grammar about single tokens before masking (off: always mask, the
    /// reference the tests compare with).
    pub checks: bool,
    /// The machine has a core the forward pass leaves idle, for masks computed ahead.
    pub spare_core: bool,
    /// Constrained samples decided by asking about single tokens: no mask computed.
    pub checked: u64,
    /// Constrained samples drawn from masked logits.
    pub masked: u64,
    /// Masks computed ahead, while the forward pass ran, and those a sample used.
    pub masks_ahead: u64,
    pub masks_ahead_used: u64,
}

/// `logits` with every token `gr` forbids at -inf (the mask computed ahead, or now);
/// `None` when no token is left.
fn masked(
    gr: &mut crate::grammar::Grammar,
    ready: Option<crate::grammar::Allowed>,
    logits: &[f32],
) -> Option<Vec<f32>> {
    let allowed = ready.or_else(|| gr.allowed())?;
    let mut l = logits.to_vec();
    allowed.apply(&mut l).then_some(l)
}

/// What a sample drew: its token (with the masked logits, where a mask was computed
/// or log-probabilities need them), or nothing, when the grammar allows no token.
#[derive(Debug)]
pub(crate) enum Chosen {
    Token {
        id: u32,
        masked_logits: Option<Vec<f32>>,
    },
    Nothing,
}

/// Draws the next token of `g` from `logits` after `tokens`. Under a grammar, the
/// sampler asks the grammar about single tokens where that decides the sample (no mask
/// computed); otherwise the grammar leaves only the tokens it allows. The figures
/// reported are those of the masked distribution. Touches only `g`'s own sampler and
/// grammar, so samples of different sequences may be chosen on different threads.
fn choose(g: &mut Gen, tokens: &[u32], logits: &[f32], steps: &mut GrammarSteps) -> Chosen {
    let ready = g.next_allowed.take();
    let mut masked_logits = None;
    let id = match g.grammar.as_mut() {
        None => g.sampler.sample(logits, tokens),
        Some(gr) => {
            let checked = if steps.checks {
                let mut allowed = |t: u32| match &ready {
                    Some(a) => a.contains(t),
                    None => gr.accepts(t),
                };
                g.sampler
                    .sample_constrained(logits, tokens, &mut allowed, MAX_CHECKS)
            } else {
                None
            };
            g.mask_ahead = checked.is_none();
            match checked {
                Some(id) => {
                    steps.checked += 1;
                    if g.logprobs.is_some() {
                        masked_logits = masked(gr, ready, logits);
                    }
                    id
                }
                None => {
                    steps.masked += 1;
                    steps.masks_ahead_used += u64::from(ready.is_some());
                    let Some(l) = masked(gr, ready, logits) else {
                        return Chosen::Nothing;
                    };
                    let id = g.sampler.sample(&l, tokens);
                    masked_logits = Some(l);
                    id
                }
            }
        }
    };
    Chosen::Token { id, masked_logits }
}

/// Where a request's events go: a function called on the engine thread, in order,
/// that says whether the receiver still listens (false cancels the request).
#[derive(Clone)]
pub(crate) struct Sink(Arc<dyn Fn(Event) -> bool + Send + Sync>);

impl Sink {
    pub fn new(f: impl Fn(Event) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Delivers `ev`; false when nobody listens any more.
    pub fn send(&self, ev: Event) -> bool {
        (self.0)(ev)
    }
}

impl From<Sender<Event>> for Sink {
    fn from(tx: Sender<Event>) -> Self {
        Self::new(move |ev| tx.send(ev).is_ok())
    }
}

/// A flush's or a context generation's way back to its context.
pub(crate) struct CtxLink {
    pub ctx: u64,
    /// Answered when a flush completes (generations report through their stream).
    pub flush_reply: Option<Sender<Result<(), EngineError>>>,
    /// A chat reply: recorded as the assistant's message when it ends.
    pub chat_reply: bool,
    /// A generation's context as it was before: restored unless the generation
    /// finishes (cancelled, failed or timed out: the context is left as it was).
    pub before: Option<Before>,
    /// The sample sent its final event.
    pub finished: bool,
}

/// What a context held before a generation into it (see [`CtxLink::before`]).
pub(crate) struct Before {
    /// Tokens held, computed and pending.
    pub len: usize,
    pub messages: Vec<crate::tokenizer::Message>,
    pub rendered: String,
}

/// What a sequence is computing for.
pub(crate) enum Purpose {
    Generate(Box<Gen>),
    Flush,
    Embed(Box<Embed>),
}

/// Where an embedding's states go when its prompt is computed (or its error).
pub(crate) type EmbedReply = Sender<Result<Vec<f32>, EngineError>>;

/// An embedding in progress: the hidden state of every prompt position computed so
/// far. Written by position, so a preempted sequence's recomputation overwrites
/// (with the same bits) what it had.
pub(crate) struct Embed {
    /// `dim` floats per prompt position.
    pub states: Vec<f32>,
    pub dim: usize,
    pub reply: Option<EmbedReply>,
}

impl Embed {
    pub fn new(prompt_len: usize, dim: usize, reply: EmbedReply) -> Self {
        Self {
            states: vec![0.0; prompt_len * dim],
            dim,
            reply: Some(reply),
        }
    }

    /// The states of positions `start..` (`dim` each), from one step.
    pub fn gather(&mut self, start: usize, states: &[f32]) {
        let at = start * self.dim;
        if let Some(dst) = self.states.get_mut(at..at + states.len()) {
            dst.copy_from_slice(states);
        }
    }

    /// Sends the states: the prompt is computed.
    pub fn finish(&mut self) {
        if let Some(r) = self.reply.take() {
            let _ = r.send(Ok(std::mem::take(&mut self.states)));
        }
    }
}

/// A prompt's log-probabilities being gathered: of the tokens at positions
/// `from..prompt_len` (`from` ≥ 1: the first token has nothing before it; a request
/// scores from 1, a context's generation from its own prompt's first token), each with
/// `k` alternatives, those of `from..from + got.len()` so far.
pub(crate) struct PromptScores {
    pub k: usize,
    pub from: usize,
    pub got: Vec<TokenLogprob>,
}

impl PromptScores {
    pub fn new(k: usize, from: usize) -> Self {
        Self {
            k,
            from: from.max(1),
            got: Vec::new(),
        }
    }
}

/// Generation state of one sample.
pub(crate) struct Gen {
    pub sampler: Sampler,
    pub text: TextOut,
    pub generated: usize,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub logprobs: Option<usize>,
    /// The prompt's own log-probabilities, while they are being gathered.
    pub prompt_logprobs: Option<PromptScores>,
    /// What the output must match, advanced by each sampled token.
    pub grammar: Option<crate::grammar::Grammar>,
    /// The grammar's tokens for the next sample, computed while the step ran.
    pub next_allowed: Option<crate::grammar::Allowed>,
    /// The last sample needed the grammar's mask: compute the next one ahead.
    pub mask_ahead: bool,
    /// The next token, chosen ahead by [`Seq::choose_ahead`] (on a thread of its own); the
    /// next [`Seq::sample`] records it instead of choosing.
    pub chosen: Option<Chosen>,
    pub tx: Sink,
    /// Samples still to fork from this one's prompt once it is computed (n > 1).
    pub forks: Vec<usize>,
    /// Drafting state, when the request allows speculative decoding.
    pub spec: Option<Box<SpecState>>,
}

pub(crate) struct Seq {
    pub req: u64,
    pub index: usize,
    /// Arrival order: first come, first served; the newest is preempted first.
    pub arrival: u64,
    pub salt: Option<Vec<u8>>,
    /// Prompt then generated tokens; the last one may not be computed yet.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The pages holding `tokens[..table.len()]`, while the sequence holds pages.
    pub table: Option<PageTable>,
    /// Prompt tokens found in the cache (or shared by a fork) at first admission.
    pub cached: Option<usize>,
    /// When the request arrived, and how long it waited for its first admission.
    pub arrived: Instant,
    pub queued: Option<Duration>,
    pub purpose: Purpose,
    pub ctx: Option<CtxLink>,
}

/// What happened after a sample was drawn.
pub(crate) enum After {
    Continue,
    Finished(FinishReason),
    /// The receiver is gone (cancel), or the sample failed and its receiver was
    /// told: retire it without a final event.
    Gone,
}

impl Gen {
    pub fn new(
        params: &SamplingParams,
        stop: &[String],
        max_tokens: usize,
        ignore_eos: bool,
        logprobs: Option<usize>,
        tx: Sink,
    ) -> Self {
        Self {
            sampler: Sampler::new(params.clone()),
            text: TextOut::new(stop),
            generated: 0,
            max_tokens,
            ignore_eos,
            logprobs,
            prompt_logprobs: None,
            grammar: None,
            next_allowed: None,
            mask_ahead: false,
            chosen: None,
            tx,
            forks: Vec::new(),
            spec: None,
        }
    }
}

impl Seq {
    /// Tokens still to compute.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.table.as_ref().map_or(0, |t| t.len())
    }

    pub fn usage(&self) -> Usage {
        let spec = match &self.purpose {
            Purpose::Generate(g) => g.spec.as_deref(),
            _ => None,
        };
        let (drafted_tokens, accepted_tokens, prediction_tokens, accepted_prediction_tokens) = spec
            .map_or((0, 0, 0, 0), |s| {
                (
                    s.drafted,
                    s.accepted,
                    s.predicted_tokens(),
                    s.accepted_predicted,
                )
            });
        Usage {
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached.unwrap_or(0),
            completion_tokens: self.tokens.len() - self.prompt_len,
            drafted_tokens,
            accepted_tokens,
            prediction_tokens,
            accepted_prediction_tokens,
        }
    }

    /// Samples the next token from `logits`, records and streams it, and says whether
    /// the sample goes on. `window` is the most tokens the sequence may hold.
    pub fn sample(
        &mut self,
        tok: &Tokenizer,
        logits: &[f32],
        window: usize,
        steps: &mut GrammarSteps,
    ) -> After {
        let Purpose::Generate(g) = &mut self.purpose else {
            return After::Continue;
        };
        if g.max_tokens == 0 {
            // Scoring only: the prompt's log-probabilities were the point.
            return After::Finished(FinishReason::Length);
        }
        let chosen = match g.chosen.take() {
            Some(c) => c,
            None => choose(g, &self.tokens, logits, steps),
        };
        let Chosen::Token { id, masked_logits } = chosen else {
            return self.grammar_failed();
        };
        // Under a grammar, end-of-sequence comes only when the output is complete.
        let eos = tok.is_eog(id) && (!g.ignore_eos || g.grammar.is_some());
        let mut grammar_done = false;
        if let (Some(gr), false) = (g.grammar.as_mut(), eos) {
            // Before the token is kept or sent: a token the grammar refuses never
            // reaches the output.
            if !gr.advance(id) {
                return self.grammar_failed();
            }
            grammar_done = gr.is_done();
        }
        let logits = masked_logits.as_deref().unwrap_or(logits);
        self.tokens.push(id);
        g.generated += 1;
        let logprob = g.logprobs.map(|k| token_logprob(logits, id, k));
        let (text, stopped) = if eos {
            (String::new(), false)
        } else {
            g.text.push(tok, id)
        };
        let event = Event::Token {
            index: self.index,
            id,
            text,
            logprob,
        };
        if !g.tx.send(event) {
            return After::Gone;
        }
        if eos {
            After::Finished(FinishReason::Eos)
        } else if stopped || grammar_done {
            After::Finished(FinishReason::Stop)
        } else if g.generated >= g.max_tokens || self.tokens.len() >= window {
            After::Finished(FinishReason::Length)
        } else {
            After::Continue
        }
    }

    /// Ends a sample whose grammar can go no further (an llguidance limit, its time
    /// budget, or no token allowed): its request gets the error, and the sample is
    /// retired without a final event. Other requests are untouched.
    fn grammar_failed(&mut self) -> After {
        let Purpose::Generate(g) = &mut self.purpose else {
            return After::Continue;
        };
        let e = g
            .grammar
            .as_ref()
            .and_then(|gr| gr.failure().cloned())
            .unwrap_or(crate::grammar::GrammarError::Engine);
        tracing::warn!(
            req = self.req,
            "the grammar failed: {e}: the request ends with an error"
        );
        g.tx.send(Event::Error(EngineError::Grammar(e)));
        After::Gone
    }

    /// Chooses the next token from `logits` ahead of [`Seq::sample`], which then records
    /// it: the engine chooses the samples of a step on several threads at once. Only
    /// for a sample past its first token (the first may fork `n > 1` samples, which
    /// must copy the grammar before it moves).
    pub fn choose_ahead(&mut self, logits: &[f32], steps: &mut GrammarSteps) {
        if let Purpose::Generate(g) = &mut self.purpose {
            if g.max_tokens > 0 && g.generated > 0 && g.chosen.is_none() {
                g.chosen = Some(choose(g, &self.tokens, logits, steps));
            }
        }
    }

    /// Whether [`Seq::choose_ahead`] would choose for it.
    pub fn can_choose_ahead(&self) -> bool {
        matches!(&self.purpose, Purpose::Generate(g) if g.max_tokens > 0 && g.generated > 0)
    }

    /// Computes the grammar's allowed tokens for the next sample ahead of time (the
    /// engine does it while the forward pass runs).
    pub fn prepare_mask(&mut self) {
        if let Purpose::Generate(g) = &mut self.purpose {
            if let (Some(gr), None) = (g.grammar.as_mut(), &g.next_allowed) {
                g.next_allowed = gr.allowed();
            }
        }
    }

    /// Whether the engine computes its next mask ahead: always when samples mask
    /// first (`checks` off); else only on a spare core, and when the last sample
    /// needed a mask (about half the time the next one does too, on the default
    /// model's JSON schemas: a mask computed for nothing costs some 300 µs of a core
    /// the forward pass would use).
    pub fn wants_mask_ahead(&self, steps: &GrammarSteps) -> bool {
        matches!(&self.purpose, Purpose::Generate(g) if g.grammar.is_some()
            && (!steps.checks || (steps.spare_core && g.mask_ahead)))
    }

    /// Whether every prompt row must be computed here (prompt log-probabilities
    /// still wanted, or an embedding's hidden states): no cached prefix is attached,
    /// nor waited for.
    pub fn computes_every_row(&self) -> bool {
        self.wants_prompt_logprobs() || matches!(&self.purpose, Purpose::Embed(_))
    }

    /// Whether the prompt's own log-probabilities are still being gathered (the
    /// prompt is computed in full then: a cached prefix has no logits to give).
    pub fn wants_prompt_logprobs(&self) -> bool {
        matches!(&self.purpose, Purpose::Generate(g) if g.prompt_logprobs.is_some())
    }

    /// Takes the prompt log-probabilities from a step's logits: `rows` rows of
    /// `vocab` logits for positions `start..`. Row `r` predicts the token at
    /// `start + r + 1`. Once every scored prompt token has its figure, they go out in
    /// one event (before the first sampled token).
    pub fn gather_prompt_logprobs(&mut self, start: usize, logits: &[f32], vocab: usize) {
        let Purpose::Generate(g) = &mut self.purpose else {
            return;
        };
        let Some(p) = &mut g.prompt_logprobs else {
            return;
        };
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let next = start + r + 1;
            // Rows before `from` (a context's earlier tokens) give nothing; a preempted
            // sequence recomputes rows it already gave: take each once.
            if next < self.prompt_len && next == p.from + p.got.len() {
                p.got.push(token_logprob(row, self.tokens[next], p.k));
            }
        }
        if p.from + p.got.len() >= self.prompt_len {
            let all = g.prompt_logprobs.take().expect("gathering").got;
            g.tx.send(Event::PromptLogprobs(all));
        }
    }

    /// Sends the sample's final event.
    pub fn finish(&mut self, why: FinishReason) {
        if let Some(link) = self.ctx.as_mut() {
            link.finished = true;
        }
        let usage = self.usage();
        if let Purpose::Generate(g) = &mut self.purpose {
            let text = if why == FinishReason::Stop {
                String::new()
            } else {
                g.text.finish()
            };
            let stop = g.text.matched().map(str::to_string);
            g.tx.send(Event::Done {
                index: self.index,
                text,
                finish: why,
                stop,
                usage,
                queued: self.queued.unwrap_or_default(),
            });
        }
    }

    /// Reports a failure to whoever waits on this sequence.
    pub fn fail(&mut self, e: &EngineError) {
        match &mut self.purpose {
            Purpose::Generate(g) => {
                g.tx.send(Event::Error(e.clone()));
            }
            Purpose::Flush => {
                if let Some(r) = self.ctx.as_mut().and_then(|c| c.flush_reply.take()) {
                    let _ = r.send(Err(e.clone()));
                }
            }
            Purpose::Embed(m) => {
                if let Some(r) = m.reply.take() {
                    let _ = r.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The log-probability of `id` under `logits`, and the `k` likeliest tokens (ties by
/// id, so the list is deterministic).
fn token_logprob(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut top: Vec<(u32, f32)> = lp
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v as f32))
        .collect();
    if k < top.len() {
        top.select_nth_unstable_by(k, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }
    // Only the k kept: a fresh, exact-size list (the vocabulary-sized one is freed
    // here, not held by every event that carries it).
    let mut top = top[..k.min(top.len())].to_vec();
    top.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    TokenLogprob {
        logprob: lp[id as usize] as f32,
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::token_logprob;

    /// F1 of the 2026-11-27 probe: each log-probability event held a vocabulary-sized
    /// buffer. The list kept is exactly the k asked for, in memory as in length.
    #[test]
    fn logprob_keeps_only_k_entries_in_memory() {
        let logits: Vec<f32> = (0..49_152)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        for k in [0, 1, 5, 20] {
            let lp = token_logprob(&logits, 3, k);
            assert_eq!(lp.top.len(), k);
            assert_eq!(lp.top.capacity(), k, "k = {k}");
        }
        let lp = token_logprob(&logits[..4], 1, 10);
        assert_eq!(lp.top.len(), 4);
    }
}
