//! The contiguous cache (`--kv basic` in tests and benches): one preallocated slab per
//! layer for K and for V, `capacity` token rows each. It is the oracle the paged cache
//! is tested against. As [`KvStorage`] it is a single page (id 0) of `capacity` slots;
//! as [`KvSeq`] it plans its own steps, refusing tokens past its capacity.

use super::batch::{Batch, Logits, SeqStep};
use super::buf::{KvBuf, KvDtype, KvPair};
use super::error::KvError;
use super::single::KvSeq;
use super::storage::KvStorage;
use super::store::PageId;

/// A sequence's K/V, stored as f16 (what llama.cpp stores by default), f32 or 8-bit.
pub struct BasicCache {
    capacity: usize,
    kv_dim: usize,
    /// The token at each filled position, for prefix reuse.
    tokens: Vec<u32>,
    /// Tokens reserved by the step in flight.
    pending: Vec<u32>,
    k: Vec<KvBuf>,
    v: Vec<KvBuf>,
}

impl BasicCache {
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> Self {
        Self::with_dtype(n_layers, kv_dim, kv_dim, capacity, KvDtype::F16)
    }

    /// `head_dim`: the head size, which 8-bit K/V keeps a scale per (`kv_dim` a
    /// multiple of it).
    pub fn with_dtype(
        n_layers: usize,
        kv_dim: usize,
        head_dim: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Self {
        Self {
            capacity,
            kv_dim,
            tokens: Vec::new(),
            pending: Vec::new(),
            k: (0..n_layers)
                .map(|_| KvBuf::new(dtype, capacity * kv_dim, head_dim))
                .collect(),
            v: (0..n_layers)
                .map(|_| KvBuf::new(dtype, capacity * kv_dim, head_dim))
                .collect(),
        }
    }

    /// One layer's K and V slabs as raw 16-bit units, `capacity` rows each (for
    /// copying rows in bulk; f16 and f32 only).
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [u16], &mut [u16]) {
        let n = self.capacity * self.kv_dim;
        (self.k[layer].raw_mut(0, n), self.v[layer].raw_mut(0, n))
    }

    /// K of position `pos` in `layer` as raw 16-bit units (f16 and f32 only).
    pub fn k_row(&self, layer: usize, pos: usize) -> &[u16] {
        self.k[layer].raw(pos * self.kv_dim, (pos + 1) * self.kv_dim)
    }

    /// V of position `pos` in `layer` as raw 16-bit units.
    pub fn v_row(&self, layer: usize, pos: usize) -> &[u16] {
        self.v[layer].raw(pos * self.kv_dim, (pos + 1) * self.kv_dim)
    }
}

impl KvStorage for BasicCache {
    fn num_pages(&self) -> usize {
        1
    }
    fn page_slots(&self, _page: u32) -> usize {
        self.capacity
    }
    fn write(&mut self, _page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let at = slot * self.kv_dim;
        self.k[layer].write(at, &k[..self.kv_dim]);
        self.v[layer].write(at, &v[..self.kv_dim]);
    }
    /// The one page holds every position: `count` changes nothing.
    fn run_pages(&self, _: u32, _: usize, layer: usize, slot: usize) -> KvPair<'_> {
        let (at, end) = (slot * self.kv_dim, self.capacity * self.kv_dim);
        (self.k[layer].rows(at, end), self.v[layer].rows(at, end))
    }
}

impl KvSeq for BasicCache {
    type Storage = Self;

    fn len(&self) -> usize {
        self.tokens.len()
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
        self.len()
    }

    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    fn reserve(&mut self, tokens: &[u32], logits: Logits) -> Result<Batch, KvError> {
        let start = self.tokens.len();
        if start + tokens.len() > self.capacity {
            return Err(KvError::SequenceFull {
                len: start + tokens.len(),
                max: self.capacity,
            });
        }
        self.pending = tokens.to_vec();
        Ok(Batch::one(SeqStep {
            tokens: tokens.to_vec(),
            start,
            pages: vec![PageId(0)],
            page_size: self.capacity.max(1),
            logits,
        }))
    }

    fn storage(&mut self) -> &mut Self {
        self
    }

    fn commit(&mut self) -> Result<(), KvError> {
        self.tokens.append(&mut self.pending);
        Ok(())
    }

    fn abort(&mut self, _n: usize) {
        self.pending.clear();
    }
}
