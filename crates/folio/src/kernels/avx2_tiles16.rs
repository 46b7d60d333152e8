//! AVX2 sixteen-row tile kernels for Q5_0, Q4_K and Q6_K over the AVX-512 path's
//! layouts ([`BlockQ5_0x16`], [`BlockQ4Kx16`], [`BlockQ6Kx16`]), so the AVX2 and
//! AVX-VNNI paths get tiled prefill and decode from the same packed matrices, with
//! the AVX-512 kernels' bits (`avx512_kquants`; the scalar twins
//! `scalar::dot_q5_0_rows16`, `dot_q4k_rows16` and `dot_q6k_rows16` define them).
//!
//! A tile of sixteen rows is two halves of eight: bytes 0..32 of each 64-byte vector
//! of the layout are rows 0..7 (four weights each, one 32-bit lane per row), bytes
//! 32..64 rows 8..15. Each half is an eight-row kernel on 256-bit vectors: its weight
//! vectors are unpacked once per (sub-)block for every activation row of the call, and
//! each activation row's four matching bytes are broadcast to every lane. The 8-bit
//! dot step is the AVX2 path's `D` (`avxvnni`): `vpdpbusd` (VEX on AVX-VNNI, EVEX on
//! AVX-512), or on plain AVX2 `vpmaddubsw` products summed in 16 bits over a few
//! vectors, then `vpmaddwd` by ones to 32 bits. `vpmaddubsw` saturates at ±32767, and
//! none of these sums gets there (activations within -128..=127):
//! - Q4_K: nibbles 0..=15: a pair 2·15·128 = 3840, eight vectors summed 30720;
//! - Q5_0: 5-bit 0..=31 (the -16 is in the sum's start): 2·31·128 = 7936, four summed
//!   31744;
//! - Q6_K: 6-bit 0..=63 (the -32 likewise): 2·63·128 = 16128, two summed 32256.
//!
//! The integer sums are exact whichever step, so every path gives the same bits.
//!
//! Per row, in order (as the AVX-512 kernels and the twins):
//! - Q5_0, per block: `acc = fma(d·d_x, Σ (q - 16)·x, acc)`; the integer sum starts
//!   from -16·Σx (an eighth of the Q8_0 kernel's block sums, `ActKind::Q8Sums`).
//! - Q4_K, per super-block: for each sub-block j of 32, `acc = fma((d·sc_j)·d_x, Σ q·x,
//!   acc)`; then `acc = fnmadd(dmin·d_x, Σ_j m_j·Σx_j, acc)` (the mins' sum in integers,
//!   by `vpmaddwd` over pairs of sub-blocks: exact).
//! - Q6_K, per super-block: for each sub-block s of 16, `acc = fma((d·sc_s)·d_x,
//!   Σ (q - 32)·x, acc)`; the integer sum starts from -32·Σx (the activations' sums of
//!   16).
//!
//! Every activation row gets the same instructions whatever the tile width (batch
//! invariance). At width one both halves run in one pass over the blocks (decode: the
//! weights stream through once, two accumulators), and so do Q6_K's wider calls (four
//! weight vectors per step); Q4_K's and Q5_0's (eight) run half by half (the second
//! half's bytes of each cache line are then in L1 or L2), so only C accumulators are
//! live beside a block's weight vectors.
//!
//! At width one each block's lines are asked into L2 48 KiB ahead, as the AVX-512
//! kernels do (`avx512_kquants::AHEAD`; [`ahead`]). On AMD Zen 3 (2 threads, Llama-1B
//! shape Q4_K_M, tg64, alternating builds) Q6_K's one-row kernel stalled on its first
//! loads of each block without it: 19.3 tok/s with none, 24.3 with Q6_K's, 25.5 with
//! Q4_K's and Q5_0's too (`folio bench`: 92% of the measured read bandwidth, from
//! 62%). On an AMD Zen 4 with `FOLIO_ISA=avx2` the same prefetch had measured no faster
//! (tg64 29-32 against 32-35 tok/s without); 24 and 96 KiB ahead measured no different
//! from 48 on Zen 3 (within its run-to-run spread).
//!
//! Every function here is `unsafe` because it is compiled for CPU features the caller
//! must have checked (and step `D`'s instruction), and writes through a [`TileOut`]'s
//! pointer (the caller vouches for its rows); slices are indexed with bounds checks.
#![allow(unsafe_code)]

use super::avx512::{row_barrier, tile_blocks, TileOut};
use super::avxvnni::{sums_add, MADD};
use super::quant::*;
use super::tiles16::{BlockQ4Kx16, BlockQ5_0x16, BlockQ6Kx16};
use std::arch::x86_64::*;

/// Half `h` (0: rows 0..7, 1: rows 8..15) of a 64-byte tile vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn half(v: &[u8; 64], h: usize) -> __m256i {
    let v = &v[32 * h..32 * h + 32];
    // SAFETY: `v` is 32 bytes.
    unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
}

/// Half `h` of sixteen f16 values, as floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn half_ps(d: &[u16; 16], h: usize) -> __m256 {
    let d = &d[8 * h..8 * h + 8];
    // SAFETY: `d` is 8 halves, 16 bytes.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr() as *const __m128i)) }
}

/// Half `h` of sixteen bytes as eight 32-bit lanes, zero- or sign-extended, converted
/// to floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn half_bytes_ps(b: &[u8; 16], h: usize, signed: bool) -> __m256 {
    let b = &b[8 * h..8 * h + 8];
    // SAFETY: `b` is 8 bytes.
    let v = unsafe { _mm_loadl_epi64(b.as_ptr() as *const __m128i) };
    let i = if signed {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    };
    _mm256_cvtepi32_ps(i)
}

/// Activation bytes `x[4k..4k+4]`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dword(x: &[i8], k: usize) -> __m256i {
    let q: [u8; 4] = std::array::from_fn(|j| x[4 * k + j] as u8);
    _mm256_set1_epi32(i32::from_le_bytes(q))
}

/// Asks L2 for part `part.0` of `part.1` of the lines of block `i` of `w`, a fixed
/// distance further on (`avx512_kquants::prefetch_ahead`'s). The kernels do at width
/// one, once per block: decode streams every weight from memory, one activation row
/// against thousands of tiles.
#[inline(always)]
pub(super) fn ahead<T: bytemuck::Pod>(w: &[T], i: usize, part: (usize, usize)) {
    let size = std::mem::size_of::<T>();
    super::avx512_kquants::prefetch_ahead(bytemuck::cast_slice(w), i * size, size, part);
}

/// `a` for half `h`, the second half's opaque to the compiler: with both halves in one
/// pass over the blocks, LLVM otherwise loaded the activations' broadcasts once for
/// both (they are the same) and kept the first half's on the stack for the second (128
/// ymm spills in the one-row Q6_K kernel, which ran slower than the per-row kernel).
#[inline(always)]
pub(super) fn launder<T: Copy>(a: T, h: usize) -> T {
    if h == 0 {
        a
    } else {
        std::hint::black_box(a)
    }
}

/// `v` shifted by `s` bits within each 16-bit lane: left for `s` > 0, right for `s` < 0
/// (-4..=4; constant where the kernels call it, so the match folds away).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn shift(v: __m256i, s: i32) -> __m256i {
    match s {
        4 => _mm256_slli_epi16::<4>(v),
        3 => _mm256_slli_epi16::<3>(v),
        2 => _mm256_slli_epi16::<2>(v),
        1 => _mm256_slli_epi16::<1>(v),
        0 => v,
        -1 => _mm256_srli_epi16::<1>(v),
        -2 => _mm256_srli_epi16::<2>(v),
        -3 => _mm256_srli_epi16::<3>(v),
        _ => _mm256_srli_epi16::<4>(v),
    }
}

/// `$init` + Σ_k (lane-wise 4-byte dot of `$q[k]` with activation bytes 4k..4k+4 of
/// `$x`), in 32-bit lanes, exactly: with `MADD` the products of `$group` vectors are
/// summed in 16 bits first (the module doc's bounds say why that never saturates),
/// else two chains of `vpdpbusd`, added. A macro, so the weight vectors stay in
/// registers (as `avx512::block`).
macro_rules! isum {
    ($d:ident, $group:literal, $init:expr, $q:expr, $x:expr) => {{
        let (q, x): (&[__m256i; _], &[i8]) = ($q, $x);
        let mut p = $init;
        if $d == MADD {
            let ones = _mm256_set1_epi16(1);
            for g in (0..q.len()).step_by($group) {
                let mut s = _mm256_maddubs_epi16(q[g], dword(x, g));
                for k in g + 1..g + $group {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(q[k], dword(x, k)));
                }
                p = _mm256_add_epi32(p, _mm256_madd_epi16(s, ones));
            }
            p
        } else {
            let mut p2 = _mm256_setzero_si256();
            for k in (0..q.len()).step_by(2) {
                // SAFETY: the caller guarantees step D's instruction.
                unsafe {
                    p = sums_add::<$d>(p, q[k], dword(x, k));
                    p2 = sums_add::<$d>(p2, q[k + 1], dword(x, k + 1));
                }
            }
            _mm256_add_epi32(p, p2)
        }
    }};
}

pub(super) use isum;

/// Runs `$body` for each activation row `$c` < `$n` (a constant, at most 8): for one row
/// as is; for more, in a loop whose trip count the compiler cannot see (`black_box`),
/// so each row's loads stay with that row's work. Unrolled over the constant (even with
/// `row_barrier`s between the rows, which do not fence loads through shared
/// references), LLVM loaded every row's activations first and spilled them to the
/// stack. Measured (`benches/matmul.rs`, Llama-1B `ffn_up` Q4_K, 512 rows, one thread,
/// AMD Zen 3, alternating): 23.1-36.3 multiply-adds per ns unrolled, 36.8-50.4 so;
/// the 1B shape's pp512 47-55 tok/s, then 72-74.
macro_rules! each_row {
    ($n:ident, |$c:ident| $body:block) => {
        const { assert!($n <= 8, "at most eight activation rows per call") };
        if $n == 1 {
            let $c: usize = 0;
            $body
        } else {
            for $c in 0..std::hint::black_box($n) $body
        }
    };
}

pub(super) use each_row;

/// [`each_row!`] unrolled over the constant, a [`row_barrier`] before each row: for
/// Q6_K's kernel, whose two halves run in one pass up to width four (eight
/// accumulators beside four weight vectors). In a loop its accumulators go through
/// memory, and it measured no faster (Llama-1B `ffn_down`, 512 rows, one thread,
/// alternating: 23.9-24.6 multiply-adds per ns, against 25.4-34.5 unrolled).
macro_rules! each_row_unrolled {
    ($n:ident, |$c:ident| $body:block) => {
        const { assert!($n <= 8, "at most eight activation rows per call") };
        each_row_unrolled!(@ $n, |$c| $body, 0 1 2 3 4 5 6 7)
    };
    (@ $n:ident, |$c:ident| $body:block, $($k:literal)*) => {$(
        if $k < $n {
            let $c: usize = $k;
            row_barrier();
            $body
        }
    )*};
}

/// The K-quant mins of half `h` of a Q4_K-layout block `b` (Q4_K's, and Q5_K's first
/// fields) for activation block `i` of each row: per row c, `acc[c] -= (dmin · d_x) ·
/// Σ_j m_j · (sum of sub-block j's activations)`, pairs of sub-blocks per `vpmaddwd`
/// (16-bit mins ≤ 63 and sums ≤ 32·128: exact).
macro_rules! k_mins {
    ($n:ident, $b:expr, $a:expr, $i:expr, $h:expr, $acc:expr) => {{
        let (b, h) = ($b, $h);
        let dmin = half_ps(&b.dmin, h);
        let m: [__m256i; 4] = std::array::from_fn(|p| {
            let m = &b.m[p][16 * h..16 * h + 16];
            // SAFETY: `m` is 16 bytes.
            _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(m.as_ptr() as *const __m128i) })
        });
        each_row!($n, |c| {
            let x = &$a[c][$i];
            let sub = |j: usize| x.bsums[2 * j].wrapping_add(x.bsums[2 * j + 1]) as u16;
            let mut im = _mm256_setzero_si256();
            for (p, mp) in m.iter().enumerate() {
                let pair = u32::from(sub(2 * p)) | (u32::from(sub(2 * p + 1)) << 16);
                im = _mm256_add_epi32(im, _mm256_madd_epi16(*mp, _mm256_set1_epi32(pair as i32)));
            }
            let mv = _mm256_mul_ps(dmin, _mm256_set1_ps(x.d));
            $acc[c] = _mm256_fnmadd_ps(mv, _mm256_cvtepi32_ps(im), $acc[c]);
        });
    }};
}

pub(super) use k_mins;

/// Writes half `h` of activation row c's results (`acc[c]`, rows 8h..8h+8 of the tile)
/// to `out`, as [`TileOut`] says: only the tile's first `out.len` rows.
///
/// # Safety
/// For every c < C, `out.ptr + c·out.stride` is valid for reads and writes of `out.len`
/// floats that nothing else accesses during the call.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store_half<const C: usize>(acc: &[__m256; C], out: &TileOut, h: usize) {
    let n = out.len.saturating_sub(8 * h).min(8);
    for (c, v) in acc.iter().enumerate() {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` is 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *v) };
        // SAFETY: rows 8h..8h + n < out.len of row c are valid and ours (the contract).
        let o = unsafe {
            std::slice::from_raw_parts_mut(out.ptr.wrapping_add(c * out.stride + 8 * h), n)
        };
        for (o, &l) in o.iter_mut().zip(&lanes) {
            *o = if out.add { *o + l } else { l };
        }
    }
}

/// Runs `$step!(acc, i, h)` (block i, half h, adding into `acc: [__m256; C]`) over the
/// tile's blocks and the halves that hold real rows, then `$finish!(acc, h)` where given
/// (terms kept apart until the end, as Q4_1's mins), then stores: up to width
/// `$together` both halves per block (one pass over the weights and the activations,
/// 2·C accumulators), wider half by half (C accumulators beside a block's weight
/// vectors; the second half's bytes are then in L1 or L2).
macro_rules! halves {
    ($c:ident, $together:literal, $nb:expr, $out:expr, $step:ident) => {{
        macro_rules! no_finish {
            ($acc:expr, $h:expr) => {};
        }
        halves!($c, $together, $nb, $out, $step, no_finish)
    }};
    ($c:ident, $together:literal, $nb:expr, $out:expr, $step:ident, $finish:ident) => {{
        let (nb, out): (usize, &TileOut) = ($nb, $out);
        let halves = if out.len > 8 { 2 } else { 1 };
        if $c <= $together {
            let mut acc = [[_mm256_setzero_ps(); $c]; 2];
            for i in 0..nb {
                $step!(acc[0], i, 0);
                if halves == 2 {
                    $step!(acc[1], i, 1);
                }
            }
            for h in 0..halves {
                $finish!(acc[h], h);
                // SAFETY: `out`'s rows are valid (the caller's contract).
                unsafe { store_half(&acc[h], out, h) };
            }
        } else {
            for h in 0..halves {
                let mut acc = [_mm256_setzero_ps(); $c];
                for i in 0..nb {
                    $step!(acc, i, h);
                }
                $finish!(acc, h);
                // SAFETY: `out`'s rows are valid (the caller's contract).
                unsafe { store_half(&acc, out, h) };
            }
        }
    }};
}

pub(super) use halves;

/// Weight vector k of half `h` of a Q5_0 tile block, k < 8: weights 4k..4k+4 of each
/// of the half's rows as bytes 0..=31 (the nibbles from `qs[k % 4]`, low for k < 4,
/// the fifth bit from bit k of `qh`, moved to bit 4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_vectors(b: &BlockQ5_0x16, h: usize) -> [__m256i; 8] {
    let (low4, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let qh = half(&b.qh, h);
    std::array::from_fn(|k| {
        let raw = half(&b.qs[k % 4], h);
        let nib = if k < 4 {
            raw
        } else {
            _mm256_srli_epi16::<4>(raw)
        };
        let high = _mm256_and_si256(shift(qh, 4 - k as i32), bit4);
        _mm256_or_si256(_mm256_and_si256(nib, low4), high)
    })
}

/// A Q5_0 tile block's weight vectors ([`q5_0_vectors`]) unpacked into memory: vector
/// k's bytes 0..32 are half 0's, 32..64 half 1's. Prefill unpacks a tile once for a
/// block of activation rows ([`expand_q5_0x16`]) and [`tile_q5_0x16_bytes`] then loads
/// each vector: the unpacking's six instructions a vector were, at four activation rows
/// a call, a third of the kernel's. Measured on Gemma 3 270M's pp512 (AMD Zen 3, 2
/// threads, `perf` samples in one run): the Q5_0 kernel took 2.69x the unchanged Q4_K
/// kernel's time before, 2.00x after.
pub type Q5_0Bytes = [[u8; 64]; 8];

/// Unpacks the blocks of `w` into `into` (as long).
///
/// # Safety
/// The CPU runs this function's features.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn expand_q5_0x16(w: &[BlockQ5_0x16], into: &mut [Q5_0Bytes]) {
    assert_eq!(w.len(), into.len(), "one unpacked block per block");
    for (b, x) in w.iter().zip(into.iter_mut()) {
        for h in 0..2 {
            for (k, v) in q5_0_vectors(b, h).into_iter().enumerate() {
                let dst = &mut x[k][32 * h..32 * h + 32];
                // SAFETY: `dst` is 32 bytes.
                unsafe { _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, v) };
            }
        }
    }
}

/// Sixteen packed Q5_0 rows × C activation rows: `dot(row r, a[c])` written to `out` for
/// each c, r; `sums` holds -128·Σx of each of `a`'s blocks (the Q8_0 kernel's).
///
/// # Safety
/// The CPU runs this function's features and step `D`'s instruction, and for every
/// c < C, `out.ptr + c·out.stride` is valid for reads and writes of `out.len` floats
/// that nothing else accesses during the call.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q5_0x16<const D: u8, const C: usize>(
    w: &[BlockQ5_0x16],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    // SAFETY: the caller's contract.
    unsafe { q5_0_tile::<D, C, false>(w, &[], a, sums, out) }
}

/// [`tile_q5_0x16`] with `w`'s weight vectors read from `bytes` (what
/// [`expand_q5_0x16`] made of `w`): the same instructions on the same integers, so the
/// same bits.
///
/// # Safety
/// As [`tile_q5_0x16`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q5_0x16_bytes<const D: u8, const C: usize>(
    w: &[BlockQ5_0x16],
    bytes: &[Q5_0Bytes],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    assert_eq!(bytes.len(), w.len(), "one unpacked block per block");
    // SAFETY: the caller's contract.
    unsafe { q5_0_tile::<D, C, true>(w, bytes, a, sums, out) }
}

/// The two above: the weight vectors unpacked here, or loaded from `bytes` (`BYTES`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_tile<const D: u8, const C: usize, const BYTES: bool>(
    w: &[BlockQ5_0x16],
    bytes: &[Q5_0Bytes],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    assert!(sums.iter().all(|s| s.len() == nb));
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let b = &w[i];
            let (a, sums) = (launder(a, h), launder(sums, h));
            if C == 1 && h == 0 && !BYTES {
                ahead(w, i, (0, 1));
            }
            let d = half_ps(&b.d, h);
            // Unpacked, the vectors are loaded again for each row.
            let q = if BYTES {
                [_mm256_setzero_si256(); 8]
            } else {
                q5_0_vectors(b, h)
            };
            each_row!(C, |c| {
                let q: [__m256i; 8] = if BYTES {
                    std::array::from_fn(|k| half(&bytes[i][k], h))
                } else {
                    q
                };
                let x = &a[c][i];
                let p = isum!(D, 4, _mm256_set1_epi32(sums[c][i] >> 3), &q, &x.qs);
                let sc = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
            });
        }};
    }
    // Eight weight vectors: both halves at once only at width one (at four, wider
    // calls spilled; half by half measured ~6% faster there).
    halves!(C, 1, nb, out, step);
}

/// Sixteen packed Q4_K rows × C activation rows (Q8_K), as [`tile_q5_0x16`] (and with
/// its contract).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4kx16<const D: u8, const C: usize>(
    w: &[BlockQ4Kx16],
    a: [&[BlockQ8K]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    let low4 = _mm256_set1_epi8(0x0F);
    let zero = _mm256_setzero_si256();
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let b = &w[i];
            let a = launder(a, h);
            let d = half_ps(&b.d, h);
            // Sub-block j = 2p + e: the low nibbles of vectors 8p.. (e = 0), the high
            // ones (e = 1); in sub-block order, a constant shift each.
            macro_rules! sub {
                ($p:ident, $e:literal) => {{
                    let j = 2 * $p + $e;
                    if C == 1 && h == 0 {
                        ahead(w, i, (j, 8));
                    }
                    let q: [__m256i; 8] = std::array::from_fn(|k| {
                        let raw = half(&b.qs[8 * $p + k], h);
                        let raw = if $e == 0 {
                            raw
                        } else {
                            _mm256_srli_epi16::<4>(raw)
                        };
                        _mm256_and_si256(raw, low4)
                    });
                    let s = _mm256_mul_ps(d, half_bytes_ps(&b.sc[j], h, false));
                    each_row!(C, |c| {
                        let x = &a[c][i];
                        let p = isum!(D, 8, zero, &q, &x.qs[32 * j..32 * j + 32]);
                        let sc = _mm256_mul_ps(s, _mm256_set1_ps(x.d));
                        $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
                    });
                }};
            }
            for p in 0..4 {
                sub!(p, 0);
                sub!(p, 1);
            }
            k_mins!(C, b, a, i, h, $acc);
        }};
    }
    // As Q5_0's.
    halves!(C, 1, nb, out, step);
}

/// Sixteen packed Q6_K rows × C activation rows (Q8_K), as [`tile_q5_0x16`] (and with
/// its contract).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q6kx16<const D: u8, const C: usize>(
    w: &[BlockQ6Kx16],
    a: [&[BlockQ8K]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    let (low4, bits45) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    macro_rules! step {
        ($acc:expr, $i:expr, $h:expr) => {{
            let (i, h) = ($i, $h);
            let b = &w[i];
            let a = launder(a, h);
            let d = half_ps(&b.d, h);
            // Sub-blocks 4t..4t+4 take their two high bits from bits 2t.. of `qh` (moved
            // to bits 4..6 by a shift of 4 - 2t) and their low four from the low nibbles
            // of `ql` for t < 2, the high ones after: a quarter per expansion, so every
            // shift is a constant.
            macro_rules! quarter {
                ($t:literal) => {
                    for ss in 0..4 {
                        let s = 4 * $t + ss;
                        // At width one, each sub-block's weights loaded in its own
                        // step: else LLVM loaded several sub-blocks ahead and spilled them
                        // (62 ymm spills in the one-row kernel with the MADD step; 2 so).
                        let b: &BlockQ6Kx16 = if C == 1 { std::hint::black_box(b) } else { b };
                        if C == 1 && h == 0 {
                            ahead(w, i, (s, 16));
                        }
                        let q: [__m256i; 4] = std::array::from_fn(|e| {
                            let g = 4 * s + e;
                            let raw = half(&b.ql[g % 32], h);
                            let nib = if $t < 2 {
                                raw
                            } else {
                                _mm256_srli_epi16::<4>(raw)
                            };
                            let hb = shift(half(&b.qh[g % 16], h), 4 - 2 * $t);
                            _mm256_or_si256(
                                _mm256_and_si256(nib, low4),
                                _mm256_and_si256(hb, bits45),
                            )
                        });
                        let sv =
                            _mm256_mul_ps(d, half_bytes_ps(bytemuck::cast_ref(&b.sc[s]), h, true));
                        each_row_unrolled!(C, |c| {
                            let x = &a[c][i];
                            let init = _mm256_set1_epi32(-32 * i32::from(x.bsums[s]));
                            let p = isum!(D, 2, init, &q, &x.qs[16 * s..16 * s + 16]);
                            let sc = _mm256_mul_ps(sv, _mm256_set1_ps(x.d));
                            $acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p), $acc[c]);
                        });
                    }
                };
            }
            quarter!(0);
            quarter!(1);
            quarter!(2);
            quarter!(3);
        }};
    }
    // Four weight vectors: both halves at once up to width four fit the registers
    // (measured ~6% faster than half by half at four).
    halves!(C, 4, nb, out, step);
}

/// Generates the one-activation-row form of a sixteen-row tile kernel over consecutive
/// tiles: `out[16t + r] = dot(row r of tile t, a)` (or `+=` with `add`), `nb` blocks per
/// tile, each tile by the kernel at width one (compiled for its features, so it
/// inlines: decode's matmuls are one row against thousands of tiles).
macro_rules! one_row {
    ($name:ident, $kernel:ident $(<$t:ty>)?, $tile:ty, $act:ty $(, $sums:ident)?) => {
        #[doc = concat!("[`", stringify!($kernel), "`] at width one over consecutive tiles.")]
        ///
        /// # Safety
        /// The CPU runs this function's features and step `D`'s instruction.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $name<const D: u8>(
            w: &[$tile],
            nb: usize,
            a: &[$act],
            $($sums: &[i32],)?
            out: &mut [f32],
            add: bool,
        ) {
            assert_eq!(w.len(), out.len() / 16 * nb, "a tile of blocks per 16 outputs");
            for (tile, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(16)) {
                let o = TileOut {
                    ptr: o.as_mut_ptr(),
                    stride: 0,
                    len: 16,
                    add,
                };
                // SAFETY: same CPU features as this function; `o` is one row of 16
                // floats, borrowed mutably here.
                unsafe { $kernel::<D, $($t,)? 1>(tile, [a], $([$sums],)? &o) };
            }
        }
    };
}

pub(super) use one_row;

one_row!(
    tiles_q5_0x16_one_row,
    tile_q5_0x16,
    BlockQ5_0x16,
    BlockQ8,
    sums
);
one_row!(tiles_q4kx16_one_row, tile_q4kx16, BlockQ4Kx16, BlockQ8K);
one_row!(tiles_q6kx16_one_row, tile_q6kx16, BlockQ6Kx16, BlockQ8K);
