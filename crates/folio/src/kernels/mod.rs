//! Compute kernels: quantized block formats, their dot products and matmuls, and the
//! thread pool that runs them. The only module besides `gguf::mmap` allowed `unsafe`.
//!
//! # Layout
//! - `quant`: `#[repr(C)]` block structs of every weight format, with size asserts.
//! - `scalar`: the reference twin of every kernel.
//! - `avx2`: AVX2/FMA/F16C kernels, chosen at run time.
//! - `matmul`: [`QMatrix`] (weights laid out for the kernels) and the threaded matmul.
//! - `pool`: a persistent spinning thread pool with one barrier per parallel region.
//!
//! The instruction set is detected once ([`isa`]); `FOLIO_ISA=scalar` forces the scalar
//! twins (used by tests and to measure what SIMD buys).

#![allow(unsafe_code)]

pub mod matmul;
pub mod pool;
pub mod quant;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

pub use matmul::{matmul, Activations, QMatrix};
pub use pool::ThreadPool;

use std::sync::OnceLock;

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
        })
    }
}

/// The best instruction set this CPU supports (or `FOLIO_ISA=scalar`).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var("FOLIO_ISA").is_ok_and(|v| v == "scalar") {
            return Isa::Scalar;
        }
        detect()
    })
}

/// What the CPU supports, ignoring any override.
pub fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// dot(w, x) for f16 weights and f32 activations.
pub fn dot_f16(isa: Isa, w: &[u16], x: &[f32]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2 is only ever produced by `detect` after checking the features.
        Isa::Avx2 => unsafe { avx2::dot_f16(w, x) },
        _ => scalar::dot_f16(w, x),
    }
}

/// A run of keys stored at a fixed row stride: `n` K rows from the start of `k`, the
/// matching V rows from the start of `v` (one page of a paged cache, or a whole
/// contiguous cache).
#[derive(Debug, Clone, Copy)]
pub struct KvRun<'a> {
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub n: usize,
}

/// Continues one query's online softmax over runs of keys (see `scalar::attend_runs`).
pub fn attend_runs(
    isa: Isa,
    q16: &[f32],
    runs: &[KvRun],
    stride: usize,
    scale: f32,
    state: (&mut f32, &mut f32),
    acc: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2 is only ever produced by `detect` after checking the features.
        Isa::Avx2 if q16.len() == 64 => unsafe {
            avx2::attend_runs_64(q16, runs, stride, scale, state, acc)
        },
        _ => scalar::attend_runs(q16, runs, stride, scale, state, acc),
    }
}

/// `x` rounded to f16 precision (the query of llama.cpp's flash attention).
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| quant::f16_to_f32(quant::f32_to_f16(v)))
        .collect()
}

/// Quantizes activations into 8-bit blocks (identical bytes on every path).
pub fn quantize_q8(isa: Isa, x: &[f32], out: &mut [quant::BlockQ8]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2 is only ever produced by `detect` after checking the features.
        Isa::Avx2 => unsafe { avx2::quantize_q8(x, out) },
        _ => scalar::quantize_q8(x, out),
    }
}

/// gate = silu(gate) · up (SwiGLU), with ggml's vectorised exp.
pub fn swiglu(isa: Isa, gate: &mut [f32], up: &[f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Isa::Avx2 is only ever produced by `detect` after checking the features.
        Isa::Avx2 => unsafe { avx2::swiglu(gate, up) },
        _ => scalar::swiglu(gate, up),
    }
}

#[cfg(test)]
pub(crate) mod tests;
