//! Kernel internals for the crate's own benchmarks (`benches/`) and the GPU backend's
//! tests (which check its kernels against the CPU's), not part of the public surface:
//! names here may change without notice.

pub use crate::kernels::quant::{f16_to_f32, f32_to_f16, BlockQ8, BlockQ8K};
pub use crate::kernels::{
    isa, matmul, quantize_q8, quantize_q8k, runnable as runnable_isas, Activations, Cpu, Isa,
    Layout, QMatrix, ThreadPool,
};
