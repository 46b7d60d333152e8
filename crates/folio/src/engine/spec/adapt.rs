//! How many tokens a sample drafts: from its recent acceptance, the draft length that
//! gives the most tokens per unit of step time, or none.
//!
//! With a per-token acceptance rate `a`, a draft of `k` tokens yields `1 + a + … + a^k`
//! tokens from one step, and costs `1 + ROW_COST · k` decode steps. The sample drafts
//! the `k` with the best ratio when that beats 1 by `MARGIN`. After two drafts in a row
//! with nothing accepted, or when no length pays, it waits a number of steps that
//! doubles with each failed try (free chat seldom repeats itself, and then drafts almost
//! never), then tries again from at least `PROBE`.

use super::MAX_DRAFT;

/// A drafted row's cost in decode steps of one row. Measured on the default model
/// (docs/BENCHMARKS.md, "Speculative decoding"): a decode step of 1 + k rows takes
/// about 1 + 0.1 k one-row steps for small k on the AVX-512 and AVX2 paths.
pub const ROW_COST: f32 = 0.1;
/// The least gain (tokens per step-time) a draft must promise.
const MARGIN: f32 = 0.05;
/// The rate a sample starts from; with a predicted output, the caller's word.
const PRIOR: f32 = 0.5;
const PREDICTED: f32 = 0.9;
/// The rate a sample tries again from after waiting.
const PROBE: f32 = 0.35;
/// Drafts in a row with nothing accepted before a sample waits.
const MISSES: u32 = 2;
/// Weight of the latest draft in the rate.
const WEIGHT: f32 = 0.3;
/// Steps a sample waits after its first failed try; doubled up to `MAX_WAIT`.
const FIRST_WAIT: u32 = 4;
const MAX_WAIT: u32 = 64;

pub(crate) struct Adapt {
    /// Estimated chance that a drafted token is accepted, given the ones before it were.
    rate: f32,
    /// Steps still to wait before drafting again, and the next wait.
    wait: u32,
    backoff: u32,
    /// Drafts in a row with nothing accepted.
    misses: u32,
}

/// Tokens one step yields from a draft of `k` at per-token acceptance `a`, per unit
/// of step time.
pub fn gain(a: f32, k: usize) -> f32 {
    let tokens: f32 = (0..=k).map(|i| a.powi(i as i32)).sum();
    tokens / (1.0 + ROW_COST * k as f32)
}

impl Adapt {
    /// `predicted`: the caller gave the output it expects.
    pub fn new(predicted: bool) -> Self {
        Self {
            rate: if predicted { PREDICTED } else { PRIOR },
            wait: 0,
            backoff: FIRST_WAIT,
            misses: 0,
        }
    }

    /// The draft length to ask for now, at most `room`; `None`: no draft this step.
    pub fn next_k(&mut self, room: usize) -> Option<usize> {
        if self.wait > 0 {
            self.wait -= 1;
            if self.wait == 0 {
                self.rate = self.rate.max(PROBE);
            }
            return None;
        }
        let room = room.min(MAX_DRAFT);
        let best = (1..=room).max_by(|&a, &b| gain(self.rate, a).total_cmp(&gain(self.rate, b)))?;
        if gain(self.rate, best) < 1.0 + MARGIN {
            self.back_off();
            return None;
        }
        Some(best)
    }

    fn back_off(&mut self) {
        self.wait = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_WAIT);
        self.misses = 0;
    }

    /// No guess was found: nothing learnt.
    pub fn no_draft(&mut self) {}

    /// A draft of `drafted` tokens had its first `accepted` accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        // Tokens tried: every accepted one, and the first rejected (later ones were
        // never judged).
        let tried = accepted + usize::from(accepted < drafted);
        let seen = accepted as f32 / tried as f32;
        self.rate += (seen - self.rate) * WEIGHT;
        if accepted > 0 {
            self.backoff = FIRST_WAIT;
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= MISSES {
                self.back_off();
            }
        }
    }

    #[cfg(test)]
    pub fn rate(&self) -> f32 {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_long_while_accepted_and_backs_off_when_not() {
        let mut a = Adapt::new(false);
        for _ in 0..10 {
            let k = a.next_k(8).expect("drafts at a good rate");
            a.record(k, k);
        }
        assert_eq!(a.next_k(8), Some(8), "rate {}", a.rate());
        // A run of rejections: it stops drafting, then waits longer after each try.
        let mut a = Adapt::new(false);
        let mut drafted_steps = 0;
        for _ in 0..200 {
            if let Some(k) = a.next_k(8) {
                drafted_steps += 1;
                a.record(k, 0);
            }
        }
        assert!(
            drafted_steps <= 12,
            "drafted on {drafted_steps} of 200 steps"
        );
        assert!(drafted_steps > 2, "it keeps trying now and then");
    }

    #[test]
    fn gain_is_one_without_a_draft_and_grows_with_the_rate() {
        assert_eq!(gain(0.3, 0), 1.0);
        assert!(gain(0.9, 4) > gain(0.5, 4));
        assert!(gain(0.0, 3) < 1.0);
    }
}
