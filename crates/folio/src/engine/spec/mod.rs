//! Speculative decoding without a draft model: a decoding sample's next tokens are
//! guessed from text it has seen, and checked in the normal batched step.
//!
//! A guess (a *draft*) comes from the output the caller predicted, if any (OpenAI's
//! predicted outputs: followed while the output agrees with it, found again by n-gram
//! where it does not), from the sample's own prompt and output ([`lookup`]: the
//! longest recent n-gram that ends the sequence and occurred before, and what followed
//! it), or else from the server's recent outputs under the same cache salt
//! ([`history`]; tenants never learn from each other). The scheduler plans the draft as
//! extra rows of the sample's decode step, all rows' logits asked for; the step runs
//! beside other samples' decode rows and prefill chunks.
//!
//! Checking is sampling: row `r` of the step is sampled exactly as a plain decode step
//! at that position would be (the same sampler, the same random stream, the same
//! grammar and stop rules), and the walk stops at the first sampled token that differs
//! from the draft's. Because a row's logits are the same bits however the rows were
//! grouped into steps (the backend's contract), the tokens are exactly those of
//! decoding one at a time, greedy or sampled: a draft only changes how many tokens
//! one weight read yields. (The textbook acceptance rule keeps only the distribution;
//! with a drafter that proposes single tokens, drawing from the target and comparing
//! accepts with the same probability, `p(draft)`, and keeps the very tokens.) Rejected
//! rows' slots are given back before the step's pages are committed, so nothing else
//! ever sees them.
//!
//! [`adapt`] decides per sample how many tokens to draft, from its recent acceptance
//! and what a row costs on this machine ([`cost`], measured from the engine's own
//! steps), and the scheduler adds drafts only while a step has few rows (a step of
//! many rows is compute-bound: every extra row costs a row's compute).

pub(crate) mod adapt;
pub(crate) mod cost;
pub(crate) mod history;
pub(crate) mod lookup;

use adapt::{Adapt, Source};
use history::History;
use lookup::{Lookup, Prediction};
use std::sync::Arc;

/// Whether the engine drafts (`--spec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    /// Draft where the sample's recent acceptance says it pays, in steps of few rows.
    #[default]
    Auto,
    /// Never draft: one token per decode step.
    Off,
}

/// The most tokens one draft proposes.
pub const MAX_DRAFT: usize = 8;

/// A step with at least this many rows gets no drafts: its weights are read once for
/// many rows already, so a drafted row costs about what it could save.
pub const SPEC_ROWS: usize = 16;

/// One sample's drafting state: its n-gram index and its acceptance record.
pub(crate) struct SpecState {
    lookup: Lookup,
    adapt: Adapt,
    /// Where the draft being verified came from.
    source: Source,
    /// Tokens drafted for this sample, those accepted, and those accepted that came
    /// from the caller's prediction.
    pub drafted: usize,
    pub accepted: usize,
    pub accepted_predicted: usize,
}

impl SpecState {
    /// `prediction`: the output the caller expects (may be empty).
    pub fn new(prediction: Vec<u32>) -> Self {
        Self::with(Arc::new(Prediction::new(prediction)))
    }

    fn with(prediction: Arc<Prediction>) -> Self {
        Self {
            adapt: Adapt::new(),
            lookup: Lookup::with_prediction(prediction),
            source: Source::Predicted,
            drafted: 0,
            accepted: 0,
            accepted_predicted: 0,
        }
    }

    /// A fresh state for another sample of the same request (`n > 1`), sharing its
    /// prediction and the prediction's index.
    pub fn sibling(&self) -> Self {
        Self::with(self.lookup.prediction().clone())
    }

    /// Tokens in the caller's prediction.
    pub fn predicted_tokens(&self) -> usize {
        self.lookup.prediction().tokens.len()
    }

    /// A draft of at most `room` tokens continuing `tokens` (whose output starts at
    /// `out_start`), or none when no guess is worth its rows now, a row costing
    /// `row_cost` one-row steps. `history` holds the outputs of earlier samples under
    /// this sample's salt.
    pub fn draft(
        &mut self,
        tokens: &[u32],
        out_start: usize,
        room: usize,
        (history, salt): (&History, u64),
        row_cost: f32,
    ) -> Vec<u32> {
        if !self.adapt.ready() {
            return Vec::new();
        }
        let room = room.min(MAX_DRAFT);
        let found = self.lookup.propose(tokens, out_start, room).or_else(|| {
            let (d, n) = history.propose(salt, tokens, room)?;
            Some((d, Source::History(n)))
        });
        let Some((mut d, source)) = found else {
            return Vec::new();
        };
        d.truncate(self.adapt.choose(source, d.len(), row_cost));
        self.source = source;
        d
    }

    /// Records a verified draft: `drafted` tokens, of which `judged` were compared with
    /// a sampled token (the sample may end first) and the first `accepted` matched.
    pub fn record(&mut self, drafted: usize, judged: usize, accepted: usize) {
        self.drafted += drafted;
        self.accepted += accepted;
        if matches!(self.source, Source::Predicted | Source::PredictedNgram(_)) {
            self.accepted_predicted += accepted;
        }
        self.adapt.record(self.source, judged, accepted);
    }
}

/// A salt's key in the history (no salt is a salt of its own).
pub(crate) fn salt_key(salt: Option<&[u8]>) -> u64 {
    match salt {
        None => 0,
        Some(s) => xxhash_rust::xxh3::xxh3_64_with_seed(s, 1) | 1,
    }
}

/// The key of an n-gram of tokens.
pub(crate) fn ngram_key(seed: u64, gram: &[u32]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytemuck::cast_slice(gram), seed)
}
