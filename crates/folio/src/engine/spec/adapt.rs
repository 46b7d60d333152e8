//! How many tokens a sample drafts: from its recent acceptance of drafts from the
//! same source, the draft length that gives the most tokens per unit of step time, or
//! none.
//!
//! With a per-token acceptance rate `a`, a draft of `k` tokens yields `1 + a + … + a^k`
//! tokens from one step, and costs `1 + c · k` decode steps, `c` a row's cost as the
//! engine measures it ([`super::cost`]). The sample drafts the `k` with the best ratio
//! when that beats 1 by `MARGIN`. Rates are kept per source ([`Source`]): a five-token
//! match in the prompt is followed far more often than a two-token one, and a caller's
//! prediction more than either. After two drafts in a row with nothing accepted, the
//! sample waits a number of steps that doubles with each failed try (free chat seldom
//! repeats itself, and then drafts almost never), then tries again from at least
//! `PROBE`.

use super::MAX_DRAFT;
/// The least gain (tokens per step-time) a draft must promise.
const MARGIN: f32 = 0.05;
/// The rate a source tries again from after waiting, and drifts to while declined.
const PROBE: f32 = 0.35;
/// Drafts in a row with nothing accepted before a sample waits.
const MISSES: u32 = 2;
/// Weight of the latest draft in a rate.
const WEIGHT: f32 = 0.3;
/// Steps a sample waits after its first failed try; doubled up to `MAX_WAIT`.
const FIRST_WAIT: u32 = 4;
const MAX_WAIT: u32 = 64;

/// Where a draft came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The caller's predicted output, followed while the output agrees with it.
    Predicted,
    /// What followed an n-gram (n ≥ 2) of the sample's own tokens.
    Own(usize),
    /// What followed an n-gram (n ≥ 2) of the prediction, where the output left it.
    PredictedNgram(usize),
    /// What followed an n-gram (n ≥ 3) in a recent output under the same salt.
    History(usize),
}

/// Sources told apart: the prediction, own n-grams of 2..=5, history of 3..=5.
const SOURCES: usize = 8;

impl Source {
    fn index(self) -> usize {
        match self {
            Source::Predicted => 0,
            Source::Own(n) | Source::PredictedNgram(n) => 1 + n.clamp(2, 5) - 2,
            Source::History(n) => 5 + n.clamp(3, 5) - 3,
        }
    }

    /// The rate a sample starts from: the caller's word, then longer matches first.
    fn prior(i: usize) -> f32 {
        [0.9, 0.35, 0.45, 0.55, 0.65, 0.4, 0.5, 0.6][i]
    }
}

pub(crate) struct Adapt {
    /// Per source: the estimated chance that a drafted token is accepted, given the
    /// ones before it were.
    rates: [f32; SOURCES],
    /// Steps still to wait before drafting again, and the next wait.
    wait: u32,
    backoff: u32,
    /// Drafts in a row with nothing accepted.
    misses: u32,
}

/// Tokens one step yields from a draft of `k` at per-token acceptance `a`, per unit
/// of step time, a drafted row costing `row_cost` one-row steps.
pub fn gain(a: f32, k: usize, row_cost: f32) -> f32 {
    let tokens: f32 = (0..=k).map(|i| a.powi(i as i32)).sum();
    tokens / (1.0 + row_cost * k as f32)
}

impl Adapt {
    pub fn new() -> Self {
        Self {
            rates: std::array::from_fn(Source::prior),
            wait: 0,
            backoff: FIRST_WAIT,
            misses: 0,
        }
    }

    /// Whether the sample may draft this step (false while it waits; the wait counts
    /// down).
    pub fn ready(&mut self) -> bool {
        if self.wait == 0 {
            return true;
        }
        self.wait -= 1;
        if self.wait == 0 {
            for r in &mut self.rates {
                *r = r.max(PROBE);
            }
        }
        false
    }

    /// How many of `available` tokens from `source` to draft, a drafted row costing
    /// `row_cost` one-row steps; 0: none this step.
    pub fn choose(&mut self, source: Source, available: usize, row_cost: f32) -> usize {
        let rate = &mut self.rates[source.index()];
        let a = *rate;
        let g = |k| gain(a, k, row_cost);
        let best = (1..=available.min(MAX_DRAFT)).max_by(|&x, &y| g(x).total_cmp(&g(y)));
        match best {
            Some(k) if g(k) >= 1.0 + MARGIN => k,
            _ => {
                // Declined: the rate drifts back so that the source is tried again.
                *rate += (PROBE - *rate) / 16.0;
                0
            }
        }
    }

    fn back_off(&mut self) {
        self.wait = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_WAIT);
        self.misses = 0;
    }

    /// A draft of `drafted` tokens from `source` had its first `accepted` accepted.
    pub fn record(&mut self, source: Source, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        // Tokens tried: every accepted one, and the first rejected (later ones were
        // never judged).
        let tried = accepted + usize::from(accepted < drafted);
        let seen = accepted as f32 / tried as f32;
        let rate = &mut self.rates[source.index()];
        *rate += (seen - *rate) * WEIGHT;
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
    pub fn rate(&self, source: Source) -> f32 {
        self.rates[source.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::spec::cost::ROW_COST;

    #[test]
    fn drafts_long_while_accepted_and_backs_off_when_not() {
        let src = Source::Own(3);
        let mut a = Adapt::new();
        for _ in 0..10 {
            assert!(a.ready());
            let k = a.choose(src, 8, ROW_COST);
            assert!(k > 0, "drafts at a good rate");
            a.record(src, k, k);
        }
        assert_eq!(a.choose(src, 8, ROW_COST), 8, "rate {}", a.rate(src));
        // A run of rejections: it stops drafting, then waits longer after each try.
        let mut a = Adapt::new();
        let mut drafted_steps = 0;
        for _ in 0..200 {
            if a.ready() {
                let k = a.choose(src, 8, ROW_COST);
                if k > 0 {
                    drafted_steps += 1;
                    a.record(src, k, 0);
                }
            }
        }
        assert!(
            drafted_steps <= 12,
            "drafted on {drafted_steps} of 200 steps"
        );
        assert!(drafted_steps > 2, "it keeps trying now and then");
    }

    #[test]
    fn each_source_keeps_its_own_rate() {
        let mut a = Adapt::new();
        for _ in 0..6 {
            let k = a.choose(Source::Own(2), 8, ROW_COST);
            if k > 0 {
                a.record(Source::Own(2), k, 0);
            }
            let k = a.choose(Source::Own(5), 8, ROW_COST);
            a.record(Source::Own(5), k, k);
            a.ready();
        }
        assert!(a.rate(Source::Own(2)) < 0.3, "{}", a.rate(Source::Own(2)));
        assert!(a.rate(Source::Own(5)) > 0.8);
        // A prediction is trusted from the start: the longest draft.
        assert_eq!(Adapt::new().choose(Source::Predicted, 8, ROW_COST), 8);
    }

    #[test]
    fn gain_is_one_without_a_draft_and_grows_with_the_rate() {
        assert_eq!(gain(0.3, 0, ROW_COST), 1.0);
        assert!(gain(0.9, 4, ROW_COST) > gain(0.5, 4, ROW_COST));
        assert!(gain(0.0, 3, ROW_COST) < 1.0);
        // Dearer rows: shorter drafts, and none at a middling rate.
        assert!(gain(0.5, 2, 0.4) < gain(0.5, 2, 0.1));
        let mut a = Adapt::new();
        assert!(a.choose(Source::Own(2), 8, 0.05) > 0);
        assert_eq!(a.choose(Source::Own(2), 8, 0.5), 0);
    }
}
