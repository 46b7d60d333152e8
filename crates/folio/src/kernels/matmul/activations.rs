//! [`Activations`]: one input batch, kept as f32 and quantized once to each format
//! ([`ActKind`]) a matrix reading it wants, or built and quantized in one parallel region
//! ([`Activations::build`]); and the row accessors the kernels read it through.

use super::{QMatrix, PARALLEL_ROWS};
use crate::kernels::pool::ThreadPool;
use crate::kernels::quant::{BlockQ8, BlockQ8K, QK, QK_K};
use crate::kernels::Isa;
use bytemuck::Zeroable;

/// Rows from which [`Activations::build`] splits its rows over threads: its work per
/// row (a norm or an activation function, a copy, the 8-bit rounding) is more than
/// one element-wise step's.
pub const BUILD_ROWS: usize = 4;

/// Which activation format a weight type's dot product consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActKind {
    F32,
    Q8,
    Q8K,
    /// Q8 and each block's -128·Σq: the AVX-512 Q8_0 kernel's start (see
    /// `avx512::tile_q8_0x16`, whose weights are offset by 128).
    Q8Sums,
}

/// One input batch (`n` rows of `cols`), kept as f32 and quantized on demand.
#[derive(Default)]
pub struct Activations {
    pub(super) n: usize,
    pub(super) cols: usize,
    f32: Vec<f32>,
    q8: Vec<BlockQ8>,
    q8k: Vec<BlockQ8K>,
    sums: Vec<i32>,
    have_q8: bool,
    have_q8k: bool,
    have_sums: bool,
}

impl Activations {
    /// Takes `n` rows of `cols` values from `x`.
    pub fn set(&mut self, x: &[f32], n: usize, cols: usize) {
        self.n = n;
        self.cols = cols;
        self.f32.clear();
        self.f32.extend_from_slice(&x[..n * cols]);
        self.have_q8 = false;
        self.have_q8k = false;
        self.have_sums = false;
    }

    /// Builds `n` rows of `cols` values in place, `row(r, values)` writing row `r`, and
    /// quantizes them for `ws`, the matrices that will read them, in the same pass:
    /// the steps between two matmuls of a small batch (a norm, a copy, an activation
    /// function, then the 8-bit rounding) as one parallel region, rows split over
    /// `pool`'s threads from [`BUILD_ROWS`] rows, where each alone would run on one
    /// thread. Each row is built and quantized the same way whatever the split.
    pub fn build(
        &mut self,
        pool: &ThreadPool,
        isa: Isa,
        (n, cols): (usize, usize),
        ws: &[&QMatrix],
        row: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        let sums = ws.iter().any(|w| w.reads_sums(isa));
        let q8 = sums || ws.iter().any(|w| w.act_kind() == ActKind::Q8);
        let nb = cols / QK;
        self.n = n;
        self.cols = cols;
        self.f32.resize(n * cols, 0.0);
        self.q8
            .resize(if q8 { n * nb } else { 0 }, BlockQ8::zeroed());
        self.sums.resize(if sums { n * nb } else { 0 }, 0);
        let (mut f, mut q, mut s) = (&mut self.f32[..], &mut self.q8[..], &mut self.sums[..]);
        let mut parts = Vec::new();
        for (a, b) in pool.row_chunks(n, BUILD_ROWS) {
            let k = b - a;
            let (f0, f1) = std::mem::take(&mut f).split_at_mut(k * cols);
            let (q0, q1) = std::mem::take(&mut q).split_at_mut(if q8 { k * nb } else { 0 });
            let (s0, s1) = std::mem::take(&mut s).split_at_mut(if sums { k * nb } else { 0 });
            parts.push((a, f0, q0, s0));
            (f, q, s) = (f1, q1, s1);
        }
        pool.each(parts, &|(first, f, q, s)| {
            for (i, values) in f.chunks_exact_mut(cols).enumerate() {
                row(first + i, values);
            }
            if q8 {
                crate::kernels::quantize_q8(isa, f, q);
            }
            block_sums(q, s);
        });
        self.have_q8 = q8;
        self.have_sums = sums;
        self.have_q8k = false;
    }

    /// The values of every row, back to back.
    pub fn values(&self) -> &[f32] {
        &self.f32
    }

    /// Makes sure the `kind` representation exists (quantized on `isa`'s path, rows
    /// split over `pool`'s threads when there are many; every path and split produces
    /// the same bytes).
    pub fn ensure(&mut self, pool: &ThreadPool, isa: Isa, kind: ActKind) {
        match kind {
            ActKind::F32 => {}
            ActKind::Q8 if !self.have_q8 => {
                let (nb, cols) = (self.cols / QK, self.cols);
                self.q8.resize(self.n * nb, BlockQ8::zeroed());
                let x = &self.f32;
                pool.rows_mut(&mut self.q8, nb, PARALLEL_ROWS, &|first, q| {
                    let rows = q.len() / nb;
                    crate::kernels::quantize_q8(isa, &x[first * cols..(first + rows) * cols], q);
                });
                self.have_q8 = true;
            }
            ActKind::Q8K if !self.have_q8k => {
                let (nb, cols) = (self.cols / QK_K, self.cols);
                self.q8k.resize(self.n * nb, BlockQ8K::zeroed());
                let x = &self.f32;
                pool.rows_mut(&mut self.q8k, nb, PARALLEL_ROWS, &|first, q| {
                    let rows = q.len() / nb;
                    crate::kernels::quantize_q8k(isa, &x[first * cols..(first + rows) * cols], q);
                });
                self.have_q8k = true;
            }
            ActKind::Q8Sums if !self.have_sums => {
                self.ensure(pool, isa, ActKind::Q8);
                self.sums.resize(self.q8.len(), 0);
                block_sums(&self.q8, &mut self.sums);
                self.have_sums = true;
            }
            _ => {}
        }
    }

    #[inline]
    pub(super) fn f32_row(&self, t: usize, cols: usize) -> &[f32] {
        &self.f32[t * cols..(t + 1) * cols]
    }
    #[inline]
    pub(super) fn q8_row(&self, t: usize, cols: usize) -> &[BlockQ8] {
        self.q8_rows(t, 1, cols)
    }
    /// Rows `t..t + n`, one after another.
    #[inline]
    pub(super) fn q8_rows(&self, t: usize, n: usize, cols: usize) -> &[BlockQ8] {
        let nb = cols / QK;
        &self.q8[t * nb..(t + n) * nb]
    }
    #[inline]
    pub(super) fn sums_row(&self, t: usize, cols: usize) -> &[i32] {
        self.sums_rows(t, 1, cols)
    }
    #[inline]
    pub(super) fn sums_rows(&self, t: usize, n: usize, cols: usize) -> &[i32] {
        assert!(self.have_sums, "block sums made before use");
        let nb = cols / QK;
        &self.sums[t * nb..(t + n) * nb]
    }
    #[inline]
    pub(super) fn q8k_row(&self, t: usize, cols: usize) -> &[BlockQ8K] {
        self.q8k_rows(t, 1, cols)
    }
    /// Rows `t..t + n` in Q8_K, one after another.
    #[inline]
    pub(super) fn q8k_rows(&self, t: usize, n: usize, cols: usize) -> &[BlockQ8K] {
        let nb = cols / QK_K;
        &self.q8k[t * nb..(t + n) * nb]
    }
}

/// -128·Σq of each of `q`'s blocks into `out` (as many; none when `out` is empty).
fn block_sums(q: &[BlockQ8], out: &mut [i32]) {
    for (s, b) in out.iter_mut().zip(q) {
        *s = -128 * b.qs.iter().map(|&q| i32::from(q)).sum::<i32>();
    }
}
