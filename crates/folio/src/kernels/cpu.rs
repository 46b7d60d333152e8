//! [`Cpu`]: the threads and the instruction-set path the kernels run on, as one handle.
//! The model builds it once and calls the kernels through it, so `pool, isa` are never
//! threaded through a call by hand; every method is the free kernel of the same name
//! on this handle's pool and path.

use super::pool::PoolError;
use super::{attend, matmul, Activations, Attend, Isa, QMatrix, ThreadPool};

/// A thread pool and the instruction-set path its kernels take.
pub struct Cpu {
    pool: ThreadPool,
    isa: Isa,
    /// llama.cpp's attention arithmetic where the path has it ([`Isa::f16_attention`]).
    llama: bool,
}

impl Cpu {
    /// `threads` threads (0: all cores) on the detected path ([`super::isa`]).
    pub fn new(threads: usize) -> Result<Self, PoolError> {
        let threads = if threads == 0 {
            super::pool::cores()
        } else {
            threads
        };
        Ok(Self {
            pool: ThreadPool::new(threads)?,
            isa: super::isa(),
            llama: false,
        })
    }

    /// The same threads on path `isa` (the caller checks that the CPU runs it).
    pub fn set_isa(&mut self, isa: Isa) {
        self.isa = isa;
    }

    /// Attention with llama.cpp's value accumulators where this path has them
    /// ([`Isa::f16_attention`]): `--llama-arithmetic`.
    pub fn llama_arithmetic(&mut self) {
        self.llama = true;
    }

    /// Whether this handle runs llama.cpp's arithmetic (`--llama-arithmetic`).
    pub fn llama(&self) -> bool {
        self.llama
    }

    /// Whether [`Cpu::attend`] rounds the value accumulators to f16 after every key.
    pub fn rounds_attention(&self) -> bool {
        self.llama && self.isa.f16_attention()
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// [`Activations::build`] on this pool and path.
    pub fn build(
        &self,
        act: &mut Activations,
        shape: (usize, usize),
        ws: &[&QMatrix],
        row: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        act.build(&self.pool, self.isa, shape, ws, row);
    }

    /// [`matmul::matmul`]: each `(w, out)` gets `act · wᵀ`.
    pub fn matmul(&self, act: &mut Activations, outs: &mut [(&QMatrix, &mut [f32])]) {
        matmul::matmul(&self.pool, self.isa, act, outs);
    }

    /// [`matmul::matmul_add`]: `out += act · wᵀ`.
    pub fn matmul_add(&self, act: &mut Activations, w: &QMatrix, out: &mut [f32]) {
        matmul::matmul_add(&self.pool, self.isa, act, w, out);
    }

    /// [`attend`] on this path with its arithmetic (one thread: the caller splits the
    /// work).
    pub fn attend(&self, a: &Attend, state: &mut [(f32, f32)], acc: &mut [f32]) {
        attend(self.isa, self.rounds_attention(), a, state, acc);
    }
}
