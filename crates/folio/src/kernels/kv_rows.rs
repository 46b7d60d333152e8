//! The typed K/V rows the attention kernels read: [`KvDtype`], the element type of stored
//! K/V, and [`KvRows`] and [`KvRun`], borrowed runs of stored rows.
//!
//! # The 8-bit format ([`KvDtype::Q8`], `--kv-dtype q8_0`)
//!
//! Each head row (the `head_dim` values of one KV head of one token, K or V) is first
//! rotated by the normalized Hadamard matrix `H / √head_dim` ([`rotate_heads`]; head
//! sizes that are powers of two, else not rotated), then stored as `head_dim` signed
//! bytes and one f16 scale `d`, symmetric round-to-nearest as ggml's q8_0:
//! `d = amax / 127`, `q = round(x / d)` (ties away from zero), `Hx ≈ q · d`. The
//! rotation spreads a row's outlier channels over all of them, so `amax`, and with it
//! the rounding step, shrinks: on the default model at 2k tokens the mean |Δ logprob|
//! from the exact model is 29% above f16 K/V's without it, 7% with it
//! (docs/BENCHMARKS.md, "8-bit K/V"). `H` is orthogonal and its own inverse, so attention over
//! rotated K and V is attention with the query rotated the same way
//! (`(Hq)·(Hk) = q·k`) and the output rotated back (`Σ p·Hv = H Σ p·v`): the model
//! does both (`model/attention/run.rs`), the kernels only read the stored rows.
//! One scale per head row, not per 32 values as ggml's q8_0: 34 bytes per 32 values
//! hold only 1.88x the tokens of f16, one scale per row of 64 holds 1.94x (128: 1.97x),
//! and the kernels fold one scale per key into what they multiply by anyway.
//!
//! The bytes and the scales live in two arrays ([`KvRows::Q8`]): the bytes at the
//! element positions an f16 row would have (so strides and offsets count elements for
//! every dtype), the scales one per `head_dim` elements. Every kernel reads a value
//! as the f32 `q · d`, which is exact (8 bits times an f16's 11 fit in an f32's 24), so
//! the scalar twin, the SIMD kernels and the AVX-512 block kernel (which dequantizes a
//! tile once for a block of rows) give the same bits, as for f32 K/V.

use super::quant;

/// The element type of stored K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    /// Half precision, what llama.cpp stores by default.
    #[default]
    F16,
    F32,
    /// 8-bit values with one f16 scale per head row (see the module's doc).
    Q8,
}

impl KvDtype {
    /// Bytes that `width` elements (whole head rows of `head_dim`) take.
    #[inline]
    pub fn row_bytes(self, width: usize, head_dim: usize) -> usize {
        match self {
            KvDtype::F16 => 2 * width,
            KvDtype::F32 => 4 * width,
            KvDtype::Q8 => width + 2 * width.div_ceil(head_dim.max(1)),
        }
    }

    /// The name the flags and files use (`f16`, `f32`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Q8 => "q8_0",
        }
    }
}

impl KvDtype {
    /// Every element type, in the order of their codes.
    const ALL: [KvDtype; 3] = [KvDtype::F16, KvDtype::F32, KvDtype::Q8];

    /// The code K/V files (snapshots, the disk tier's pages) record the type by: 0
    /// f16, 1 f32, 2 q8_0.
    pub fn code(self) -> u32 {
        Self::ALL.iter().position(|&d| d == self).expect("listed") as u32
    }

    /// The type a file's code names, if any.
    pub fn of_code(code: u32) -> Option<Self> {
        Self::ALL.get(code as usize).copied()
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Stored K or V rows of one dtype.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
    /// 8-bit rows: `q[i]` is element i, `d[i / hd]` (f16 bits) its scale; `q` starts at
    /// a head row's first element.
    Q8 {
        q: &'a [i8],
        d: &'a [u16],
        hd: usize,
    },
}

impl<'a> KvRows<'a> {
    /// Elements held.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            KvRows::F16(x) => x.len(),
            KvRows::F32(x) => x.len(),
            KvRows::Q8 { q, .. } => q.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same rows from element `off` on (for 8-bit rows a whole number of head rows,
    /// or the end).
    #[inline]
    pub fn skip(self, off: usize) -> Self {
        match self {
            KvRows::F16(x) => KvRows::F16(&x[off..]),
            KvRows::F32(x) => KvRows::F32(&x[off..]),
            KvRows::Q8 { q, d, hd } => {
                assert!(
                    off.is_multiple_of(hd) || off == q.len(),
                    "8-bit K/V rows cut at element {off}, inside a head row of {hd}"
                );
                KvRows::Q8 {
                    q: &q[off..],
                    d: &d[(off / hd).min(d.len())..],
                    hd,
                }
            }
        }
    }

    /// The rows as raw 16-bit units (two per f32), for copying and comparing f16 and f32
    /// rows. 8-bit rows have none (their bytes and scales are two arrays): it panics on
    /// them; [`KvRows::get`] reads any rows.
    #[inline]
    pub fn raw(&self) -> &'a [u16] {
        match *self {
            KvRows::F16(x) => x,
            KvRows::F32(x) => bytemuck::cast_slice(x),
            KvRows::Q8 { .. } => panic!("8-bit K/V rows have no 16-bit units"),
        }
    }

    /// Element `i` as f32 (an 8-bit one as `q · d`, exact).
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            KvRows::F16(x) => quant::f16_to_f32(x[i]),
            KvRows::F32(x) => x[i],
            KvRows::Q8 { q, d, hd } => f32::from(q[i]) * quant::f16_to_f32(d[i / hd]),
        }
    }

    /// The start of the stored elements (the bytes of 8-bit rows), for prefetching.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            KvRows::F16(x) => x.as_ptr() as *const u8,
            KvRows::F32(x) => x.as_ptr() as *const u8,
            KvRows::Q8 { q, .. } => q.as_ptr() as *const u8,
        }
    }
}

/// A run of keys stored at a fixed row stride: `n` K rows from the start of `k`, the
/// matching V rows from the start of `v` (one page of a paged cache, or a whole
/// contiguous cache).
#[derive(Debug, Clone, Copy)]
pub struct KvRun<'a> {
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub n: usize,
}

/// Rotates every head row of `x` (`hd` values each) by `H / √hd`, `H` the Hadamard
/// matrix of Sylvester's construction (a fast Walsh–Hadamard transform, in a fixed
/// order: the same bits everywhere), when `hd` is a power of two (at least 2); else
/// leaves `x` as it is. Its own inverse, up to rounding.
pub fn rotate_heads(x: &mut [f32], hd: usize) {
    if hd < 2 || !hd.is_power_of_two() {
        return;
    }
    let norm = 1.0 / (hd as f32).sqrt();
    for head in x.chunks_exact_mut(hd) {
        let mut h = 1;
        while h < hd {
            for i in (0..hd).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (head[j], head[j + h]);
                    head[j] = a + b;
                    head[j + h] = a - b;
                }
            }
            h *= 2;
        }
        head.iter_mut().for_each(|v| *v *= norm);
    }
}

/// Quantizes `x` (whole head rows of `hd`, rotated already where the format rotates) to the 8-bit format: `q[i]` the values,
/// `d[r]` row r's scale (f16 bits). ggml's q8_0 rule: `d = amax / 127` (rounded to f16,
/// the largest finite f16 at most), `q = round(x / d)` with the stored `d` (clamped to
/// ±127); a row of zeros gets `d = 0`.
pub fn quantize_kv_q8(x: &[f32], hd: usize, q: &mut [i8], d: &mut [u16]) {
    assert!(hd > 0 && x.len().is_multiple_of(hd) && q.len() == x.len());
    assert_eq!(d.len(), x.len() / hd);
    for ((row, qr), dr) in x.chunks_exact(hd).zip(q.chunks_exact_mut(hd)).zip(d) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        *dr = quant::f32_to_f16((amax / 127.0).min(65504.0));
        let scale = quant::f16_to_f32(*dr);
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (o, &v) in qr.iter_mut().zip(row) {
            // `as` saturates (and maps NaN to 0): every byte stays a valid value.
            *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KvDtype;

    /// Files on disk record these codes: they never change.
    #[test]
    fn each_element_type_keeps_its_file_code() {
        for (d, code) in [(KvDtype::F16, 0), (KvDtype::F32, 1), (KvDtype::Q8, 2)] {
            assert_eq!(d.code(), code);
            assert_eq!(KvDtype::of_code(code), Some(d));
        }
        assert_eq!(KvDtype::of_code(3), None);
    }
}
