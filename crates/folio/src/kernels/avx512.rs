//! AVX-512 (F, BW, VL, VNNI) matmul kernels, chosen at run time when the CPU runs them
//! (see `detect.rs`; the path's other kernels are the AVX2 ones), over tiles of sixteen
//! rows, one 32-bit lane per row ([`BlockQ4_1x16`], [`BlockQ8_0x16`]: the layout
//! `QMatrix` takes for this path; a matrix in the four-row layout runs the AVX2
//! kernels, with EVEX `vpdpbusd`, and gets their bits).
//!
//! Lane r of a weight vector holds four consecutive weights of row r as unsigned bytes,
//! and the activations' matching four bytes are broadcast to every lane (a load, no
//! shuffle), so one `vpdpbusd` adds four products to each of sixteen rows, and eight of
//! them sum a whole 32-weight block in integers, exactly (as two chains of four, added:
//! half the latency, the same integer). The float work (convert, scale, accumulate) is
//! then done once per block for sixteen rows. This path's kernels before (four rows per
//! vector, four lanes per row, on four-row tiles) did it for every four rows: 24 vector
//! operations per 512 multiply-adds of Q4_1 there, 13 here (and the nibble split, once
//! per block for all the activation rows of a call); prefill and batched decode both
//! gained (docs/BENCHMARKS.md, "Design measurements").
//!
//! Per row, per block, in block order (the scalar twins `scalar::dot_q4_1_rows16` and
//! `scalar::dot_q8_0_rows16` are the same arithmetic):
//! - Q4_1: `acc = fma(d·d_x, Σ q·x, acc)` and, apart, `macc = fma(m, s_x, macc)`; the
//!   result is `acc + macc`.
//! - Q8_0: `acc = fma(d·d_x, Σ q·x, acc)`. The weights are stored offset by 128 (the
//!   unsigned operand); the integer sum starts from -128·Σx, the activation block's sum
//!   ([`ActKind::Q8Sums`](super::matmul::ActKind)), so it is Σ q·x exactly.
//!
//! Every activation row gets the same instructions whatever the tile width, so batch
//! invariance holds.
//!
//! A tile call takes up to sixteen activation rows: a decode step of sixteen sequences
//! loads each weight once, and its results go straight to the caller's output
//! ([`TileOut`], masked stores, the residual add included).
//!
//! Every function here is `unsafe` because it is compiled for CPU features the caller
//! must have checked, and the tile kernels also because they write through a
//! [`TileOut`]'s pointer (the caller vouches for its rows); slices are indexed with
//! bounds checks.
#![allow(unsafe_code)]

use super::avx2::{prefetch, TILE_PREFETCH_BLOCKS};
use super::quant::*;
use std::arch::x86_64::*;

/// Runs one 512-bit VNNI instruction (and a zmm xor): `detect` executes this in a child
/// process before choosing the AVX-512 path.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn probe() {
    // SAFETY: register-only instructions of the features this function requires.
    unsafe {
        std::arch::asm!(
            "vpxord {z}, {z}, {z}",
            "vpdpbusd {z}, {z}, {z}",
            z = out(zmm_reg) _,
            options(nomem, nostack, preserves_flags),
        );
    }
}

/// Keeps the compiler from moving memory reads across it (an empty `asm!` that may
/// touch memory; no instruction is emitted). Between two activation rows' work in the
/// wide tile kernels: unfenced, LLVM's scheduler interleaved the rows of a wide call for
/// parallelism and spilled their accumulators to the stack (102 zmm spills in the
/// sixteen-row Q4_1 kernel, against 2), on some builds and not others. The CPU still
/// overlaps the rows; only the instruction order is kept.
#[inline(always)]
pub(super) fn row_barrier() {
    // SAFETY: an empty instruction sequence.
    unsafe { std::arch::asm!("", options(nostack, preserves_flags)) };
}

/// Activation bytes `x[4k..4k+4]`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn dword(x: &[i8], k: usize) -> __m512i {
    let q: [u8; 4] = std::array::from_fn(|j| x[4 * k + j] as u8);
    _mm512_set1_epi32(i32::from_le_bytes(q))
}

/// One activation row's 32 bytes `x` (scale `xd`) against a tile's 32 weights per row,
/// added to `acc`: Σ q·x in integers (`q[k]` holds weights 4k..4k+4 of every row: two
/// chains of four `vpdpbusd`, the first from `init`, added), converted, times d·xd.
/// Starts with [`row_barrier`], so a wide call's rows stay in order.
///
/// A macro, not a function: as an `#[inline]` function LLVM kept it out of line once
/// the Q5_0 and K-quant kernels called it too, and the eight weight vectors went
/// through the stack on every call (17% of Gemma 3's prefill in `block` itself).
/// `#[inline(always)]` is refused on a `#[target_feature]` function.
macro_rules! block {
    ($acc:expr, $q:expr, ($x:expr, $xd:expr), $init:expr, $d:expr) => {{
        let (q, x): (&[__m512i; 8], &[i8]) = ($q, $x);
        $crate::kernels::avx512::row_barrier();
        let (mut p, mut p2) = ($init, _mm512_setzero_si512());
        for k in 0..4 {
            p = _mm512_dpbusd_epi32(p, q[k], $crate::kernels::avx512::dword(x, k));
            p2 = _mm512_dpbusd_epi32(p2, q[k + 4], $crate::kernels::avx512::dword(x, k + 4));
        }
        let p = _mm512_add_epi32(p, p2);
        let sc = _mm512_mul_ps($d, _mm512_set1_ps($xd));
        _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), $acc)
    }};
}
pub(super) use block;

/// Where a tile call writes: activation row c's results for the tile's first `len`
/// (≤ 16) rows at `ptr + c·stride`, set, or with `add` added to what is there (one f32
/// add each: a residual connection without its own pass). The rest (a tile's padding
/// rows) are neither read nor written.
pub struct TileOut {
    pub ptr: *mut f32,
    pub stride: usize,
    pub len: usize,
    pub add: bool,
}

/// The blocks per row of a tile call, checked: `w` holds one tile's blocks, and each
/// of `a` (at most 16 activation rows) as many. (Not `avx2::tile_blocks`, which takes
/// the count from `a`: with it the 16-row Q8_0 kernel kept five accumulators on the
/// stack inside its loop.)
pub(super) fn tile_blocks<T, A>(w: &[T], a: &[&[A]], out: &TileOut) -> usize {
    let nb = w.len();
    assert!(a.len() <= 16 && a.iter().all(|x| x.len() == nb) && out.len <= 16);
    nb
}

/// Sixteen packed Q4_1 rows × C activation rows: `dot(row r, a[c])` written to `out`
/// for each c, r.
///
/// # Safety
/// The CPU runs this function's features, and for every c < C, `out.ptr + c·out.stride`
/// is valid for reads and writes of `out.len` floats that nothing else accesses during
/// the call.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q4_1x16<const C: usize>(w: &[BlockQ4_1x16], a: [&[BlockQ8]; C], out: &TileOut) {
    let nb = tile_blocks(w, &a, out);
    let low4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS / 4, 5);
        let b = &w[i];
        // SAFETY: `d` is 16 halves (32 bytes); `qs` is 4 × 64 bytes.
        let (d, raw) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(b.d.as_ptr() as *const __m256i)),
                std::array::from_fn::<_, 4, _>(|j| {
                    _mm512_loadu_si512(b.qs[j].as_ptr() as *const __m512i)
                }),
            )
        };
        // Weights 4j..4j+4 of each row (low nibbles), then 16+4j.. (high).
        let q: [__m512i; 8] = std::array::from_fn(|k| {
            if k < 4 {
                _mm512_and_si512(raw[k], low4)
            } else {
                _mm512_and_si512(_mm512_srli_epi16(raw[k - 4], 4), low4)
            }
        });
        // Unrolled by hand (C ≤ 16, constant indices), as in `tile_q8_0x16`.
        let zero = _mm512_setzero_si512();
        macro_rules! row {
            ($($c:literal)*) => {$(
                if $c < C {
                    acc[$c] = block!(acc[$c], &q, (&a[$c][i].qs, a[$c][i].d), zero, d);
                }
            )*};
        }
        row!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }
    // The min terms in their own sums, added at the end (as llama.cpp's kernels keep
    // them), in a second pass over the tile (now in L1): beside the first pass's eight
    // weight vectors, C more accumulators would not fit in the registers.
    let mut macc = [_mm512_setzero_ps(); C];
    for (i, b) in w[..nb].iter().enumerate() {
        // SAFETY: `m` is 16 halves (32 bytes).
        let m = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(b.m.as_ptr() as *const __m256i)) };
        for c in 0..C {
            macc[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[c][i].s), macc[c]);
        }
    }
    for c in 0..C {
        // SAFETY: row c of `out` is valid (this function's contract).
        unsafe { store(_mm512_add_ps(acc[c], macc[c]), out, c) };
    }
}

/// Sixteen packed Q8_0 rows (offset by 128) × C activation rows, as [`tile_q4_1x16`]
/// (and with its contract); `sums` holds -128·Σx of each of `a`'s blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q8_0x16<const C: usize>(
    w: &[BlockQ8_0x16],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    assert!(sums.iter().all(|s| s.len() == nb));
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        prefetch(w, i + TILE_PREFETCH_BLOCKS / 4, 9);
        let b = &w[i];
        // SAFETY: `d` is 16 halves (32 bytes); `qs` is 8 × 64 bytes.
        let (d, q) = unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(b.d.as_ptr() as *const __m256i)),
                std::array::from_fn::<_, 8, _>(|k| {
                    _mm512_loadu_si512(b.qs[k].as_ptr() as *const __m512i)
                }),
            )
        };
        // Unrolled by hand (C ≤ 16, constant indices): as a loop, LLVM kept the widest
        // case rolled with its accumulators on the stack.
        macro_rules! row {
            ($($c:literal)*) => {$(
                if $c < C {
                    let init = _mm512_set1_epi32(sums[$c][i]);
                    acc[$c] = block!(acc[$c], &q, (&a[$c][i].qs, a[$c][i].d), init, d);
                }
            )*};
        }
        row!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }
    for (c, &v) in acc.iter().enumerate() {
        // SAFETY: row c of `out` is valid (this function's contract).
        unsafe { store(v, out, c) };
    }
}

/// Writes `v`'s first `out.len` lanes to `out`'s row c, as [`TileOut`] says.
///
/// # Safety
/// `out.ptr + c·out.stride` is valid for reads and writes of `out.len` (≤ 16) floats.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store(v: __m512, out: &TileOut, c: usize) {
    let mask = ((1u32 << out.len) - 1) as __mmask16;
    let (p, add) = (out.ptr.wrapping_add(c * out.stride), out.add);
    // SAFETY: the mask covers the row's `len` valid floats only (the caller's
    // promise), and masked-off lanes are not accessed (nor can they fault).
    unsafe {
        let v = if add {
            _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), v)
        } else {
            v
        };
        _mm512_mask_storeu_ps(p, mask, v);
    }
}

/// One activation row against consecutive Q4_1 tiles of `nb` blocks each:
/// `out[16t + r] = dot(row r of tile t, a)` (or `+=` with `add`), each tile by
/// `tile_q4_1x16`'s arithmetic (looped here, compiled for the kernel's features, so the
/// kernel inlines: decode's matmuls are one row against thousands of tiles).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tiles_q4_1x16_one_row(
    w: &[BlockQ4_1x16],
    nb: usize,
    a: &[BlockQ8],
    out: &mut [f32],
    add: bool,
) {
    assert_eq!(
        w.len(),
        out.len() / 16 * nb,
        "a tile of blocks per 16 outputs"
    );
    for (tile, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(16)) {
        let o = TileOut {
            ptr: o.as_mut_ptr(),
            stride: 0,
            len: 16,
            add,
        };
        // SAFETY: same CPU features as this function; `o` is one row of 16 floats,
        // borrowed mutably here.
        unsafe { tile_q4_1x16::<1>(tile, [a], &o) };
    }
}

/// [`tiles_q4_1x16_one_row`] for Q8_0 tiles; `sums` as in [`tile_q8_0x16`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tiles_q8_0x16_one_row(
    w: &[BlockQ8_0x16],
    nb: usize,
    a: &[BlockQ8],
    sums: &[i32],
    out: &mut [f32],
    add: bool,
) {
    assert_eq!(
        w.len(),
        out.len() / 16 * nb,
        "a tile of blocks per 16 outputs"
    );
    for (tile, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(16)) {
        let o = TileOut {
            ptr: o.as_mut_ptr(),
            stride: 0,
            len: 16,
            add,
        };
        // SAFETY: same CPU features as this function; `o` is one row of 16 floats,
        // borrowed mutably here.
        unsafe { tile_q8_0x16::<1>(tile, [a], [sums], &o) };
    }
}
