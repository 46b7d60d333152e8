//! Compute kernels: quantized block formats, their dot products and matmuls, and the
//! thread pool that runs them. The only module besides `gguf::mmap` allowed `unsafe`.
//!
//! # Layout
//! - `quant`: `#[repr(C)]` block structs of every weight format, with size asserts.
//! - `scalar`: the reference twin of every kernel.
//! - `avx2`: AVX2/FMA/F16C kernels, chosen at run time; `avx2_kquants`: its Q2_K, Q3_K and
//!   Q5_K dots.
//! - `attend`: prefill attention in query blocks (rows sharing each tile of K/V).
//! - `avx512`: AVX-512 (F, BW, VL, VNNI) matmul kernels for Q4_1 and Q8_0 in sixteen-row
//!   tiles, where the CPU runs them; every other kernel of that path is the AVX2 one.
//! - `avx512_attend`, `avx512_block`: AVX-512 attention, one row's queries over runs of
//!   keys (decode), and a block of rows over one widened tile of keys (prefill).
//! - `avxvnni`: the AVX2 path with its 8-bit dot products done by AVX-VNNI's 256-bit
//!   `vpdpbusd` (VEX), for CPUs that run that and not AVX-512; the same bits as AVX2.
//! - `matmul`: [`QMatrix`] (weights laid out for the kernels) and the threaded matmul.
//! - `pool`: a persistent thread pool, one barrier per parallel region; tasks are claimed
//!   dynamically and waiting threads park, so more threads than cores degrade gracefully.
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
mod kv_rows;
pub mod matmul;
pub mod pool;
pub mod quant;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_kquants;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_attend;
#[cfg(target_arch = "x86_64")]
mod avx512_block;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avxvnni;
mod detect;

pub use attend::attend_block;
pub use kv_rows::{KvDtype, KvRows, KvRun};
pub use matmul::{matmul, matmul_add, Activations, QMatrix};
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

    /// Whether attention over f16 K/V keeps llama.cpp's flash-attention value
    /// accumulator (rounded to f16 after every key): the scalar and AVX2 paths, which
    /// give llama.cpp's AVX2 bits. The AVX-512 path, whose matmuls sum in their own
    /// order anyway, keeps it in f32: those round trips were a third of the time of each
    /// (query, key) pair. (The query is rounded to f16 on every path.)
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

/// Continues the online softmax of `state.len()` queries that share their keys (the
/// query heads of one KV head) over runs of keys: `q` and `acc` hold each query's
/// `head_dim` values back to back, `state[g]` its (running max, running sum). Each query
/// gets the bits `scalar::attend_runs` gives it alone, however many share the call,
/// with the path's rounding ([`Isa::f16_attention`]).
pub fn attend_runs(
    isa: Isa,
    q: &[f32],
    runs: &[KvRun],
    stride: usize,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    attend_runs_ahead(isa, q, runs, &[], stride, scale, state, acc)
}

/// [`attend_runs`] that also asks for the K/V rows of `ahead` (whole rows of `stride`
/// elements, into L2), spread evenly over the keys it reads: a decode step's next piece
/// of keys, fetched while this one is computed. Only the AVX-512 kernel spreads them;
/// the other paths ignore `ahead`. The result is `attend_runs`'s, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn attend_runs_ahead(
    isa: Isa,
    q: &[f32],
    runs: &[KvRun],
    ahead: &[KvRun],
    stride: usize,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let round = isa.f16_attention();
    attend_runs_as(isa, round, q, runs, ahead, stride, scale, state, acc)
}

/// [`attend_runs`] with the f16 rounding chosen (`round`), on `isa`'s kernels (tests
/// compare every kernel with its scalar twin both ways), asking for `ahead` as
/// [`attend_runs_ahead`] does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_runs_as(
    isa: Isa,
    round: bool,
    q: &[f32],
    runs: &[KvRun],
    ahead: &[KvRun],
    stride: usize,
    scale: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    let n = state.len();
    assert!(n > 0 && q.len() == acc.len() && q.len().is_multiple_of(n));
    let hd = q.len() / n;
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && simd_head(hd) {
        let f32_rows = runs.first().is_some_and(|r| matches!(r.k, KvRows::F32(_)));
        let zmm = zmm_attention(isa, round, hd);
        // As many queries per call as keep their values and accumulators in registers
        // (32 zmm or 16 ymm; the AVX2 kernel spills either way past head size 64).
        let most = match (zmm, hd) {
            (true, 32 | 64) => 3,
            (true, 96) => 2,
            (false, 64) => 4,
            _ => 1,
        };
        let mut g = 0;
        while g < n {
            let k = (n - g).min(most);
            // The first call asks for `ahead`; later ones find it asked for.
            let ahead = if g == 0 { ahead } else { &[] };
            let (q, st, acc) = (
                &q[hd * g..hd * (g + k)],
                &mut state[g..g + k],
                &mut acc[hd * g..hd * (g + k)],
            );
            // Each arm's `unsafe`: the AVX2 path and those above it are only produced
            // by `detect` after checking avx2, fma and f16c, and the AVX-512 path after
            // running one of its instructions.
            macro_rules! zmm {
                ($f32:expr; $(($c:literal, $g:pat) => $gc:literal),*) => {
                    match (hd / 32, k) {
                        $(($c, $g) => {
                            // SAFETY: see above; `zmm` is only set on the AVX-512 path.
                            unsafe { avx512_attend::attend_runs_zmm::<$f32, $c, $gc>(q, runs, ahead, stride, scale, st, acc) }
                        })*
                        _ => unreachable!(),
                    }
                };
            }
            macro_rules! ymm {
                ($f32:expr, $round:expr; $(($n:literal, $g:pat) => $gn:literal),*) => {
                    match (hd / 8, k) {
                        $(($n, $g) => {
                            // SAFETY: see above; this is the AVX2 path or one above it.
                            unsafe { avx2::attend_runs_ymm::<$f32, $round, $n, $gn>(q, runs, stride, scale, st, acc) }
                        })*
                        _ => unreachable!(),
                    }
                };
            }
            macro_rules! zmm_all {
                ($f32:expr) => {
                    zmm!($f32; (1, 1) => 1, (1, 2) => 2, (1, 3) => 3, (2, 1) => 1, (2, 2) => 2,
                        (2, 3) => 3, (3, 1) => 1, (3, 2) => 2, (4, _) => 1, (5, _) => 1,
                        (6, _) => 1, (7, _) => 1, (8, _) => 1)
                };
            }
            macro_rules! ymm_all {
                ($f32:expr, $round:expr) => {
                    ymm!($f32, $round; (8, 1) => 1, (8, 2) => 2, (8, 3) => 3, (8, 4) => 4,
                        (4, _) => 1, (12, _) => 1, (16, _) => 1, (20, _) => 1, (24, _) => 1,
                        (28, _) => 1, (32, _) => 1)
                };
            }
            match (zmm, f32_rows, round) {
                (true, true, _) => zmm_all!(true),
                (true, false, _) => zmm_all!(false),
                (false, true, _) => ymm_all!(true, false),
                (false, false, true) => ymm_all!(false, true),
                (false, false, false) => ymm_all!(false, false),
            }
            g += k;
        }
        return;
    }
    let _ = (isa, ahead);
    for ((q, st), acc) in q.chunks_exact(hd).zip(state).zip(acc.chunks_exact_mut(hd)) {
        scalar::attend_runs(q, runs, stride, scale, (&mut st.0, &mut st.1), acc, round);
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

/// Whether the SIMD attention kernels take head size `hd`.
fn simd_head(hd: usize) -> bool {
    hd.is_multiple_of(32) && hd <= 256
}

/// Whether [`attend_runs_as`] runs the AVX-512 kernel (`avx512_attend`) for head size
/// `hd` with rounding `round`.
pub(crate) fn zmm_attention(isa: Isa, round: bool, hd: usize) -> bool {
    isa.avx512() && !round && simd_head(hd)
}

/// [`attend_runs`] with soft-capped scores (`cap` ≠ 0: see
/// `scalar::attend_runs_capped`). Capped scores run the scalar kernel on every path
/// (only Gemma 2 caps them); `cap` = 0 is [`attend_runs`].
#[allow(clippy::too_many_arguments)]
pub fn attend_runs_capped(
    isa: Isa,
    q: &[f32],
    runs: &[KvRun],
    stride: usize,
    scale: f32,
    cap: f32,
    state: &mut [(f32, f32)],
    acc: &mut [f32],
) {
    if cap == 0.0 {
        return attend_runs(isa, q, runs, stride, scale, state, acc);
    }
    let n = state.len();
    assert!(n > 0 && q.len() == acc.len() && q.len().is_multiple_of(n));
    let hd = q.len() / n;
    let round = isa.f16_attention();
    for ((q, st), acc) in q.chunks_exact(hd).zip(state).zip(acc.chunks_exact_mut(hd)) {
        let st = (&mut st.0, &mut st.1);
        scalar::attend_runs_capped(q, runs, stride, scale, cap, st, acc, round);
    }
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
#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests_vnni;
#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
pub(crate) mod vnni_emulator;
