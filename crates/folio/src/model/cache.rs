//! The contiguous KV cache (`--kv basic`): one preallocated f16 slab per layer for K and
//! for V, `capacity` token rows each. It is the oracle the paged cache is tested
//! against; a write past its capacity is an error, never a silent overwrite.

use crate::error::RunError;
use crate::kernels::quant::f32_to_f16;

/// A sequence's K/V, stored as f16 (what llama.cpp stores by default).
pub struct BasicCache {
    capacity: usize,
    kv_dim: usize,
    len: usize,
    /// The token at each filled position, for prefix reuse.
    tokens: Vec<u32>,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

impl BasicCache {
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> Self {
        Self {
            capacity,
            kv_dim,
            len: 0,
            tokens: Vec::new(),
            k: (0..n_layers).map(|_| vec![0; capacity * kv_dim]).collect(),
            v: (0..n_layers).map(|_| vec![0; capacity * kv_dim]).collect(),
        }
    }

    /// Tokens the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens currently stored (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything from position `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.tokens.truncate(self.len);
    }

    /// The tokens whose K/V the cache holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Records `tokens` as filled after every layer wrote their K/V.
    pub(crate) fn push_tokens(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.len = self.tokens.len();
    }

    /// Checks that `n` more tokens fit.
    pub fn check_room(&self, n: usize) -> Result<(), RunError> {
        if self.len + n > self.capacity {
            return Err(RunError::ContextFull {
                pos: self.len + n - 1,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Stores K and V of position `pos` in `layer`.
    pub fn write(
        &mut self,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), RunError> {
        if pos >= self.capacity {
            return Err(RunError::ContextFull {
                pos,
                capacity: self.capacity,
            });
        }
        let at = pos * self.kv_dim;
        for (d, s) in self.k[layer][at..at + self.kv_dim].iter_mut().zip(k) {
            *d = f32_to_f16(*s);
        }
        for (d, s) in self.v[layer][at..at + self.kv_dim].iter_mut().zip(v) {
            *d = f32_to_f16(*s);
        }
        Ok(())
    }

    /// K of position `pos` in `layer`, all KV heads.
    pub fn k_row(&self, layer: usize, pos: usize) -> &[u16] {
        &self.k[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }

    /// V of position `pos` in `layer`, all KV heads.
    pub fn v_row(&self, layer: usize, pos: usize) -> &[u16] {
        &self.v[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
}
