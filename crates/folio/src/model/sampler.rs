//! Token sampling: greedy, or repetition penalty → logit bias → top-k → top-p →
//! min-p → temperature → a seeded draw (llama.cpp's default order, with OpenAI's
//! `logit_bias` added to the logits after the penalties, before greedy too).
//!
//! Under a grammar, [`Sampler::sample_constrained`] asks the grammar about single
//! tokens (cheap) instead of masking the whole vocabulary (dear), where that provably
//! gives what sampling the masked logits gives.

use crate::rng::SplitMix64;
use std::borrow::Cow;

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
    /// OpenAI's `logit_bias`: (token id, bias) pairs, each bias added to its token's
    /// logit before every draw (greedy too), after the penalties. At most
    /// [`MAX_LOGIT_BIAS`] pairs of biases in -100..=100 (checked by
    /// `Request::validate`; the ids against the vocabulary when the engine takes the
    /// request). -100 effectively bans a token, +100 effectively forces it; under a
    /// grammar the bias only reorders the tokens the grammar allows.
    pub logit_bias: Vec<(u32, f32)>,
}

/// The most `logit_bias` entries one request may carry.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// The largest bias magnitude (OpenAI's range: -100..=100).
pub const MAX_BIAS: f32 = 100.0;

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
            logit_bias: Vec::new(),
        }
    }
}

/// The most rejection draws a constrained sample makes before it masks (see
/// [`Sampler::sample_constrained`]); each costs a random number and one question to
/// the grammar.
pub const REJECTION_DRAWS: usize = 8;

/// A sampler with its own seeded random stream.
pub struct Sampler {
    pub params: SamplingParams,
    rng: SplitMix64,
}

/// Which cut set the candidate list's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// None did: every token is a candidate.
    Vocab,
    TopK,
    TopP,
    MinP,
}

/// The candidates of a draw, best first, with their weights exp(l − l_best) at
/// temperature 1 (before top-k's cut, so the list may be shorter).
struct Shortlist {
    cand: Vec<(u32, f32)>,
    weights: Vec<f32>,
    end: End,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = SplitMix64(params.seed ^ 0x5DEE_CE66_D1CE_4E5B);
        Self { params, rng }
    }

    /// Picks the next token from `logits`, given the tokens so far. Greedy uses no
    /// random number; otherwise one number from the stream picks the token.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let l = self.penalized(logits, history);
        if self.params.temperature <= 0.0 {
            return argmax(&l);
        }
        let s = self.shortlist(&self.ranked(&l), l.len());
        self.draw(&s.cand)
    }

    /// Samples under a grammar without its mask: `allowed` says whether the grammar
    /// takes one token, and is asked about at most `max_checks` tokens down the
    /// ranking, plus at most `REJECTION_DRAWS + 1` for rejection draws.
    /// `None` means the caller must mask the logits and call [`Sampler::sample`].
    ///
    /// The token is the one `sample` gives for the masked logits with the same random
    /// number (none for greedy), found in one of these ways, in order:
    ///
    /// 1. Greedy: the best token the grammar allows, asking down the ranking.
    /// 2. The candidates left after the cuts are all allowed, and no mask could change
    ///    where the cuts end (see `mask_keeps`): one draw among them.
    /// 3. The masked candidates before the nucleus and min-p cuts are found by asking
    ///    down the ranking: the first k allowed (top-k), or with no nucleus cut those
    ///    until min-p cuts all later tokens. The cuts and one draw follow.
    ///
    /// Where none applies and there is no nucleus cut, nor a top-k cut that binds
    /// (the masked candidates are then the allowed ones among the unmasked ones):
    ///
    /// 4. Rejection: when the grammar takes the best token (which min-p is relative
    ///    to), up to [`REJECTION_DRAWS`] draws among the unmasked candidates, the
    ///    first the grammar takes standing. After as many refusals the caller masks
    ///    and `sample` draws once more: P(x) = p(x)·Σ_{t<R} (1 − p(A))^t +
    ///    (1 − p(A))^R·p(x)/p(A) = p(x)/p(A), the masked distribution exactly, from
    ///    another use of the stream than masking first would make.
    ///
    /// So a seed still gives the same tokens run after run: every choice here
    /// depends only on the logits and the grammar's state.
    pub fn sample_constrained(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: &mut dyn FnMut(u32) -> bool,
        max_checks: usize,
    ) -> Option<u32> {
        let l = self.penalized(logits, history);
        if l.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut asked: Vec<(u32, bool)> = Vec::new();
        let mut ask = |t: u32| match asked.iter().find(|a| a.0 == t) {
            Some(a) => a.1,
            None => {
                let a = allowed(t);
                asked.push((t, a));
                a
            }
        };
        let finite = |c: &(u32, f32)| c.1 > f32::NEG_INFINITY;
        if self.params.temperature <= 0.0 {
            let first = best(&l, max_checks).into_iter().find(|c| ask(c.0))?;
            return finite(&first).then_some(first.0);
        }
        let ranked = self.ranked(&l);
        if !ranked.first().is_some_and(finite) {
            return None;
        }
        let s = self.shortlist(&ranked, l.len());
        if s.cand.len() <= max_checks && self.mask_keeps(&s) && s.cand.iter().all(|c| ask(c.0)) {
            return Some(self.draw(&s.cand));
        }
        if let Some(kept) = self.scan(&l, &ranked, l.len(), &mut ask, max_checks) {
            if !kept.first().is_some_and(finite) {
                return None;
            }
            let s = self.shortlist(&kept, kept.len());
            return Some(self.draw(&s.cand));
        }
        let p = &self.params;
        if p.top_p >= 1.0 && matches!(s.end, End::Vocab | End::MinP) {
            // Min-p is relative to the best token; masked, to the best allowed one.
            if s.end == End::MinP && !ask(s.cand[0].0) {
                return None;
            }
            let probs = softmax_of(&s.cand, p.temperature);
            for _ in 0..REJECTION_DRAWS {
                let x = self.pick(&s.cand, &probs);
                if ask(x) {
                    return Some(x);
                }
            }
        }
        None
    }

    /// Whether masking tokens outside `s` leaves the same candidates, when all of
    /// `s`'s are allowed.
    ///
    /// NOTE: masked, `s`'s tokens come first in the same order with the same
    /// weights (the best token is among them), and each later one weighs no more
    /// than the unmasked token of its rank, so the list's total weight can only
    /// fall. Then the masked list is never shorter if even with no weight but `s`'s
    /// own the nucleus would not end before `s`'s last token; and never longer if a
    /// cut ended `s`: top-k (the masked list keeps k), top-p (the masked nucleus
    /// fills no later) or min-p (relative to the same best token, and every later
    /// token fails it too). Float sums and quotients are monotone, so this holds bit
    /// for bit.
    fn mask_keeps(&self, s: &Shortlist) -> bool {
        let n = s.cand.len();
        let p = &self.params;
        if s.end == End::Vocab {
            return false;
        }
        if n <= 1 || p.top_p >= 1.0 {
            return true;
        }
        let total: f32 = s.weights[..n].iter().sum();
        let mut acc = 0.0f32;
        for w in &s.weights[..n - 1] {
            acc += w / total;
        }
        acc < p.top_p
    }

    /// The masked candidates before the nucleus and min-p cuts, found by asking down
    /// the ranking of `l` (`ranked`, its head so far, is ranked further as needed):
    /// the first k allowed tokens, or fewer where the rest cannot matter: with no
    /// nucleus cut, once a token fails min-p against the best allowed one (as would
    /// every later token); with a nucleus cut under top-k, once its end is known
    /// (`nucleus_settled`). `None` when none of these ends within `max_checks` tokens.
    fn scan(
        &self,
        l: &[f32],
        ranked: &[(u32, f32)],
        vocab: usize,
        ask: &mut dyn FnMut(u32) -> bool,
        max_checks: usize,
    ) -> Option<Vec<(u32, f32)>> {
        let p = &self.params;
        let k = if p.top_k > 0 && p.top_k < vocab {
            p.top_k
        } else {
            usize::MAX
        };
        let early = p.top_p >= 1.0 && p.min_p > 0.0;
        let nucleus = p.top_p < 1.0 && k < usize::MAX;
        if k == usize::MAX && !early {
            return None;
        }
        let mut kept: Vec<(u32, f32)> = Vec::new();
        let mut ranked = std::borrow::Cow::Borrowed(ranked);
        for i in 0..max_checks {
            // Past the head ranked so far: rank as far as the questions may go.
            if i + 1 >= ranked.len() && ranked.len() < vocab {
                ranked = std::borrow::Cow::Owned(best(l, (max_checks + 1).min(vocab)));
            }
            let Some(&c) = ranked.get(i) else {
                break;
            };
            if let (true, Some(b)) = (early, kept.first()) {
                if (c.1 - b.1).exp() < p.min_p {
                    return Some(kept);
                }
            }
            if ask(c.0) {
                kept.push(c);
                if kept.len() == k {
                    return Some(kept);
                }
            }
            if nucleus && i + 1 < ranked.len() && self.nucleus_settled(&kept, ranked[i + 1].1, k) {
                return Some(kept);
            }
        }
        // The whole vocabulary was asked about: every allowed token is kept.
        (ranked.len() == vocab && !kept.is_empty()).then_some(kept)
    }

    /// Whether the nucleus of the masked top-k list ends inside `kept`, its first
    /// tokens, at the same token as it ends in `kept` alone. The rest of the list are
    /// at most `k - kept.len()` tokens weighing no more than the next one asked
    /// about, the one of logit `next`; so its total weight lies between `kept`'s and
    /// that plus as many copies of the next token's weight, and a later total only
    /// ends the nucleus later. Same ends at both bounds: the end is known.
    fn nucleus_settled(&self, kept: &[(u32, f32)], next: f32, k: usize) -> bool {
        let Some(best) = kept.first().map(|c| c.1) else {
            return false;
        };
        let w: Vec<f32> = kept.iter().map(|c| (c.1 - best).exp()).collect();
        let low: f32 = w.iter().sum();
        let mut high = low;
        let tail = (next - best).exp();
        for _ in kept.len()..k {
            high += tail;
        }
        let top_p = self.params.top_p;
        let end = |total: f32| {
            let mut acc = 0.0f32;
            w.iter().position(|x| {
                acc += x / total;
                acc >= top_p
            })
        };
        matches!((end(low), end(high)), (Some(a), Some(b)) if a == b)
    }

    fn penalized<'a>(&self, logits: &'a [f32], history: &[u32]) -> Cow<'a, [f32]> {
        let p = &self.params;
        let penalties =
            p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if !penalties && p.logit_bias.is_empty() {
            // No copy of the vocabulary's logits per sample where nothing changes them.
            return Cow::Borrowed(logits);
        }
        let mut l = logits.to_vec();
        if penalties {
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
        // A masked (-inf) logit stays masked whatever its bias: a bias never lets a
        // token the grammar forbids through.
        for &(id, b) in &p.logit_bias {
            if let Some(v) = l.get_mut(id as usize) {
                *v += b;
            }
        }
        Cow::Owned(l)
    }

    /// The tokens best first (ties by id): the best k under a top-k cut, else all.
    fn ranked(&self, l: &[f32]) -> Vec<(u32, f32)> {
        let k = self.params.top_k;
        if k > 0 && k < l.len() {
            best(l, k)
        } else {
            best(l, l.len())
        }
    }

    /// top-k, then top-p on probabilities at temperature 1, then min-p (relative to
    /// the best token, on the weights themselves, so no normalisation enters it),
    /// over `ranked`, the head of a `vocab`-token ranking.
    fn shortlist(&self, ranked: &[(u32, f32)], vocab: usize) -> Shortlist {
        let p = &self.params;
        let mut cand = ranked.to_vec();
        let mut end = End::Vocab;
        if p.top_k > 0 && p.top_k < vocab {
            cand.truncate(p.top_k);
            end = End::TopK;
        }
        let max = cand.first().map_or(0.0, |c| c.1);
        let weights: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        if p.top_p < 1.0 {
            let total: f32 = weights.iter().sum();
            let mut acc = 0.0;
            for (i, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= p.top_p {
                    cand.truncate(i + 1);
                    end = End::TopP;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let cut = weights.first().map_or(0.0, |w| w * p.min_p);
            let keep = weights
                .iter()
                .take(cand.len())
                .take_while(|&&w| w >= cut)
                .count()
                .max(1);
            if keep < cand.len() {
                cand.truncate(keep);
                end = End::MinP;
            }
        }
        Shortlist { cand, weights, end }
    }

    /// One number from the stream picks among `cand` at the temperature. A number
    /// past the last rounded sum picks the last candidate of any probability (never
    /// one a mask left at zero).
    fn draw(&mut self, cand: &[(u32, f32)]) -> u32 {
        let probs = softmax_of(cand, self.params.temperature);
        self.pick(cand, &probs)
    }

    /// [`Sampler::draw`] with the probabilities at the temperature given.
    fn pick(&mut self, cand: &[(u32, f32)], probs: &[f32]) -> u32 {
        let r = self.rng.unit_f32();
        let mut acc = 0.0;
        let mut last = cand.first().map_or(0, |c| c.0);
        for (&(id, _), &pr) in cand.iter().zip(probs) {
            acc += pr;
            if r < acc {
                return id;
            }
            if pr > 0.0 {
                last = id;
            }
        }
        last
    }
}

/// The best `m` of `l`, best first, ties by id: what sorting all and keeping `m`
/// gives, in one pass that mostly costs a comparison per token.
fn best(l: &[f32], m: usize) -> Vec<(u32, f32)> {
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut all: Vec<(u32, f32)>;
    if m >= l.len() {
        all = l.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        all.sort_unstable_by(order);
        return all;
    }
    all = Vec::with_capacity(m + 1);
    for (i, &v) in l.iter().enumerate() {
        let c = (i as u32, v);
        if all.len() == m && all.last().is_none_or(|w| order(&c, w).is_ge()) {
            continue;
        }
        let at = all.partition_point(|x| order(x, &c).is_lt());
        all.insert(at, c);
        all.truncate(m);
    }
    all
}

fn softmax_of(cand: &[(u32, f32)], temp: f32) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    let e: Vec<f32> = cand.iter().map(|c| ((c.1 - max) / temp).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// The index of the largest value (the first one on ties; NaNs are passed over, and a
/// NaN first value is the answer, as a scan keeping the first largest gives).
///
/// Two passes the compiler vectorizes: the largest value, by sixteen running maxima
/// (each lane a plain compare-and-keep), then the first index holding it. A scan
/// keeping the index as it goes does not vectorize, and batched greedy decode runs
/// it over 49152 logits per sequence per step.
pub fn argmax(x: &[f32]) -> u32 {
    const LANES: usize = 16;
    if x.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut max = x[0];
    for &v in lanes.iter().chain(tail) {
        max = if v > max { v } else { max };
    }
    x.iter().position(|&v| v == max).unwrap_or(0) as u32
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

    /// The two-pass argmax gives the index a scan keeping the first largest value
    /// gives: ties, NaNs (first or not), infinities, signed zeros, every length's tail.
    #[test]
    fn argmax_is_the_first_largest_as_a_scan_finds_it() {
        fn scan(x: &[f32]) -> u32 {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            best as u32
        }
        let mut rng = crate::rng::SplitMix64(9);
        let pick = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.0,
        ];
        for len in 0..70 {
            for _ in 0..50 {
                let x: Vec<f32> = (0..len)
                    .map(|_| match rng.below(3) {
                        0 => pick[rng.below(pick.len() as u64) as usize],
                        _ => (rng.below(5) as f32) - 2.0,
                    })
                    .collect();
                assert_eq!(argmax(&x), scan(&x), "{x:?}");
            }
        }
        assert_eq!(argmax(&[]), 0);
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

    /// Random logits (some ties) and a random allowed set of a given density.
    fn case(rng: &mut SplitMix64, vocab: usize, density: f32) -> (Vec<f32>, Vec<bool>) {
        let logits = (0..vocab)
            .map(|_| (rng.signed_f32() * 8.0 * 4.0).round() / 4.0)
            .collect();
        let allowed = (0..vocab).map(|_| rng.unit_f32() < density).collect();
        (logits, allowed)
    }

    fn masked(logits: &[f32], allowed: &[bool]) -> Vec<f32> {
        logits
            .iter()
            .zip(allowed)
            .map(|(&l, &a)| if a { l } else { f32::NEG_INFINITY })
            .collect()
    }

    /// Where no rejection draw can happen (greedy, or a nucleus cut), sampling under
    /// a grammar by asking about single tokens gives the token that sampling the
    /// masked logits gives, from the same random stream; `None` uses no number.
    #[test]
    fn constrained_sampling_is_identical_to_masking_first() {
        let mut rng = SplitMix64(11);
        let mut decided = 0;
        let mut trials = 0;
        for (temperature, top_k, top_p, min_p) in [
            (0.0, 0, 1.0, 0.0),
            (0.8, 40, 0.95, 0.05),
            (1.0, 10, 0.9, 0.0),
            (0.7, 0, 0.8, 0.1),
            (1.2, 5, 0.5, 0.2),
            (1.0, 1, 0.9, 0.0),
        ] {
            for trial in 0..400 {
                let density = [0.02, 0.3, 0.9, 1.0][trial % 4];
                let vocab = [7, 100, 3000][trial % 3];
                let (logits, allowed) = case(&mut rng, vocab, density);
                let history: Vec<u32> = (0..5).map(|i| (i * 13 % vocab) as u32).collect();
                let params = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repeat_penalty: 1.1,
                    seed: trial as u64,
                    ..Default::default()
                };
                let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
                let mut asked = 0;
                let mut ask = |t: u32| {
                    asked += 1;
                    allowed[t as usize]
                };
                let got = a.sample_constrained(&logits, &history, &mut ask, 64);
                assert!(asked <= 64);
                let m = masked(&logits, &allowed);
                if !allowed.iter().any(|&x| x) {
                    assert_eq!(got, None);
                    continue;
                }
                trials += 1;
                let want = b.sample(&m, &history);
                match got {
                    Some(t) => {
                        decided += 1;
                        assert_eq!(t, want, "trial {trial}");
                    }
                    None => assert_eq!(a.sample(&m, &history), want, "trial {trial}"),
                }
                assert_eq!(a.rng.next_u64(), b.rng.next_u64(), "the streams part");
            }
        }
        assert!(decided > trials / 3, "{decided} of {trials} decided");
    }

    /// With no nucleus cut, a rejection draw stands only on an allowed token, and the
    /// tokens it gives follow the masked distribution (checked against the exact
    /// probabilities on a small vocabulary).
    #[test]
    fn rejection_draws_follow_the_masked_distribution() {
        let logits = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5];
        let allowed = [false, true, true, false, true, true];
        let m = masked(&logits, &allowed);
        for min_p in [0.0, 0.3] {
            let params = SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p,
                seed: 5,
                ..Default::default()
            };
            let mut s = Sampler::new(params);
            let mut counts = [0usize; 6];
            let n = 200_000;
            for _ in 0..n {
                let t = match s.sample_constrained(&logits, &[], &mut |t| allowed[t as usize], 64) {
                    Some(t) => t,
                    None => s.sample(&m, &[]),
                };
                assert!(allowed[t as usize]);
                counts[t as usize] += 1;
            }
            // The masked distribution: min-p relative to the best allowed token.
            let best = logits[1];
            let w: Vec<f64> = (0..6)
                .map(|i| {
                    let keep = allowed[i] && ((logits[i] - best).exp() >= min_p);
                    if keep {
                        (logits[i] as f64).exp()
                    } else {
                        0.0
                    }
                })
                .collect();
            let z: f64 = w.iter().sum();
            for i in 0..6 {
                let p = w[i] / z;
                let got = counts[i] as f64 / n as f64;
                assert!(
                    (got - p).abs() < 0.005,
                    "min_p {min_p} token {i}: {got} vs {p}"
                );
            }
        }
    }

    #[test]
    fn best_is_the_head_of_the_full_ranking() {
        let mut rng = SplitMix64(3);
        for m in [0, 1, 5, 64, 99, 100, 150] {
            let (l, _) = case(&mut rng, 100, 0.0);
            let all = best(&l, l.len());
            assert_eq!(best(&l, m), all[..m.min(100)].to_vec());
        }
    }

    fn biased(logit_bias: Vec<(u32, f32)>, temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            logit_bias,
            ..Default::default()
        }
    }

    /// A +100 bias forces its token, greedy and sampled; -100 bans the best one.
    #[test]
    fn logit_bias_plus_100_forces_and_minus_100_bans() {
        let logits = [3.0f32, 9.0, 1.0, 8.5, -2.0];
        let mut g = Sampler::new(biased(vec![(4, 100.0)], 0.0));
        assert_eq!(g.sample(&logits, &[]), 4);
        let mut s = Sampler::new(biased(vec![(2, 100.0)], 1.0));
        for _ in 0..200 {
            assert_eq!(s.sample(&logits, &[]), 2);
        }
        let mut g = Sampler::new(biased(vec![(1, -100.0)], 0.0));
        assert_eq!(g.sample(&logits, &[]), 3);
        let mut s = Sampler::new(biased(vec![(1, -100.0), (3, -100.0)], 1.0));
        for _ in 0..200 {
            let t = s.sample(&logits, &[]);
            assert!(t != 1 && t != 3, "a banned token came out: {t}");
        }
        // An id past the logits is passed over (the engine refuses it earlier).
        let mut g = Sampler::new(biased(vec![(99, 100.0)], 0.0));
        assert_eq!(g.sample(&logits, &[]), 1);
    }

    /// Under a grammar a +100 bias on a forbidden token never lets it through, by
    /// asking (constrained) or by masking; and a -100 bias on the best allowed token
    /// moves the choice to the next allowed one.
    #[test]
    fn logit_bias_never_lets_a_grammar_forbidden_token_through() {
        let logits = [3.0f32, 9.0, 1.0, 8.5, -2.0, 0.5];
        let allowed = [true, false, true, false, true, true];
        let m = masked(&logits, &allowed);
        for temperature in [0.0, 1.0] {
            for bias in [vec![(1, 100.0)], vec![(1, 100.0), (3, 100.0), (0, -100.0)]] {
                let params = biased(bias, temperature);
                let mut s = Sampler::new(params.clone());
                for _ in 0..200 {
                    let t = s
                        .sample_constrained(&logits, &[], &mut |t| allowed[t as usize], 64)
                        .unwrap_or_else(|| s.sample(&m, &[]));
                    assert!(allowed[t as usize], "forbidden token {t} at {temperature}");
                }
                let mut masked_only = Sampler::new(params);
                for _ in 0..200 {
                    let t = masked_only.sample(&m, &[]);
                    assert!(allowed[t as usize], "forbidden token {t} after masking");
                }
            }
        }
        let mut g = Sampler::new(biased(vec![(0, -100.0)], 0.0));
        let t = g.sample_constrained(&logits, &[], &mut |t| allowed[t as usize], 64);
        assert_eq!(t, Some(2));
        // Only banned tokens allowed: the grammar still gets one (no dead end).
        let only = [false, false, true, false, false, false];
        let mut g = Sampler::new(biased(vec![(2, -100.0)], 0.0));
        let t = g.sample_constrained(&logits, &[], &mut |t| only[t as usize], 64);
        assert_eq!(t, Some(2));
    }

    /// A biased seeded stream gives the same tokens run after run, and the bias
    /// changes them.
    #[test]
    fn logit_bias_keeps_the_seeded_stream_reproducible() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..30).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        let p = biased(vec![(3, 2.5), (10, -1.0)], 1.0);
        assert_eq!(draw(&p), draw(&p));
        assert_ne!(draw(&p), draw(&biased(Vec::new(), 1.0)));
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
