//! Kernel internals for the crate's own benchmarks (`benches/`), not part of the
//! public surface: names here may change without notice.

pub use crate::kernels::quant::{f16_to_f32, f32_to_f16};
pub use crate::kernels::{
    isa, matmul, runnable as runnable_isas, Activations, Cpu, Isa, Layout, QMatrix, ThreadPool,
};
