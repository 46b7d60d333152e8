//! What callers hand the engine and what they get back: [`EngineConfig`],
//! [`Request`] (with the validation every surface shares: the CLI, the server and
//! library callers get the same rules and messages), the [`Event`]s of a stream,
//! [`Completion`]s gathered from one, and the [`EngineStats`] counters.

use super::error::EngineError;
use super::spec::SpecMode;
use crate::kv::{KvDtype, PoolShape};
use crate::model::sampler::{MAX_BIAS, MAX_LOGIT_BIAS};
use crate::model::{Model, SamplingParams};
use std::path::PathBuf;
use std::time::Duration;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Pages in the pool.
    pub kv_pages: usize,
    /// Token slots per page.
    pub page_size: usize,
    /// Most token rows in one forward step (decode tokens plus prefill chunks).
    pub max_batch_tokens: usize,
    /// The most tokens one sequence holds (prompt and generated); `None` or a larger
    /// value means the model's context length.
    pub max_seq_tokens: Option<usize>,
    /// Where snapshots persist (restored at start).
    pub snapshot_dir: Option<PathBuf>,
    /// Element type of the stored K/V.
    pub kv_dtype: KvDtype,
    /// When every layer of the model slides (Mistral-style), a plain request gives up
    /// the pages that left the window as it goes (they become cached). Off, each keeps
    /// all its pages until it ends (same results, more pages held).
    pub free_window_pages: bool,
    /// Under a grammar, ask it about single tokens and compute its mask of the whole
    /// vocabulary only where that does not decide the sample (see
    /// `Sampler::sample_constrained`: greedy and cut samples give the same tokens).
    /// Off, every constrained sample masks first: the reference the tests compare
    /// with.
    pub grammar_checks: bool,
    /// Choose a step's samples (ranking, grammar questions, masks) on the forward
    /// pass's threads, idle then, a sequence on one of them, and record them in order:
    /// each choice uses only its own sequence's sampler and grammar, so the tokens are
    /// those of choosing one after another. Off, one after another: the reference the
    /// tests compare with.
    pub parallel_sampling: bool,
    /// The most pages contexts and snapshots may hold together (counted once each,
    /// pending tokens included), so that idle contexts never take the pages requests
    /// need; `None`: no limit (one program's own contexts, as the CLI's); `folio
    /// serve` sets half the pool unless told otherwise.
    pub context_pages: Option<usize>,
    /// Most bytes all snapshot files together may hold (`--snapshot-max-bytes`); a
    /// save past it is refused and writes nothing (replacing a snapshot counts the
    /// difference; files restored at start count).
    pub snapshot_max_bytes: u64,
    /// Most snapshots kept (`--max-snapshots`); a save under a new name past it is
    /// refused.
    pub snapshot_max_count: usize,
    /// Speculative decoding without a draft model (`--spec`; see `engine/spec`): the
    /// output is the same token for token either way; `Auto` drafts where it pays.
    pub speculative: SpecMode,
    /// The disk tier under the pool (`--kv-disk`, see `kv::disk`): committed pages
    /// written behind to files and read back on a prefix hit, across restarts.
    pub kv_disk: Option<crate::kv::DiskConfig>,
    /// Where the prefix index's changes go (`folio serve --kv-events`; see
    /// `engine/events.rs`): `None`, nothing is recorded.
    pub kv_events: Option<super::events::KvEventTap>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_pages: 4096,
            page_size: 16,
            max_batch_tokens: 512,
            max_seq_tokens: None,
            snapshot_dir: None,
            kv_dtype: KvDtype::F16,
            free_window_pages: true,
            grammar_checks: true,
            parallel_sampling: true,
            context_pages: None,
            snapshot_max_bytes: 4 << 30,
            snapshot_max_count: 256,
            speculative: SpecMode::Auto,
            kv_disk: None,
            kv_events: None,
        }
    }
}

/// The most token rows one step may take (activations grow with it).
pub const MAX_BATCH_TOKENS: usize = 1 << 16;

impl EngineConfig {
    /// Checks every size against the model and the machine before anything is
    /// allocated; returns the pool's shape and the window (most tokens per sequence).
    /// Each error names the setting and its limit.
    pub fn validate(&self, model: &Model) -> Result<(PoolShape, usize), EngineError> {
        let bad = |name, reason: String| Err(EngineError::Config { name, reason });
        let ctx = model.config.context_length;
        let window = self.max_seq_tokens.unwrap_or(ctx).min(ctx);
        if window < 2 {
            return bad(
                "max_seq_tokens",
                format!("is {window}; it must be at least 2 (a prompt token and a generated one)"),
            );
        }
        if self.page_size == 0 || self.page_size > window {
            return bad(
                "page_size",
                format!(
                    "is {}; it must be between 1 and the longest sequence, {window} tokens",
                    self.page_size
                ),
            );
        }
        if self.max_batch_tokens == 0 || self.max_batch_tokens > MAX_BATCH_TOKENS {
            return bad(
                "max_batch_tokens",
                format!(
                    "is {}; it must be between 1 and {MAX_BATCH_TOKENS}",
                    self.max_batch_tokens
                ),
            );
        }
        let max_pages = crate::kv::MAX_PAGES;
        if self.kv_pages == 0 || self.kv_pages > max_pages {
            return bad(
                "kv_pages",
                format!("is {}; it must be between 1 and {max_pages}", self.kv_pages),
            );
        }
        let shape = model.pool_shape(self.kv_pages, self.page_size, self.kv_dtype);
        // K/V bytes, plus the page store's own record of each page's tokens.
        let per_page = (shape.page_bytes() as u64).saturating_add(4 * self.page_size as u64 + 96);
        let bytes = per_page.checked_mul(self.kv_pages as u64);
        let avail = crate::machine::available_memory();
        match (bytes, avail) {
            (None, _) => bad(
                "kv_pages",
                format!("{} pages overflow the address space", self.kv_pages),
            ),
            (Some(b), Some(a)) if b > a => bad(
                "kv_pages",
                format!(
                    "{} pages of {} bytes need {:.2} GiB; this machine has {:.2} GiB available",
                    self.kv_pages,
                    per_page,
                    b as f64 / (1u64 << 30) as f64,
                    a as f64 / (1u64 << 30) as f64
                ),
            ),
            _ => Ok((shape, window)),
        }
    }
}

/// A prompt: text (tokenized with the model's special-token rules) or token ids.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The prompt's token ids (text tokenized with the input cap), or why they cannot
    /// run: an id outside the vocabulary, text over the tokenizer's cap.
    pub fn tokens(&self, model: &Model) -> Result<Vec<u32>, EngineError> {
        let toks = match self {
            Prompt::Text(t) => model.tokenizer.try_encode(t, true)?,
            Prompt::Tokens(t) => t.clone(),
        };
        let vocab = model.config.vocab;
        if let Some(&bad) = toks.iter().find(|&&t| t as usize >= vocab) {
            return Err(crate::error::TokenizerError::UnknownId(bad).into());
        }
        Ok(toks)
    }
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
    /// Report the prompt's own log-probabilities (every token after the first, with
    /// this many alternatives) in one [`Event::PromptLogprobs`] before the first token:
    /// scoring and teacher forcing. The prompt is then computed in full, not taken
    /// from the prefix cache (a cached page has no logits). With this set,
    /// `max_tokens` may be 0: score the prompt, generate nothing. On a
    /// [`Context`](super::Context), only the request's own prompt tokens are scored
    /// (the context's earlier rows are computed already): a guest's drafted tokens
    /// checked in one pass.
    pub prompt_logprobs: Option<usize>,
    /// Independent samples of the same prompt; they fork the prompt's pages.
    pub n: usize,
    /// Tenant salt: requests with different salts never share KV pages.
    pub salt: Option<Vec<u8>>,
    /// Constrained decoding: only tokens this grammar allows are sampled, and the
    /// output ends when it is complete (see [`crate::grammar`]).
    pub grammar: Option<crate::grammar::Grammar>,
    /// Let the engine draft this request's tokens (when its `speculative` mode allows):
    /// the same output either way, only faster or not.
    pub speculative: bool,
    /// The output the caller expects (OpenAI's predicted outputs), as tokens: drafts
    /// follow it where the output agrees with it. It changes only the speed.
    pub prediction: Vec<u32>,
}

/// The most samples one request may ask for.
pub const MAX_N: usize = 128;
/// The most tokens a request's `prediction` may hold (its n-gram index, four entries per
/// token, is built on the engine thread at the request's first draft).
pub const MAX_PREDICTION: usize = 1 << 14;
/// The most alternatives per token a request may ask log-probabilities of.
pub const MAX_LOGPROBS: usize = 20;

impl Request {
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            n: 1,
            salt: None,
            grammar: None,
            speculative: true,
            prediction: Vec::new(),
        }
    }

    /// Checks every parameter; the error names the parameter and its allowed range.
    pub fn validate(&self) -> Result<(), EngineError> {
        let p = |name: &'static str, reason: String| EngineError::Param { name, reason };
        if self.max_tokens == 0 && self.prompt_logprobs.is_none() {
            return Err(p(
                "max_tokens",
                "must be at least 1 (0 only when scoring the prompt)".into(),
            ));
        }
        if self.n == 0 || self.n > MAX_N {
            return Err(p("n", format!("must be between 1 and {MAX_N}")));
        }
        if self.logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(p("logprobs", format!("must be at most {MAX_LOGPROBS}")));
        }
        if self.prediction.len() > MAX_PREDICTION {
            return Err(p(
                "prediction",
                format!(
                    "has {} tokens; at most {MAX_PREDICTION}",
                    self.prediction.len()
                ),
            ));
        }
        if self.prompt_logprobs.is_some_and(|k| k > MAX_LOGPROBS) {
            return Err(p(
                "prompt_logprobs",
                format!("must be at most {MAX_LOGPROBS}"),
            ));
        }
        let s = &self.sampling;
        let check = |name, v: f32, lo: f32, hi: f32, what: &str| {
            if v.is_finite() && v >= lo && v <= hi {
                Ok(())
            } else {
                Err(p(name, format!("is {v}; it must be {what}")))
            }
        };
        check(
            "temperature",
            s.temperature,
            0.0,
            f32::MAX,
            "a finite number ≥ 0 (0 = greedy)",
        )?;
        check("top_p", s.top_p, 0.0, 1.0, "between 0 and 1")?;
        check("min_p", s.min_p, 0.0, 1.0, "between 0 and 1")?;
        check(
            "repeat_penalty",
            s.repeat_penalty,
            f32::MIN_POSITIVE,
            f32::MAX,
            "a finite number of at least 1.1754944e-38, f32's smallest normal (1 = none)",
        )?;
        check(
            "presence_penalty",
            s.presence_penalty,
            -2.0,
            2.0,
            "between -2 and 2",
        )?;
        check(
            "frequency_penalty",
            s.frequency_penalty,
            -2.0,
            2.0,
            "between -2 and 2",
        )?;
        if s.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(p(
                "logit_bias",
                format!(
                    "has {} entries; at most {MAX_LOGIT_BIAS}",
                    s.logit_bias.len()
                ),
            ));
        }
        for &(id, b) in &s.logit_bias {
            if !(b.is_finite() && (-MAX_BIAS..=MAX_BIAS).contains(&b)) {
                return Err(p(
                    "logit_bias",
                    format!("token {id}'s bias is {b}; it must be between -100 and 100"),
                ));
            }
        }
        Ok(())
    }

    /// Checks the token ids the request names outside its prompt (`logit_bias`)
    /// against a vocabulary of `vocab` tokens (the engine calls it with its model's).
    pub fn validate_ids(&self, vocab: usize) -> Result<(), EngineError> {
        if let Some(&id) = self.prediction.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::Param {
                name: "prediction",
                reason: format!("token {id} is outside the vocabulary (0..{vocab})"),
            });
        }
        match self
            .sampling
            .logit_bias
            .iter()
            .find(|&&(id, _)| id as usize >= vocab)
        {
            Some(&(id, _)) => Err(EngineError::Param {
                name: "logit_bias",
                reason: format!("token {id} is outside the vocabulary (0..{vocab})"),
            }),
            None => Ok(()),
        }
    }
}

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    Eos,
    /// A stop string appeared.
    Stop,
    /// `max_tokens` were generated or the context is full.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
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
    /// Tokens drafted by speculative decoding, and those accepted (each accepted one
    /// saved a decode step; the output is the same either way).
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    /// Tokens of the request's `prediction`, and those the output took as drafts.
    pub prediction_tokens: usize,
    pub accepted_prediction_tokens: usize,
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
    /// The prompt's own log-probabilities, for prompt tokens `1..` (the first token
    /// has none), when the request asked for them; once per request, before any token.
    PromptLogprobs(Vec<TokenLogprob>),
    /// A sample ended; `text` is what was still held back (empty after a stop).
    /// `queued` is how long the request waited before it first got pages. `stop` is
    /// the stop string that ended it, where one did.
    Done {
        index: usize,
        text: String,
        finish: FinishReason,
        stop: Option<String>,
        usage: Usage,
        queued: Duration,
    },
    /// The request failed; nothing more comes. Tokens streamed before stay valid.
    Error(EngineError),
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
    /// Distinct pages held by snapshots (committed pages, counted there too).
    pub pages_pinned: usize,
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
    /// Forks made: `n > 1` samples and [`crate::Context::fork`].
    pub forks: u64,
    /// Pages plain requests gave up once they left every layer's sliding window
    /// (`EngineConfig::free_window_pages`).
    pub window_pages_released: u64,
    /// Steps by their token rows: `step_tokens[i]` steps had at most
    /// `STEP_TOKEN_BOUNDS[i]` rows (and more than the bound before); the last entry
    /// counts the steps above every bound.
    pub step_tokens: Vec<u64>,
    /// Token rows over all steps.
    pub step_tokens_sum: u64,
    /// Samples chosen on the forward pass's threads, several at once
    /// (`EngineConfig::parallel_sampling`).
    pub samples_chosen_ahead: u64,
    /// Constrained samples decided by asking the grammar about single tokens (no
    /// mask computed).
    pub grammar_checked: u64,
    /// Constrained samples drawn from logits masked by the grammar.
    pub grammar_masked: u64,
    /// Grammar masks computed ahead, beside the forward pass (for the samples whose
    /// previous sample needed one), and how many of them a sample used.
    pub grammar_masks_ahead: u64,
    pub grammar_masks_ahead_used: u64,
    /// Speculative decoding: samples' decode steps that carried a draft, the tokens
    /// drafted in them, and those accepted.
    pub spec_drafts: u64,
    pub spec_drafted_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// What a drafted row costs a decode step here, in one-row steps, as the engine
    /// fitted it from its one-sequence steps (`engine/spec/cost.rs`; a prior until
    /// measured). Drafts must pay for it.
    pub spec_row_cost: f32,
    /// The disk tier's figures, when it is on (`--kv-disk`).
    pub disk: Option<crate::kv::DiskStats>,
    /// What runs the forward steps ([`crate::model::Backend::describe`]) and its own
    /// figures (a GPU's device memory and transfers).
    pub backend: String,
    pub backend_figures: Vec<crate::model::BackendFigure>,
}

/// Bucket bounds of [`EngineStats::step_tokens`] (vLLM's for `iteration_tokens_total`).
pub const STEP_TOKEN_BOUNDS: [usize; 14] = [
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536,
];

/// One sample gathered from a stream.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    pub logprobs: Vec<TokenLogprob>,
    /// The prompt's log-probabilities, when asked for (the same for every sample).
    pub prompt_logprobs: Vec<TokenLogprob>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_parameters_out_of_range_are_refused_by_name() {
        let ok = Request::new(Prompt::Tokens(vec![1]));
        assert!(ok.validate().is_ok());
        type Case = (&'static str, fn(&mut Request));
        let cases: [Case; 13] = [
            ("logit_bias", |r| r.sampling.logit_bias = vec![(1, 100.5)]),
            ("logit_bias", |r| r.sampling.logit_bias = vec![(1, -101.0)]),
            ("logit_bias", |r| {
                r.sampling.logit_bias = vec![(1, f32::NAN)]
            }),
            ("logit_bias", |r| {
                r.sampling.logit_bias = vec![(1, 1.0); MAX_LOGIT_BIAS + 1]
            }),
            ("temperature", |r| r.sampling.temperature = -1.0),
            ("temperature", |r| r.sampling.temperature = f32::NAN),
            ("top_p", |r| r.sampling.top_p = 2.0),
            ("top_p", |r| r.sampling.top_p = f32::NAN),
            ("min_p", |r| r.sampling.min_p = f32::NAN),
            ("repeat_penalty", |r| r.sampling.repeat_penalty = 0.0),
            ("repeat_penalty", |r| r.sampling.repeat_penalty = f32::NAN),
            ("max_tokens", |r| r.max_tokens = 0),
            ("n", |r| r.n = 0),
        ];
        for (name, f) in cases {
            let mut r = ok.clone();
            f(&mut r);
            match r.validate() {
                Err(EngineError::Param { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let mut r = ok.clone();
        r.sampling.logit_bias = vec![(0, -100.0), (9, 100.0)];
        assert!(r.validate().is_ok());
        assert!(r.validate_ids(10).is_ok());
        match r.validate_ids(9) {
            Err(EngineError::Param { name, .. }) => assert_eq!(name, "logit_bias"),
            other => panic!("an id outside the vocabulary: {other:?}"),
        }
    }
}
