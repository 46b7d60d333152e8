//! Token sampling: greedy, or repetition penalty → top-k → top-p → min-p →
//! temperature → a seeded draw (llama.cpp's default order).

use crate::rng::SplitMix64;

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// 1.0 means no nucleus cut.
    pub top_p: f32,
    /// 0.0 means no min-p cut.
    pub min_p: f32,
    /// 1.0 means no penalty.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window (OpenAI's
    /// presence penalty); 0.0 means none.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window (OpenAI's frequency penalty).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// A sampler with its own seeded random stream.
pub struct Sampler {
    pub params: SamplingParams,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = SplitMix64(params.seed ^ 0x5DEE_CE66_D1CE_4E5B);
        Self { params, rng }
    }

    /// Picks the next token from `logits`, given the tokens so far.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = self.params.clone();
        let mut l = logits.to_vec();
        if p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let start = history.len().saturating_sub(p.repeat_last_n);
            let mut seen = history[start..].to_vec();
            seen.sort_unstable();
            for run in seen.chunk_by(|a, b| a == b) {
                if let Some(v) = l.get_mut(run[0] as usize) {
                    if p.repeat_penalty != 1.0 {
                        *v = if *v > 0.0 {
                            *v / p.repeat_penalty
                        } else {
                            *v * p.repeat_penalty
                        };
                    }
                    *v -= p.presence_penalty + p.frequency_penalty * run.len() as f32;
                }
            }
        }
        if p.temperature <= 0.0 {
            return argmax(&l);
        }
        let mut cand: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        // Probabilities at temperature 1 for the top-p and min-p cuts.
        let probs = softmax_of(&cand, 1.0);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = cand.len();
            for (i, pr) in probs.iter().enumerate() {
                acc += pr;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let cut = probs[0] * p.min_p;
            let keep = probs
                .iter()
                .take(cand.len())
                .take_while(|&&pr| pr >= cut)
                .count();
            cand.truncate(keep.max(1));
        }
        let probs = softmax_of(&cand, p.temperature);
        let r = self.rng.unit_f32();
        let mut acc = 0.0;
        for (&(id, _), pr) in cand.iter().zip(&probs) {
            acc += pr;
            if r < acc {
                return id;
            }
        }
        cand.last().map_or(0, |c| c.0)
    }
}

fn softmax_of(cand: &[(u32, f32)], temp: f32) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    let e: Vec<f32> = cand.iter().map(|c| ((c.1 - max) / temp).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// The index of the largest value (the first one on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// log-softmax of `x` in f64, for log-probabilities.
pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_draws() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(&params), draw(&params));
        let other = SamplingParams {
            seed: 43,
            ..params.clone()
        };
        assert_ne!(draw(&params), draw(&other));
    }

    #[test]
    fn top_k_one_is_greedy_and_penalty_applies() {
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        assert_eq!(s.sample(&[1.0, 5.0, 2.0], &[]), 1);
        let mut g = Sampler::new(SamplingParams {
            repeat_penalty: 10.0,
            ..Default::default()
        });
        assert_eq!(g.sample(&[1.0, 5.0, 2.0], &[1]), 2);
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        for _ in 0..50 {
            assert_eq!(s.sample(&[10.0, 0.0, 0.0, 9.9], &[]) % 3, 0);
        }
    }
}
