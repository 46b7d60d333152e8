//! K/V element storage shared by the paged arena and the contiguous cache: f16 (the
//! default, what llama.cpp stores) or f32, chosen at run time.

use crate::kernels::advise_huge_pages;
use crate::kernels::to_f16;
pub use crate::kernels::{KvDtype, KvRows};

/// The K rows and the V rows of one run of slots.
pub type KvPair<'a> = (KvRows<'a>, KvRows<'a>);

/// A flat buffer of K/V elements of one dtype.
pub enum KvBuf {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl KvBuf {
    /// `len` zeroed elements, on huge pages where the system gives them (a decode step
    /// reads every page of a long context: 4 KiB pages would miss the TLB on each).
    pub fn new(dtype: KvDtype, len: usize) -> Self {
        match dtype {
            KvDtype::F16 => {
                let mut v = vec![0; len];
                advise_huge_pages(&mut v);
                KvBuf::F16(v)
            }
            KvDtype::F32 => {
                let mut v = vec![0.0; len];
                advise_huge_pages(&mut v);
                KvBuf::F32(v)
            }
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            KvBuf::F16(_) => KvDtype::F16,
            KvBuf::F32(_) => KvDtype::F32,
        }
    }

    /// Stores `src` at element `at`, converted to the buffer's dtype.
    pub fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvBuf::F16(v) => to_f16(src, &mut v[at..at + src.len()]),
            KvBuf::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }

    /// Elements `from..to` as typed rows.
    pub fn rows(&self, from: usize, to: usize) -> KvRows<'_> {
        match self {
            KvBuf::F16(v) => KvRows::F16(&v[from..to]),
            KvBuf::F32(v) => KvRows::F32(&v[from..to]),
        }
    }

    /// The raw 16-bit units of elements `from..to` (two per f32 element): for copying
    /// and persisting without conversion.
    pub fn raw(&self, from: usize, to: usize) -> &[u16] {
        match self {
            KvBuf::F16(v) => &v[from..to],
            KvBuf::F32(v) => bytemuck::cast_slice(&v[from..to]),
        }
    }

    /// Mutable raw units of elements `from..to`.
    pub fn raw_mut(&mut self, from: usize, to: usize) -> &mut [u16] {
        match self {
            KvBuf::F16(v) => &mut v[from..to],
            KvBuf::F32(v) => bytemuck::cast_slice_mut(&mut v[from..to]),
        }
    }

    /// Copies elements `src..src+n` to `dst..dst+n` within the buffer.
    pub fn copy_within(&mut self, src: usize, dst: usize, n: usize) {
        match self {
            KvBuf::F16(v) => v.copy_within(src..src + n, dst),
            KvBuf::F32(v) => v.copy_within(src..src + n, dst),
        }
    }
}
