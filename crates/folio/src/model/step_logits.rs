//! [`StepLogits`]: what one forward step returns, every sequence's logit rows in one
//! buffer that the caller keeps from step to step.
//!
//! A batch of 16 decoding sequences gets 16 rows of the vocabulary: 3 MB on the
//! default model. Allocated afresh each step (and copied out per sequence), that
//! memory went back to the system and came again as zeroed pages: some 1,000 page
//! faults per step, about a tenth of a batch-16 decode step's time in the runs where
//! glibc's allocator trimmed its heap between steps. One buffer, reused, faults once
//! (the engine frees it after a step that needed far more rows than decoding does).
//!
//! A sequence that asked for hidden states ([`crate::kv::Logits::Hidden`], for
//! embeddings) gets no logits: its rows of `dim` final-normed states are in a second
//! buffer, [`StepLogits::states`].

use crate::kernels::ThreadPool;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Fewest logits [`StepLogits::all_finite`] checks on a thread of their own: a few
/// rows of the default model's vocabulary (one row alone is not worth a region).
const FINITE_PART: usize = 1 << 17;

/// The logits of one step: `vocab` floats per requested row, sequence by sequence
/// (a sequence that asked for none has an empty slice).
#[derive(Debug, Clone, Default)]
pub struct StepLogits {
    data: Vec<f32>,
    spans: Vec<Range<usize>>,
    /// Hidden states: `dim` floats per row of the sequences that asked for them.
    states: Vec<f32>,
    state_spans: Vec<Range<usize>>,
}

impl StepLogits {
    /// An empty buffer; [`Model::forward_into`](super::Model::forward_into) sizes it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sequence `i`'s rows.
    pub fn seq(&self, i: usize) -> &[f32] {
        &self.data[self.spans[i].clone()]
    }

    /// How many sequences the step had.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the step had no sequence.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Sequence `i`'s hidden states (`dim` per new token; empty unless it asked for
    /// them with [`crate::kv::Logits::Hidden`]).
    pub fn states(&self, i: usize) -> &[f32] {
        self.state_spans
            .get(i)
            .map_or(&[][..], |r| &self.states[r.clone()])
    }

    /// Each sequence's rows, in batch order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[f32]> + '_ {
        self.spans.iter().map(|r| &self.data[r.clone()])
    }

    /// Each sequence's rows as a vector of its own.
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        self.iter().map(<[f32]>::to_vec).collect()
    }

    /// Frees the buffer if it can hold more than `max_values` floats: a step with every
    /// prompt row's logits (prompt log-probabilities) needs `vocab` per token, 100 MB
    /// for 512 tokens of the default model, which a kept buffer would hold for good.
    pub fn trim(&mut self, max_values: usize) {
        if self.data.capacity() > max_values || self.states.capacity() > max_values {
            *self = Self::new();
        }
    }

    /// Sizes the buffer for `per_seq[s]` rows of `vocab` values for each sequence s,
    /// in order (the step writes every value; the old contents stay until then).
    pub fn reset(&mut self, vocab: usize, per_seq: impl Iterator<Item = usize>) {
        lay_out(&mut self.spans, &mut self.data, vocab, per_seq);
    }

    /// The whole buffer, to be written by the step.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Sizes the states buffer for `per_seq[s]` rows of `dim` values for each sequence
    /// s, in order (as [`StepLogits::reset`] the logits).
    pub fn reset_states(&mut self, dim: usize, per_seq: impl Iterator<Item = usize>) {
        lay_out(&mut self.state_spans, &mut self.states, dim, per_seq);
    }

    /// The whole states buffer, to be written by the step.
    pub fn states_mut(&mut self) -> &mut [f32] {
        &mut self.states
    }

    /// Whether every value is finite: in chunks without an early exit inside, which the
    /// compiler vectorizes (this runs over every logit of every step), and over
    /// `pool`'s threads when there are several rows (16 decode rows: 3 MB).
    pub(super) fn all_finite(&self, pool: &ThreadPool) -> bool {
        if !self.states.iter().all(|x| x.is_finite()) {
            return false;
        }
        let finite = |c: &[f32]| {
            c.chunks(256)
                .all(|c| c.iter().fold(true, |ok, x| ok & x.is_finite()))
        };
        let part = self
            .data
            .len()
            .div_ceil(2 * pool.parallelism())
            .max(FINITE_PART);
        let ok = AtomicBool::new(true);
        pool.each(self.data.chunks(part).collect(), &|c| {
            if !finite(c) {
                ok.store(false, Relaxed);
            }
        });
        ok.into_inner()
    }
}

impl std::ops::Index<usize> for StepLogits {
    type Output = [f32];

    fn index(&self, i: usize) -> &[f32] {
        self.seq(i)
    }
}

/// One span of `per_seq[s]` rows of `width` values per sequence, back to back, and
/// `buf` sized to hold them all.
fn lay_out(
    spans: &mut Vec<Range<usize>>,
    buf: &mut Vec<f32>,
    width: usize,
    per_seq: impl Iterator<Item = usize>,
) {
    spans.clear();
    let mut at = 0;
    for k in per_seq {
        spans.push(at..at + k * width);
        at += k * width;
    }
    buf.resize(at, 0.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_not_finite_anywhere_is_found_on_one_thread_or_several() {
        let pools = [ThreadPool::new(1).unwrap(), ThreadPool::new(2).unwrap()];
        let mut l = StepLogits::new();
        // 16 rows of the default model's vocabulary: several parts on two threads.
        l.reset(49_152, [10, 0, 6].into_iter());
        let n = l.data_mut().len();
        l.data_mut().fill(0.5);
        assert!(pools.iter().all(|p| l.all_finite(p)));
        for at in [0, FINITE_PART - 1, FINITE_PART, 3 * FINITE_PART + 5, n - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                l.data_mut()[at] = bad;
                for p in &pools {
                    assert!(
                        !l.all_finite(p),
                        "{bad} at {at} of {n}, {} threads",
                        p.threads()
                    );
                }
                l.data_mut()[at] = 0.5;
            }
        }
        assert!(pools.iter().all(|p| l.all_finite(p)));
    }
}
