//! The KV cache interface the forward pass writes and reads through ([`KvCache`]), and
//! the contiguous cache (`--kv basic`): one preallocated f16 slab per layer for K and
//! for V, `capacity` token rows each. It is the oracle the paged cache is tested
//! against; a write past its capacity is an error, never a silent overwrite.

use crate::error::RunError;

/// A sequence's K/V as the forward pass sees it. Implemented by the contiguous
/// [`BasicCache`] (the oracle) and by the paged cache's `kv::PagedSeq`.
///
/// A forward step calls `begin(tokens)` (room for them at positions `len()..`), then
/// `write` for every layer and position, reads rows back for attention, and `finish()`
/// (the tokens count from then on; the paged cache commits full pages). If the step
/// fails after `begin`, it calls `abort(n)` to give the `n` begun tokens back.
pub trait KvCache: Sync {
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
    /// Makes room for `tokens` at the next positions, or fails changing nothing.
    fn begin(&mut self, tokens: &[u32]) -> Result<(), RunError>;
    /// Stores K and V of one position in one layer.
    fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), RunError>;
    /// K of position `pos` in `layer`, all KV heads, as raw 16-bit units (the f16
    /// values, or two units per f32).
    fn k_row(&self, layer: usize, pos: usize) -> &[u16];
    /// V of position `pos` in `layer`, as raw 16-bit units.
    fn v_row(&self, layer: usize, pos: usize) -> &[u16];
    /// K and V rows of `layer` from position `pos` to the end of the contiguous block
    /// that holds it (its page, for a paged cache): whole rows of all KV heads.
    fn kv_run(&self, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>);
    /// The begun tokens are complete.
    fn finish(&mut self) -> Result<(), RunError>;
    /// Gives back the last `n` begun tokens after a failed step.
    fn abort(&mut self, n: usize);
    /// Forgets everything from position `len` on.
    fn truncate(&mut self, len: usize);
}

/// The K/V of several sequences for one batched forward step: sequence `s` of the
/// batch receives the `s`-th step's tokens. Same protocol as [`KvCache`], per sequence.
pub trait KvBatch: Sync {
    /// Sequences in the batch.
    fn seqs(&self) -> usize;
    /// Tokens sequence `s` holds.
    fn seq_len(&self, s: usize) -> usize;
    fn begin(&mut self, s: usize, tokens: &[u32]) -> Result<(), RunError>;
    fn write(
        &mut self,
        s: usize,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), RunError>;
    /// See [`KvCache::kv_run`].
    fn kv_run(&self, s: usize, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>);
    fn finish(&mut self, s: usize) -> Result<(), RunError>;
    fn abort(&mut self, s: usize, n: usize);
}

/// Any set of single-sequence caches is a batch (the contiguous oracle batches this way).
impl<C: KvCache + ?Sized> KvBatch for [&mut C] {
    fn seqs(&self) -> usize {
        self.len()
    }
    fn seq_len(&self, s: usize) -> usize {
        self[s].len()
    }
    fn begin(&mut self, s: usize, tokens: &[u32]) -> Result<(), RunError> {
        self[s].begin(tokens)
    }
    fn write(
        &mut self,
        s: usize,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), RunError> {
        self[s].write(layer, pos, k, v)
    }
    fn kv_run(&self, s: usize, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>) {
        self[s].kv_run(layer, pos)
    }
    fn finish(&mut self, s: usize) -> Result<(), RunError> {
        self[s].finish()
    }
    fn abort(&mut self, s: usize, n: usize) {
        self[s].abort(n)
    }
}
use crate::kv::{KvBuf, KvDtype, KvRows};

/// A sequence's K/V, stored as f16 (what llama.cpp stores by default) or f32.
pub struct BasicCache {
    capacity: usize,
    kv_dim: usize,
    len: usize,
    /// The token at each filled position, for prefix reuse.
    tokens: Vec<u32>,
    /// Tokens begun by the current forward step.
    pending: Vec<u32>,
    k: Vec<KvBuf>,
    v: Vec<KvBuf>,
}

impl BasicCache {
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> Self {
        Self::with_dtype(n_layers, kv_dim, capacity, KvDtype::F16)
    }

    pub fn with_dtype(n_layers: usize, kv_dim: usize, capacity: usize, dtype: KvDtype) -> Self {
        Self {
            capacity,
            kv_dim,
            len: 0,
            tokens: Vec::new(),
            pending: Vec::new(),
            k: (0..n_layers)
                .map(|_| KvBuf::new(dtype, capacity * kv_dim))
                .collect(),
            v: (0..n_layers)
                .map(|_| KvBuf::new(dtype, capacity * kv_dim))
                .collect(),
        }
    }
}

impl BasicCache {
    /// One layer's K and V slabs as raw 16-bit units, `capacity` rows each (for
    /// copying rows in bulk).
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [u16], &mut [u16]) {
        let n = self.capacity * self.kv_dim;
        (self.k[layer].raw_mut(0, n), self.v[layer].raw_mut(0, n))
    }
}

impl KvCache for BasicCache {
    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn tokens(&self) -> Vec<u32> {
        self.tokens.clone()
    }

    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        self.truncate(common.min(prompt.len().saturating_sub(1)));
        self.len
    }

    fn begin(&mut self, tokens: &[u32]) -> Result<(), RunError> {
        if self.len + tokens.len() > self.capacity {
            return Err(RunError::ContextFull {
                pos: self.len + tokens.len() - 1,
                capacity: self.capacity,
            });
        }
        self.pending = tokens.to_vec();
        Ok(())
    }

    fn finish(&mut self) -> Result<(), RunError> {
        self.tokens.append(&mut self.pending);
        self.len = self.tokens.len();
        Ok(())
    }

    fn abort(&mut self, _n: usize) {
        self.pending.clear();
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.tokens.truncate(self.len);
    }

    fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), RunError> {
        if pos >= self.capacity {
            return Err(RunError::ContextFull {
                pos,
                capacity: self.capacity,
            });
        }
        let at = pos * self.kv_dim;
        self.k[layer].write(at, &k[..self.kv_dim]);
        self.v[layer].write(at, &v[..self.kv_dim]);
        Ok(())
    }

    fn k_row(&self, layer: usize, pos: usize) -> &[u16] {
        self.k[layer].raw(pos * self.kv_dim, (pos + 1) * self.kv_dim)
    }

    fn v_row(&self, layer: usize, pos: usize) -> &[u16] {
        self.v[layer].raw(pos * self.kv_dim, (pos + 1) * self.kv_dim)
    }

    fn kv_run(&self, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>) {
        let (at, end) = (pos * self.kv_dim, self.capacity * self.kv_dim);
        (self.k[layer].rows(at, end), self.v[layer].rows(at, end))
    }
}
