//! The typed K/V rows the attention kernels read: [`KvDtype`], the element type of stored
//! K/V, and [`KvRows`] and [`KvRun`], borrowed runs of stored rows.

use super::quant;

/// The element type of stored K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// Half precision, what llama.cpp stores by default.
    #[default]
    F16,
    F32,
}

impl KvDtype {
    /// Bytes per element.
    #[inline]
    pub fn size(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }
}

/// Stored K or V rows of one dtype.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
}

impl<'a> KvRows<'a> {
    /// Elements held.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            KvRows::F16(x) => x.len(),
            KvRows::F32(x) => x.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same rows from element `off` on.
    #[inline]
    pub fn skip(self, off: usize) -> Self {
        match self {
            KvRows::F16(x) => KvRows::F16(&x[off..]),
            KvRows::F32(x) => KvRows::F32(&x[off..]),
        }
    }

    /// The rows as raw 16-bit units (two per f32), for copying.
    #[inline]
    pub fn raw(&self) -> &'a [u16] {
        match *self {
            KvRows::F16(x) => x,
            KvRows::F32(x) => bytemuck::cast_slice(x),
        }
    }

    /// Element `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            KvRows::F16(x) => quant::f16_to_f32(x[i]),
            KvRows::F32(x) => x[i],
        }
    }
}

/// A run of keys stored at a fixed row stride: `n` K rows from the start of `k`, the
/// matching V rows from the start of `v` (one page of a paged cache, or a whole
/// contiguous cache).
#[derive(Debug, Clone, Copy)]
pub struct KvRun<'a> {
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub n: usize,
}
