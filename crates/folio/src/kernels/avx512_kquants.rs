//! AVX-512 sixteen-row tile kernels for the formats of Q4_K_M and Q5_K_M files besides
//! Q8_0 (Q5_0, Q4_K, Q5_K and Q6_K) and for Q4_0 and IQ4_NL, over the layouts of
//! `tiles16` ([`BlockQ4_0x16`], [`BlockQ5_0x16`], [`BlockIq4Nlx16`], [`BlockQ4Kx16`],
//! [`BlockQ5Kx16`], [`BlockQ6Kx16`]), in the shape of `avx512`'s Q4_1 and Q8_0 kernels:
//! the weights of a tile column are unpacked into vectors of four unsigned bytes per row
//! once per call, and each activation row adds them up with `vpdpbusd`; the float work
//! is done once per (sub-)block for sixteen rows.
//!
//! Per row, in order (the scalar twins `scalar::dot_q4_0_rows16`, `dot_q5_0_rows16`,
//! `dot_iq4nl_rows16`, `dot_q4k_rows16`, `dot_q5k_rows16` and `dot_q6k_rows16` are the
//! same arithmetic; integer sums are exact):
//! - Q4_0, Q5_0 and IQ4_NL, per block: `acc = fma(d·d_x, Σ v·x, acc)` with v the signed
//!   value; the integer sum of the unsigned bytes starts from -offset·Σx (a sixteenth,
//!   an eighth or all of the Q8_0 kernel's block sums -128·Σx; IQ4_NL's levels are
//!   looked up by `vpshufb`, moved up by 128).
//! - Q4_K and Q5_K, per super-block: for each sub-block j of 32, `acc = fma((d·sc_j)·d_x, Σ q·x,
//!   acc)`; then `acc = fma(-(dmin·d_x), Σ_j m_j·Σx_j, acc)` (the mins' sum in integers,
//!   by `vpdpwssd` over pairs of sub-blocks).
//! - Q6_K, per super-block: for each sub-block s of 16, `acc = fma((d·sc_s)·d_x,
//!   Σ (q - 32)·x, acc)`; the integer sum starts from -32·Σx (the activations' sums of 16).
//!
//! Every activation row gets the same instructions whatever the tile width (batch
//! invariance), and the one-row forms over many tiles are the kernels at width one.
//!
//! Every function here is `unsafe` because it is compiled for CPU features the caller
//! must have checked, and writes through a [`TileOut`]'s pointer (the caller vouches for
//! its rows); slices are indexed with bounds checks.
#![allow(unsafe_code)]

use super::avx512::{block, dword, row_barrier, store, tile_blocks, TileOut};
use super::quant::*;
use super::tiles16::{
    BlockIq4Nlx16, BlockQ4Kx16, BlockQ4_0x16, BlockQ5Kx16, BlockQ5_0x16, BlockQ6Kx16,
};
use std::arch::x86_64::*;

/// How far ahead of the block being read the kernels ask for the weights, into L2:
/// decode streams them from memory, one row against every tile. Into L1, or a block or
/// two ahead, the misses queued up behind the prefetches: Llama-1B's Q6_K head (215 MB)
/// took 7.5 ms a row with every line of the block after next asked into L1, 6.8-7.2
/// ms with the row kernels, and 4.2-6.5 ms like this (the shared machine's bandwidth
/// varies; docs/BENCHMARKS.md).
const AHEAD: usize = 48 * 1024;

/// Asks L2 for part `part` of `parts` of the lines of the `size`-byte block at byte `at`
/// of `w`, [`AHEAD`] bytes further on (past the end is harmless: a hint).
#[inline(always)]
pub(super) fn prefetch_ahead(w: &[u8], at: usize, size: usize, (part, parts): (usize, usize)) {
    let lines = size.div_ceil(64).div_ceil(parts);
    let p = w.as_ptr().wrapping_add(at + AHEAD + 64 * lines * part) as *const i8;
    for l in 0..lines {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l)) };
    }
}

/// `(a & mask) | b`, bit by bit (`vpternlogd`).
#[inline]
#[target_feature(enable = "avx512f")]
fn and_or(a: __m512i, mask: __m512i, b: __m512i) -> __m512i {
    // Truth table of f(a, b, c) = (a & c) | b, indexed by a·4 + b·2 + c.
    _mm512_ternarylogic_epi32::<0xEC>(a, b, mask)
}

/// `v` shifted by `s` bits within each 16-bit lane: left for `s` > 0, right for `s` < 0
/// (-4..=4; constant where the kernels call it, so the match folds away).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn shift(v: __m512i, s: i32) -> __m512i {
    match s {
        4 => _mm512_slli_epi16::<4>(v),
        3 => _mm512_slli_epi16::<3>(v),
        2 => _mm512_slli_epi16::<2>(v),
        1 => _mm512_slli_epi16::<1>(v),
        0 => v,
        -1 => _mm512_srli_epi16::<1>(v),
        -2 => _mm512_srli_epi16::<2>(v),
        -3 => _mm512_srli_epi16::<3>(v),
        _ => _mm512_srli_epi16::<4>(v),
    }
}

/// Sixteen f16 values as floats.
///
/// # Safety
/// None beyond the features: `h` is 32 bytes.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn halves(h: &[u16; 16]) -> __m512 {
    // SAFETY: `h` is 16 halves, 32 bytes.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i)) }
}

/// A 64-byte vector of a tile.
#[inline]
#[target_feature(enable = "avx512f")]
fn load(v: &[u8; 64]) -> __m512i {
    // SAFETY: `v` is 64 bytes.
    unsafe { _mm512_loadu_si512(v.as_ptr() as *const __m512i) }
}

/// Sixteen bytes as sixteen 32-bit lanes, zero- or sign-extended, converted to floats.
#[inline]
#[target_feature(enable = "avx512f")]
fn bytes_ps(b: &[u8; 16], signed: bool) -> __m512 {
    // SAFETY: `b` is 16 bytes.
    let v = unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) };
    let i = if signed {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    };
    _mm512_cvtepi32_ps(i)
}

/// Runs `$body` for each activation row `$c` < `$n` (a constant), unrolled by hand:
/// as a loop, LLVM kept the widest case rolled with its accumulators on the stack.
macro_rules! each_row {
    ($n:ident, |$c:ident| $body:block) => {
        each_row!(@ $n, |$c| $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $n:ident, |$c:ident| $body:block, $($k:literal)*) => {$(
        if $k < $n {
            let $c: usize = $k;
            $body
        }
    )*};
}

/// The tiles of the 32-weight formats with one scale and signed values (Q4_0, Q5_0,
/// IQ4_NL): the scales, the nibbles (as Q4_0's), and how a weight vector is made from
/// them. The integer sum starts from -128·Σx >> `SUMS_SHIFT` (the weights' offset
/// times Σx: 8 for Q4_0, 16 for Q5_0, 128 for IQ4_NL's values moved up to bytes).
pub trait SignedTile: bytemuck::Pod + Sync {
    const SUMS_SHIFT: u32;
    /// Whether the nibbles index IQ4_NL's levels (each moved up by 128) rather than
    /// being the value.
    const LEVELS: bool;
    fn d(&self) -> &[u16; 16];
    fn qs(&self) -> &[[u8; 64]; 4];
    /// Q5_0's fifth bits (`BlockQ5_0x16::qh`).
    fn fifth(&self) -> Option<&[u8; 64]>;
}

macro_rules! signed_tile {
    ($tile:ty, $shift:literal, $levels:literal, |$t:ident| $fifth:expr) => {
        impl SignedTile for $tile {
            const SUMS_SHIFT: u32 = $shift;
            const LEVELS: bool = $levels;
            fn d(&self) -> &[u16; 16] {
                &self.d
            }
            fn qs(&self) -> &[[u8; 64]; 4] {
                &self.qs
            }
            fn fifth(&self) -> Option<&[u8; 64]> {
                let $t = self;
                $fifth
            }
        }
    };
}

signed_tile!(BlockQ4_0x16, 4, false, |_t| None);
signed_tile!(BlockQ5_0x16, 3, false, |t| Some(&t.qh));
signed_tile!(BlockIq4Nlx16, 0, true, |_t| None);

/// Sixteen packed Q4_0, Q5_0 or IQ4_NL rows × C activation rows: `dot(row r, a[c])`
/// written to `out` for each c, r; `sums` holds -128·Σx of each of `a`'s blocks (the
/// Q8_0 kernel's).
///
/// # Safety
/// The CPU runs this function's features, and for every c < C, `out.ptr + c·out.stride`
/// is valid for reads and writes of `out.len` floats that nothing else accesses during
/// the call.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q32x16<T: SignedTile, const C: usize>(
    w: &[T],
    a: [&[BlockQ8]; C],
    sums: [&[i32]; C],
    out: &TileOut,
) {
    let nb = tile_blocks(w, &a, out);
    assert!(sums.iter().all(|s| s.len() == nb));
    let (low4, bit4) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let levels = {
        let l: [u8; 16] = IQ4NL_VALUES.map(|v| (v as u8) ^ 0x80);
        // SAFETY: `l` is 16 bytes.
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(l.as_ptr() as *const __m128i) })
    };
    let mut acc = [_mm512_setzero_ps(); C];
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let size = std::mem::size_of::<T>();
    for i in 0..nb {
        prefetch_ahead(bytes, i * size, size, (0, 1));
        let b = &w[i];
        let d = halves(b.d());
        let fifth = b.fifth().map(|h| load(h));
        // Vector k: weights 4k..4k+4 of each row; nibbles from qs[k % 4] (low for k < 4),
        // then Q5_0's fifth bit k moved to bit 4, or IQ4_NL's level looked up. (A macro
        // per vector: a closure may stay out of line in a generic kernel.)
        macro_rules! vector {
            ($k:literal) => {{
                let raw = load(&b.qs()[$k % 4]);
                let nib = if $k < 4 {
                    raw
                } else {
                    _mm512_srli_epi16::<4>(raw)
                };
                match fifth {
                    Some(h) => and_or(nib, low4, _mm512_and_si512(shift(h, 4 - $k), bit4)),
                    None if T::LEVELS => _mm512_shuffle_epi8(levels, _mm512_and_si512(nib, low4)),
                    None => _mm512_and_si512(nib, low4),
                }
            }};
        }
        let q: [__m512i; 8] = [
            vector!(0),
            vector!(1),
            vector!(2),
            vector!(3),
            vector!(4),
            vector!(5),
            vector!(6),
            vector!(7),
        ];
        each_row!(C, |c| {
            let init = _mm512_set1_epi32(sums[c][i] >> T::SUMS_SHIFT);
            acc[c] = block!(acc[c], &q, (&a[c][i].qs, a[c][i].d), init, d);
        });
    }
    for (c, &v) in acc.iter().enumerate() {
        // SAFETY: row c of `out` is valid (this function's contract).
        unsafe { store(v, out, c) };
    }
}

/// The tiles of the K-quants with sub-block mins (Q4_K, Q5_K): the Q4_K fields, and
/// Q5_K's plane of fifth bits per sub-block.
pub trait MinTile: bytemuck::Pod + Sync {
    fn k4(&self) -> &BlockQ4Kx16;
    /// Sub-block j's fifth bits (`BlockQ5Kx16::qh`), if the format has them.
    fn fifth(&self, j: usize) -> Option<&[u8; 64]>;
}

impl MinTile for BlockQ4Kx16 {
    fn k4(&self) -> &BlockQ4Kx16 {
        self
    }
    fn fifth(&self, _: usize) -> Option<&[u8; 64]> {
        None
    }
}

impl MinTile for BlockQ5Kx16 {
    fn k4(&self) -> &BlockQ4Kx16 {
        &self.k4
    }
    fn fifth(&self, j: usize) -> Option<&[u8; 64]> {
        Some(&self.qh[j])
    }
}

/// Sixteen packed Q4_K or Q5_K rows × C activation rows (Q8_K), as [`tile_q32x16`]
/// (and with its contract).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_kx16<T: MinTile, const C: usize>(w: &[T], a: [&[BlockQ8K]; C], out: &TileOut) {
    let nb = tile_blocks(w, &a, out);
    let (low4, bit4) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); C];
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let size = std::mem::size_of::<T>();
    for i in 0..nb {
        let (t, b) = (&w[i], w[i].k4());
        let d = halves(&b.d);
        for j in 0..8 {
            prefetch_ahead(bytes, i * size, size, (j, 8));
            // Sub-block j: the low nibbles of vectors 8(j/2).. for even j, the high ones
            // for odd j; Q5_K's fifth bit k of `qh[j]` moved to bit 4.
            // (A macro per vector, not `array::from_fn`: LLVM kept that closure out of
            // line here, a call per vector.)
            let fifth = t.fifth(j).map(|h| load(h));
            macro_rules! vector {
                ($k:literal) => {{
                    let raw = load(&b.qs[8 * (j / 2) + $k]);
                    let raw = if j % 2 == 0 {
                        raw
                    } else {
                        _mm512_srli_epi16::<4>(raw)
                    };
                    match fifth {
                        Some(h) => and_or(raw, low4, _mm512_and_si512(shift(h, 4 - $k), bit4)),
                        None => _mm512_and_si512(raw, low4),
                    }
                }};
            }
            let q: [__m512i; 8] = [
                vector!(0),
                vector!(1),
                vector!(2),
                vector!(3),
                vector!(4),
                vector!(5),
                vector!(6),
                vector!(7),
            ];
            let s = _mm512_mul_ps(d, bytes_ps(&b.sc[j], false));
            each_row!(C, |c| {
                let x = &a[c][i];
                acc[c] = block!(acc[c], &q, (&x.qs[32 * j..32 * j + 32], x.d), zero, s);
            });
        }
        // The mins: per row, Σ_j m_j · (sum of sub-block j's activations), pairs of
        // sub-blocks per `vpdpwssd`.
        let dmin = halves(&b.dmin);
        let m: [__m512i; 4] = std::array::from_fn(|p| {
            // SAFETY: `m[p]` is 32 bytes.
            _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(b.m[p].as_ptr() as *const __m256i) })
        });
        each_row!(C, |c| {
            row_barrier();
            let x = &a[c][i];
            let sub = |j: usize| x.bsums[2 * j].wrapping_add(x.bsums[2 * j + 1]) as u16;
            let mut im = _mm512_setzero_si512();
            for (p, mp) in m.iter().enumerate() {
                let pair = u32::from(sub(2 * p)) | (u32::from(sub(2 * p + 1)) << 16);
                im = _mm512_dpwssd_epi32(im, *mp, _mm512_set1_epi32(pair as i32));
            }
            let mv = _mm512_mul_ps(dmin, _mm512_set1_ps(x.d));
            acc[c] = _mm512_fnmadd_ps(mv, _mm512_cvtepi32_ps(im), acc[c]);
        });
    }
    for (c, &v) in acc.iter().enumerate() {
        // SAFETY: row c of `out` is valid (this function's contract).
        unsafe { store(v, out, c) };
    }
}

/// Sixteen packed Q6_K rows × C activation rows (Q8_K), as [`tile_q32x16`] (and with
/// its contract).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile_q6kx16<const C: usize>(w: &[BlockQ6Kx16], a: [&[BlockQ8K]; C], out: &TileOut) {
    let nb = tile_blocks(w, &a, out);
    let (low4, bits45) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut acc = [_mm512_setzero_ps(); C];
    let bytes: &[u8] = bytemuck::cast_slice(w);
    const SIZE: usize = std::mem::size_of::<BlockQ6Kx16>();
    for i in 0..nb {
        let b = &w[i];
        let d = halves(&b.d);
        // Sub-blocks 4t..4t+4 take their two high bits from bits 2t.. of `qh` (moved to
        // bits 4..6 by a shift of 4 - 2t) and their low four from the low nibbles of
        // `ql` for t < 2, the high ones after: a quarter per expansion, so every shift
        // is a constant.
        macro_rules! quarter {
            ($t:literal) => {
                for ss in 0..4 {
                    let s = 4 * $t + ss;
                    prefetch_ahead(bytes, i * SIZE, SIZE, (s, 16));
                    let q: [__m512i; 4] = std::array::from_fn(|e| {
                        let g = 4 * s + e;
                        let raw = load(&b.ql[g % 32]);
                        let nib = if $t < 2 {
                            raw
                        } else {
                            _mm512_srli_epi16::<4>(raw)
                        };
                        let h = shift(load(&b.qh[g % 16]), 4 - 2 * $t);
                        and_or(nib, low4, _mm512_and_si512(h, bits45))
                    });
                    let sv = _mm512_mul_ps(d, bytes_ps(bytemuck::cast_ref(&b.sc[s]), true));
                    each_row!(C, |c| {
                        row_barrier();
                        let x = &a[c][i];
                        let xs = &x.qs[16 * s..16 * s + 16];
                        let mut p = _mm512_set1_epi32(-32 * i32::from(x.bsums[s]));
                        for (e, qe) in q.iter().enumerate() {
                            p = _mm512_dpbusd_epi32(p, *qe, dword(xs, e));
                        }
                        let sc = _mm512_mul_ps(sv, _mm512_set1_ps(x.d));
                        acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(p), acc[c]);
                    });
                }
            };
        }
        quarter!(0);
        quarter!(1);
        quarter!(2);
        quarter!(3);
    }
    for (c, &v) in acc.iter().enumerate() {
        // SAFETY: row c of `out` is valid (this function's contract).
        unsafe { store(v, out, c) };
    }
}

/// Generates the one-activation-row form of a sixteen-row tile kernel over consecutive
/// tiles: `out[16t + r] = dot(row r of tile t, a)` (or `+=` with `add`), `nb` blocks per
/// tile, each tile by the kernel at width one (compiled for its features, so it
/// inlines: decode's matmuls are one row against thousands of tiles).
macro_rules! one_row {
    ($name:ident, $kernel:expr, $tile:ty, $act:ty $(, $sums:ident)?) => {
        #[doc = concat!("`", stringify!($kernel), "` over consecutive tiles.")]
        ///
        /// # Safety
        /// The CPU runs this function's features.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub unsafe fn $name(
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
                unsafe { $kernel(tile, [a], $([$sums],)? &o) };
            }
        }
    };
}

one_row!(
    tiles_q4_0x16_one_row,
    tile_q32x16::<BlockQ4_0x16, 1>,
    BlockQ4_0x16,
    BlockQ8,
    sums
);
one_row!(
    tiles_q5_0x16_one_row,
    tile_q32x16::<BlockQ5_0x16, 1>,
    BlockQ5_0x16,
    BlockQ8,
    sums
);
one_row!(
    tiles_iq4nlx16_one_row,
    tile_q32x16::<BlockIq4Nlx16, 1>,
    BlockIq4Nlx16,
    BlockQ8,
    sums
);
one_row!(
    tiles_q4kx16_one_row,
    tile_kx16::<BlockQ4Kx16, 1>,
    BlockQ4Kx16,
    BlockQ8K
);
one_row!(
    tiles_q5kx16_one_row,
    tile_kx16::<BlockQ5Kx16, 1>,
    BlockQ5Kx16,
    BlockQ8K
);
one_row!(
    tiles_q6kx16_one_row,
    tile_q6kx16::<1>,
    BlockQ6Kx16,
    BlockQ8K
);
