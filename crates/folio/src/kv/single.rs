//! [`KvSeq`]: one sequence's cache as its owner drives it, one step at a time, with no
//! engine: reserve the step's slots (a [`Batch`] of one), let the model run it on
//! [`KvSeq::storage`], then commit (or abort). The contiguous oracle and a paged
//! pool's sequence view (`PagedSeq`) both implement it, so tests and benches run the
//! same code on either.

use super::batch::{Batch, Logits};
use super::error::KvError;
use super::storage::KvStorage;

/// One sequence's K/V, owned and driven by its caller.
pub trait KvSeq {
    type Storage: KvStorage;
    /// Tokens stored.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The most tokens this sequence can hold.
    fn capacity(&self) -> usize;
    /// The tokens stored, in order.
    fn tokens(&self) -> Vec<u32>;
    /// Keeps the longest stored (or, for a paged cache, indexed) prefix of `prompt`,
    /// always short of its last token, drops the rest, and returns its length.
    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize;
    /// Forgets everything from position `len` on.
    fn truncate(&mut self, len: usize);
    /// Reserves slots for `tokens` at the next positions (all or nothing) and returns
    /// the step that computes them.
    fn reserve(&mut self, tokens: &[u32], logits: Logits) -> Result<Batch, KvError>;
    /// The K/V storage the reserved step runs on.
    fn storage(&mut self) -> &mut Self::Storage;
    /// The reserved tokens are computed: they count from now on (a paged cache commits
    /// its full pages).
    fn commit(&mut self) -> Result<(), KvError>;
    /// Gives back the last `n` reserved tokens after a failed step.
    fn abort(&mut self, n: usize);
}
