//! Compute kernels: quantized block formats, their dot products and matmuls, and the
//! thread pool that runs them. The only module besides `gguf::mmap` allowed `unsafe`.
//!
//! # Layout
//! - `quant`: `#[repr(C)]` block structs of every weight format, with size asserts.
//! - `scalar`: the reference twin of every kernel.
//! - `avx2`: AVX2/FMA/F16C kernels, chosen at run time; `avx2_kquants`: its Q2_K, Q3_K and
//!   Q5_K dots; `avx2_tiles16`: its (and AVX-VNNI's) Q5_0, Q4_K and Q6_K kernels over the
//!   sixteen-row tiles of `tiles16`, `avx2_tiles16_more` its Q4_0, IQ4_NL and Q5_K ones.
//! - `attend`: the attention kernels' one entry ([`attend`], [`Attend`]): a block of rows
//!   over runs of keys (rows sharing each tile of K/V); `attend_runs`: one row's entries
//!   on each path.
//! - `cpu`: [`Cpu`], the pool and path as one handle the model calls the kernels through.
//! - `tiles16`: the sixteen-row tile layouts (one lane per row) of the AVX-512 path for
//!   Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, Q4_K, Q5_K and Q6_K (and of the AVX2 paths for all
//!   but Q4_1, Q8_0 and Q5_K), and each GGUF block's way into a lane and back.
//! - `avx512`: AVX-512 (F, BW, VL, VNNI) matmul kernels for Q4_1 and Q8_0 in sixteen-row
//!   tiles, where the CPU runs them; `avx512_kquants`: the same for Q4_0, Q5_0, IQ4_NL,
//!   Q4_K, Q5_K and Q6_K.
//!   Every other kernel of that path is the AVX2 one.
//! - `avx512_attend`, `avx512_block`: AVX-512 attention, one row's queries over runs of
//!   keys (decode), and a block of rows over one widened tile of keys (prefill);
//!   `avx2_block`: the block kernel on AVX2 (the AVX2 row kernel is in `avx2`).
//! - `avxvnni`: the AVX2 path with its 8-bit dot products done by AVX-VNNI's 256-bit
//!   `vpdpbusd` (VEX), for CPUs that run that and not AVX-512; the same bits as AVX2.
//! - `matmul/`: [`QMatrix`] (weights laid out and packed for the kernels), the
//!   [`Activations`] a matmul reads, and the threaded tiled matmul (its `mod.rs` maps
//!   the files).
//! - `kv_rows`: [`KvDtype`], [`KvRows`], [`KvRun`]: stored K/V (f16, f32, 8-bit) as the attention kernels
//!   read it.
//! - `pool`: a persistent thread pool, one barrier per parallel region; tasks are claimed
//!   dynamically and waiting threads park, so more threads than cores degrade gracefully.
//!
//! # Numerics
//! The kernels do the arithmetic llama.cpp's CPU backend does on its generation path:
//! matmul inputs rounded to 8 bits in blocks of 32 with their scales and sums through
//! f16; 8-lane float partial sums per block, fused multiply-adds where ggml's C is
//! contracted; an f64 sum of squares in RMSNorm; RoPE angles advanced by repeated
//! multiplication; attention as ggml's flash attention (query rounded to f16, online
//! softmax over keys in order, value accumulator in f16 on the scalar and AVX2 paths);
//! SwiGLU with the same vectorised exp. The AVX2 path gives llama.cpp's AVX2 build's
//! bits on the default model; the scalar path and the AVX-512 matmuls sum in orders of
//! their own. The model's second pass over outlier blocks (`model/outliers.rs`) then
//! takes about 30% off the distance from a float64 evaluation.
//!
//! The instruction set is detected once ([`isa`]) by CPUID and, for AVX-512 and
//! AVX-VNNI, by running one of their instructions in a child process: some CPUs list an
//! extension and fault on it. `FOLIO_ISA=scalar|avx2|avxvnni|avx512` forces a path the
//! CPU runs (tests, and measuring what SIMD buys).

#![allow(unsafe_code)]

/// Generates the one-activation-row form of a four-row tile kernel over consecutive
/// tiles: `out[4t + r] = dot(row r of tile t, a)`, `nb` blocks per tile, compiled for
/// the kernel's features so the kernel inlines (with `D`, the AVX2 path's 8-bit dot
/// step, where the kernel takes one). Decode's matmuls are one activation row against
/// thousands of tiles, and a dispatch per tile cost as much as a tile's 18 blocks of
/// work. Each tile runs the kernel's one-column arithmetic: the bits are those of the
/// kernel called tile by tile.
#[cfg(target_arch = "x86_64")]
macro_rules! one_row_over_tiles {
    ($features:literal, $name:ident $(<$d:ident>)?, $tile:ident, $blk:ty) => {
        #[target_feature(enable = $features)]
        pub unsafe fn $name$(<const $d: u8>)?(w: &[$blk], nb: usize, a: &[BlockQ8], out: &mut [f32]) {
            assert_eq!(w.len(), out.len() / 4 * nb, "a tile of blocks per four outputs");
            for (tile, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(4)) {
                let mut r = [[0f32; 1]; 4];
                // SAFETY: same CPU features as this function.
                unsafe { $tile::<$($d,)? 1>(tile, [a], &mut r) };
                for (d, s) in o.iter_mut().zip(r) {
                    *d = s[0];
                }
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
use one_row_over_tiles;

mod attend;
mod attend_runs;
mod cpu;
mod kv_rows;
pub mod matmul;
pub mod pool;
pub mod quant;
pub mod scalar;
pub mod tiles16;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_block;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_kquants;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_tiles16;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_tiles16_more;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_attend;
#[cfg(target_arch = "x86_64")]
mod avx512_block;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_kquants;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avxvnni;
mod detect;

pub use attend::{attend, Attend};
#[cfg(test)]
pub(crate) use attend_runs::attend_runs;
pub(crate) use attend_runs::{attend_row, simd_head, zmm_attention};
pub use cpu::Cpu;
pub use kv_rows::{quantize_kv_q8, rotate_heads, KvDtype, KvRows, KvRun};
pub use matmul::{matmul, Activations, Layout, QMatrix};
pub use pool::ThreadPool;

#[cfg(test)]
pub use detect::detect;
pub use detect::{isa, runnable, runnable_at_most};

/// The instruction set the kernels use. Each SIMD path includes AVX2: the AVX-512 path
/// runs AVX2 kernels wherever it has no kernel of its own, and the AVX-VNNI path is
/// the AVX2 path with VNNI's 8-bit dot products. The order is the order of preference,
/// not of inclusion: a CPU that runs AVX-512 may fault on AVX-VNNI (AMD Zen 4), so
/// which paths run is [`runnable`], never "everything up to the best".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    AvxVnni,
    Avx512,
}

impl Isa {
    /// Whether the AVX2 + FMA + F16C kernels may run (checked at detection).
    pub fn avx2(self) -> bool {
        self >= Isa::Avx2
    }

    /// Whether the AVX-512 (F, BW, VL, VNNI) kernels may run (checked at detection,
    /// by executing one).
    pub fn avx512(self) -> bool {
        self >= Isa::Avx512
    }

    /// Whether the AVX2 kernels' 8-bit dot products use AVX-VNNI's 256-bit `vpdpbusd`
    /// (checked at detection, by executing one). Only on the AVX-VNNI path: the AVX-512
    /// path has its own VNNI kernels, and a CPU running AVX-512 may fault on this one.
    pub fn avx_vnni(self) -> bool {
        self == Isa::AvxVnni
    }

    /// Whether llama.cpp's arithmetic on this path (`--llama-arithmetic`,
    /// [`Cpu::llama_arithmetic`]) keeps llama.cpp's flash-attention value accumulator
    /// over f16 K/V (rounded to f16 after every key): the scalar and AVX2 paths, which
    /// then give llama.cpp's AVX2 bits. The AVX-512 path, whose matmuls sum in their own
    /// order anyway, never does. folio's own arithmetic keeps the accumulators in f32 on
    /// every path: nearer the exact model, and the round trips were a third of the time
    /// of each (query, key) pair. (The query is rounded to f16 on every path.)
    pub fn f16_attention(self) -> bool {
        self != Isa::Avx512
    }

    /// The name `FOLIO_ISA` takes and `bench` prints.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
/// dot(w, x) for f16 weights and f32 activations.
pub fn dot_f16(isa: Isa, w: &[u16], x: &[f32]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::dot_f16(w, x) },
        _ => scalar::dot_f16(w, x),
    }
}

/// Asks the kernel to back `buf`'s whole pages with 2 MiB pages, before anything
/// touches them (a fresh zeroed allocation): buffers streamed on every token (weights,
/// K/V) would miss the TLB on every 4 KiB page. Advice only: without transparent huge
/// pages, or off Linux, nothing changes.
pub fn advise_huge_pages<T: bytemuck::Pod>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = buf.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(buf);
        let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if b > a {
            // SAFETY: [a, b) lies inside `buf` (rounded inwards to pages); MADV_HUGEPAGE
            // changes only how the kernel backs those pages, never their contents, and
            // a failure (no THP) is harmless.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

/// The wrapping sum of `words`, read as the tile kernels read weights: in order, with a
/// software prefetch far ahead of the loads (8 KiB). The read-bandwidth probe runs it
/// beside a plain fold and keeps the faster, so decode is measured against what a
/// thread can read, not against what the hardware prefetcher alone fetches.
pub fn stream_sum(words: &[u64]) -> u64 {
    const AHEAD: usize = 1024;
    let mut lanes = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |s, &w| s.wrapping_add(w));
    for (i, chunk) in chunks.enumerate() {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let ahead = words.as_ptr().wrapping_add(8 * i + AHEAD) as *const i8;
            // SAFETY: SSE is part of x86_64, and a prefetch never faults, whatever
            // the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead) };
        }
        for (l, &w) in lanes.iter_mut().zip(chunk) {
            *l = l.wrapping_add(w);
        }
    }
    lanes.iter().fold(tail, |s, &l| s.wrapping_add(l))
}

/// `out` = `x` rounded to f16 precision (the query of llama.cpp's flash attention).
#[cfg(test)]
pub fn round_f16(x: &[f32], out: &mut Vec<f32>) {
    out.clear();
    scalar::round_f16_into(x, out);
}

/// `out[i]` = `x[i]` as f16 bits (round to nearest even; the same bits on every path,
/// so the detected one is taken): storing K/V.
pub fn to_f16(x: &[f32], out: &mut [u16]) {
    assert_eq!(x.len(), out.len(), "to_f16: lengths differ");
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::to_f16(x, out) },
        _ => scalar::to_f16(x, out),
    }
}

/// Appends `x` rounded to f16 precision to `out`.
pub fn round_f16_into(isa: Isa, x: &[f32], out: &mut Vec<f32>) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::round_f16_into(x, out) },
        _ => scalar::round_f16_into(x, out),
    }
}

/// Rotates each `head_dim`-wide head of `row` by `table`'s (cos, sin) pairs, the pairs
/// adjacent (llama) or `half` apart (NeoX); the same bits on every path.
pub fn rope_rotate(
    isa: Isa,
    adjacent: bool,
    half: usize,
    head_dim: usize,
    table: &[(f32, f32)],
    row: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::rope_rotate(adjacent, half, head_dim, table, row) },
        _ => scalar::rope_rotate(adjacent, half, head_dim, table, row),
    }
}

/// Quantizes activations into 8-bit blocks (identical bytes on every path).
pub fn quantize_q8(isa: Isa, x: &[f32], out: &mut [quant::BlockQ8]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::quantize_q8(x, out) },
        _ => scalar::quantize_q8(x, out),
    }
}

/// Quantizes activations into Q8_K blocks (identical bytes on every path).
pub fn quantize_q8k(isa: Isa, x: &[f32], out: &mut [quant::BlockQ8K]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::quantize_q8k(x, out) },
        _ => scalar::quantize_q8k(x, out),
    }
}

/// What the 8-bit rounding of blocks of 32 values leaves: `out = x - d·q`, each block
/// rounded as [`quantize_q8`] rounds it (the same bytes on every path; `isa` only picks
/// the rounding's speed).
pub fn q8_residual(isa: Isa, x: &[f32], out: &mut [f32]) {
    assert!(x.len() == out.len() && x.len().is_multiple_of(quant::QK));
    for (xs, os) in x
        .chunks_exact(quant::QK)
        .zip(out.chunks_exact_mut(quant::QK))
    {
        let mut b = [<quant::BlockQ8 as bytemuck::Zeroable>::zeroed()];
        quantize_q8(isa, xs, &mut b);
        let b = &b[0];
        for ((o, &v), &q) in os.iter_mut().zip(xs).zip(&b.qs) {
            *o = v - b.d * f32::from(q);
        }
    }
}

/// gate = silu(gate) · up (SwiGLU), with ggml's vectorised exp.
pub fn swiglu(isa: Isa, gate: &mut [f32], up: &[f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 paths are only ever produced by `detect` after checking the features.
        i if i.avx2() => unsafe { avx2::swiglu(gate, up) },
        _ => scalar::swiglu(gate, up),
    }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_build;
#[cfg(test)]
mod tests_columns;
#[cfg(test)]
mod tests_tiles16;
#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests_vnni;
#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
pub(crate) mod vnni_emulator;
