//! [`Tally`]: a run's events gathered for an answer that is not streamed (each
//! choice's text, ids, log-probabilities and finish; the prompts' own
//! log-probabilities), and [`Counts`], the usage of one that is.

use crate::answer::{usage, Usage};
use crate::run::Tagged;
use folio::{Event, FinishReason, TokenLogprob};

/// One choice as it builds up.
#[derive(Default)]
pub struct Choice {
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<Option<TokenLogprob>>,
    pub finish: Option<FinishReason>,
    /// The stop string that ended it, where one did.
    pub stop: Option<String>,
}

/// A run's token counts: prompts once each (sample 0 reports them), completions of
/// every sample.
#[derive(Default)]
pub struct Counts {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative decoding: tokens drafted and accepted, every sample's; the
    /// prediction's tokens (sample 0's) and those the samples accepted.
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub prediction_tokens: usize,
    pub accepted_prediction_tokens: usize,
}

impl Counts {
    pub fn count(&mut self, ev: &Event) {
        if let Event::Done { index, usage, .. } = ev {
            self.completion_tokens += usage.completion_tokens;
            self.drafted_tokens += usage.drafted_tokens;
            self.accepted_tokens += usage.accepted_tokens;
            self.accepted_prediction_tokens += usage.accepted_prediction_tokens;
            if *index == 0 {
                self.prompt_tokens += usage.prompt_tokens;
                self.cached_tokens += usage.cached_tokens;
                self.prediction_tokens += usage.prediction_tokens;
            }
        }
    }

    pub fn usage(&self) -> Usage {
        usage(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
        )
        .with_drafts(self.drafted_tokens, self.accepted_tokens)
        .with_prediction(self.prediction_tokens, self.accepted_prediction_tokens)
    }
}

/// A run's events gathered for an answer that is not streamed: the choices (`n` per
/// prompt, choice `p * n + i`), the prompts' own log-probabilities, and the counts.
pub struct Tally {
    pub n: usize,
    pub choices: Vec<Choice>,
    pub prompt_logprobs: Vec<Option<Vec<TokenLogprob>>>,
    pub counts: Counts,
}

impl Tally {
    pub fn new(prompts: usize, n: usize) -> Self {
        Self {
            n,
            choices: (0..prompts * n).map(|_| Choice::default()).collect(),
            prompt_logprobs: vec![None; prompts],
            counts: Counts::default(),
        }
    }

    /// Takes one event (errors are the caller's to handle).
    pub fn add(&mut self, t: &Tagged) {
        self.counts.count(&t.event);
        match &t.event {
            Event::Token {
                index,
                id,
                text,
                logprob,
            } => {
                let c = &mut self.choices[t.prompt * self.n + index];
                c.text.push_str(text);
                c.ids.push(*id);
                c.logprobs.push(logprob.clone());
            }
            Event::Done {
                index,
                text,
                finish,
                stop,
                ..
            } => {
                let c = &mut self.choices[t.prompt * self.n + index];
                c.text.push_str(text);
                c.finish = Some(*finish);
                c.stop.clone_from(stop);
            }
            Event::PromptLogprobs(lp) => self.prompt_logprobs[t.prompt] = Some(lp.clone()),
            Event::Error(_) => {}
        }
    }

    pub fn usage(&self) -> Usage {
        self.counts.usage()
    }
}
