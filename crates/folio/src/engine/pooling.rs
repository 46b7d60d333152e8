//! Pooling an embedding: the hidden states of a prompt's tokens (`dim` floats each,
//! in order, as [`super::Embedding::wait`] gives them) made into one vector of `dim`.
//! Pure arithmetic: the sums run in float64 and the result is rounded to float32 once,
//! so a pooled vector is within float32 rounding of the float64 pooling of the same
//! states, whatever the prompt's length.

use super::error::EngineError;
use crate::tokenizer::Tokenizer;

/// How the token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean of every token's state.
    #[default]
    Mean,
    /// The last token's state (in a causal model, the one that has seen the whole
    /// prompt).
    Last,
    /// The first token's state: meaningful where the tokenizer puts a BOS/CLS token
    /// first ([`super::Engine::check_pooling`] refuses it elsewhere).
    Cls,
}

impl Pooling {
    /// Every pooling's name, as the server takes them.
    pub const NAMES: [&'static str; 3] = ["mean", "last", "cls"];

    /// The pooling called `name` ("mean", "last", "cls").
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "mean" => Some(Pooling::Mean),
            "last" => Some(Pooling::Last),
            "cls" => Some(Pooling::Cls),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Last => "last",
            Pooling::Cls => "cls",
        }
    }
}

/// The token `tok` puts first (its BOS, which plays CLS), if it puts one.
pub fn cls_token(tok: &Tokenizer) -> Option<u32> {
    tok.bos.filter(|_| tok.adds_bos())
}

/// Whether `tokens` can be pooled by `how`, where `cls` is the model's
/// [`cls_token`]: [`Pooling::Cls`] takes the first token's state, which stands for
/// the whole input only where the model has a CLS token: the tokenizer must put one
/// first and `tokens` must start with it. Otherwise a [`EngineError::Param`] naming
/// `pooling`.
pub fn check(cls: Option<u32>, tokens: &[u32], how: Pooling) -> Result<(), EngineError> {
    if how != Pooling::Cls {
        return Ok(());
    }
    match cls {
        None => Err(EngineError::param(
            "pooling",
            "cls pooling needs a model whose tokenizer puts a BOS/CLS token first; this one puts none: use mean or last",
        )),
        Some(cls) if tokens.first().is_some_and(|&t| t != cls) => Err(EngineError::param(
            "pooling",
            format!("cls pooling needs the input to start with the model's BOS/CLS token (id {cls})"),
        )),
        Some(_) => Ok(()),
    }
}

/// `states` (`dim` values per token) pooled by `how`, then scaled to unit L2 norm
/// when `normalize` (a zero vector stays zero). Computed in float64, returned as
/// float32. No token is [`EngineError::EmptyPrompt`]; states that are not whole rows
/// of `dim` are a [`EngineError::Param`] naming `states`.
pub fn pool(
    states: &[f32],
    dim: usize,
    how: Pooling,
    normalize: bool,
) -> Result<Vec<f32>, EngineError> {
    if dim == 0 || !states.len().is_multiple_of(dim) {
        return Err(EngineError::param(
            "states",
            format!("{} values are not rows of {dim}", states.len()),
        ));
    }
    let n = states.len() / dim;
    if n == 0 {
        return Err(EngineError::EmptyPrompt);
    }
    let row = |r: usize| &states[r * dim..(r + 1) * dim];
    let mut v: Vec<f64> = match how {
        Pooling::Mean => {
            let mut sum = vec![0f64; dim];
            for r in 0..n {
                sum.iter_mut()
                    .zip(row(r))
                    .for_each(|(s, &x)| *s += x as f64);
            }
            sum.iter().map(|s| s / n as f64).collect()
        }
        Pooling::Last => row(n - 1).iter().map(|&x| x as f64).collect(),
        Pooling::Cls => row(0).iter().map(|&x| x as f64).collect(),
    };
    if normalize {
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= norm);
        }
    }
    Ok(v.into_iter().map(|x| x as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three tokens of dimension 2.
    const STATES: [f32; 6] = [1.0, 2.0, 3.0, -4.0, 5.0, 8.0];

    #[test]
    fn mean_last_and_cls_pick_what_they_say() {
        assert_eq!(pool(&STATES, 2, Pooling::Mean, false).unwrap(), [3.0, 2.0]);
        assert_eq!(pool(&STATES, 2, Pooling::Last, false).unwrap(), [5.0, 8.0]);
        assert_eq!(pool(&STATES, 2, Pooling::Cls, false).unwrap(), [1.0, 2.0]);
        // One token: every pooling is that token.
        for how in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
            assert_eq!(pool(&[3.0, 4.0], 2, how, false).unwrap(), [3.0, 4.0]);
            assert_eq!(pool(&[3.0, 4.0], 2, how, true).unwrap(), [0.6, 0.8]);
        }
    }

    #[test]
    fn normalized_vectors_have_unit_norm_and_the_same_direction() {
        for how in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
            let raw = pool(&STATES, 2, how, false).unwrap();
            let unit = pool(&STATES, 2, how, true).unwrap();
            let norm = unit.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-6, "{how:?}: norm {norm}");
            let raw_norm = raw.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            for (u, r) in unit.iter().zip(&raw) {
                assert!((*u as f64 - *r as f64 / raw_norm).abs() < 1e-6);
            }
        }
        // A zero vector stays zero (no division by zero).
        assert_eq!(pool(&[0.0; 4], 2, Pooling::Mean, true).unwrap(), [0.0, 0.0]);
    }

    #[test]
    fn the_mean_is_summed_in_float64() {
        // 1e8 + 1 + ... in float32 loses the ones; float64 keeps them.
        let mut states = vec![1e8f32];
        states.extend(std::iter::repeat_n(1.0, 99));
        let m = pool(&states, 1, Pooling::Mean, false).unwrap();
        assert_eq!(m, [((1e8 + 99.0) / 100.0) as f32]);
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        assert!(matches!(
            pool(&[], 2, Pooling::Mean, true),
            Err(EngineError::EmptyPrompt)
        ));
        for (states, dim) in [(&STATES[..5], 2), (&STATES[..], 0)] {
            assert!(matches!(
                pool(states, dim, Pooling::Last, false),
                Err(EngineError::Param { name: "states", .. })
            ));
        }
    }

    #[test]
    fn cls_needs_a_model_that_puts_one_first_and_an_input_that_starts_with_it() {
        for how in [Pooling::Mean, Pooling::Last] {
            assert!(check(None, &[5, 6], how).is_ok());
        }
        assert!(check(Some(1), &[1, 6], Pooling::Cls).is_ok());
        for (cls, tokens) in [(None, &[1u32, 6][..]), (Some(1), &[5, 6][..])] {
            assert!(matches!(
                check(cls, tokens, Pooling::Cls),
                Err(EngineError::Param {
                    name: "pooling",
                    ..
                })
            ));
        }
    }

    #[test]
    fn names_round_trip() {
        for name in Pooling::NAMES {
            assert_eq!(Pooling::parse(name).unwrap().name(), name);
        }
        assert_eq!(Pooling::parse("max"), None);
        assert_eq!(Pooling::default(), Pooling::Mean);
    }
}
