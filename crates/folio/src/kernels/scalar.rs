//! The scalar reference twin of every kernel: quantization of activations,
//! dequantization of weights, and dot products. No `unsafe`, no SIMD; the SIMD paths are
//! tested against these on random data.
//!
//! Port notes: block formats and the Q8_K activation rounding follow ggml's reference
//! C (`ggml-quants.c`, `quantize_row_q8_K_ref`, `dequantize_row_q4_K`, …).

use super::quant::*;

/// Quantizes `x` (a multiple of 32 long) into 8-bit blocks. Rounds half to even, and
/// rounds the stored scale and sum to f16, exactly as ggml's x86 `quantize_row_q8_1`
/// does: matching its rounding is what keeps folio's log-probabilities within llama.cpp's
/// own noise on models with large activation outliers (where the f16 rounding of the sum
/// times the Q4_1 minimum is not negligible).
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        if xs.iter().any(|v| v.is_nan()) {
            *blk = NAN_Q8;
            continue;
        }
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in blk.qs.iter_mut().zip(xs) {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        blk.d = f16_to_f32(f32_to_f16(d));
        blk.s = f16_to_f32(f32_to_f16(d * sum as f32));
    }
}

/// The block a NaN input quantizes to: NaN scales, so that every dot product with it is
/// NaN (and the step fails as non-finite) on every path, whatever the weights.
pub const NAN_Q8: BlockQ8 = BlockQ8 {
    d: f32::NAN,
    s: f32::NAN,
    qs: [0; QK],
};

/// Quantizes `x` (a multiple of 256 long) into Q8_K blocks, as ggml's
/// `quantize_row_q8_K_ref`: the block's largest magnitude maps to ∓127 (`iscale =
/// -127 / max`; ggml left -128 for IQ2_XXS's AVX code), so a K-quant matmul reads the
/// inputs llama.cpp's does (with -128, Gemma 3 270M's logits parted from llama.cpp's
/// at the first token).
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let nan = xs.iter().any(|v| v.is_nan());
        if amax == 0.0 || nan {
            *blk = BlockQ8K {
                d: if nan { f32::NAN } else { 0.0 },
                qs: [0; QK_K],
                bsums: [0; 16],
            };
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in blk.qs.iter_mut().zip(xs) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (j, s) in blk.bsums.iter_mut().enumerate() {
            *s = blk.qs[j * 16..j * 16 + 16].iter().map(|&q| q as i16).sum();
        }
        blk.d = 1.0 / iscale;
    }
}

pub fn dequant_q4_0(w: &[BlockQ4_0], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for j in 0..16 {
            y[j] = d * ((b.qs[j] & 0xF) as i32 - 8) as f32;
            y[j + 16] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
        }
    }
}

pub fn dequant_q4_1(w: &[BlockQ4_1], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for j in 0..16 {
            y[j] = d * (b.qs[j] & 0xF) as f32 + m;
            y[j + 16] = d * (b.qs[j] >> 4) as f32 + m;
        }
    }
}

pub fn dequant_q8_0(w: &[BlockQ8_0], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    }
}

pub fn dequant_q4k(w: &[BlockQ4K], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for c in 0..4 {
            let q = &b.qs[c * 32..c * 32 + 32];
            let (sc1, m1) = q4k_scale_min(2 * c, &b.scales);
            let (sc2, m2) = q4k_scale_min(2 * c + 1, &b.scales);
            let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, mm2) = (d * sc2 as f32, dmin * m2 as f32);
            for l in 0..32 {
                y[c * 64 + l] = d1 * (q[l] & 0xF) as f32 - mm1;
                y[c * 64 + 32 + l] = d2 * (q[l] >> 4) as f32 - mm2;
            }
        }
    }
}

/// The 256 signed 6-bit values of a Q6_K block, each minus 32, in element order.
pub fn q6k_values(b: &BlockQ6K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for n in 0..2 {
        let (ql, qh) = (&b.ql[n * 64..], &b.qh[n * 32..]);
        for l in 0..32 {
            let y = &mut v[n * 128..];
            y[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

pub fn dequant_q6k(w: &[BlockQ6K], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let v = q6k_values(b);
        for (i, o) in y.iter_mut().enumerate() {
            *o = d * b.scales[i / 16] as f32 * v[i] as f32;
        }
    }
}

/// The 32 five-bit values (0..32) of a Q5_0/Q5_1 block, in element order.
pub fn q5_values(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let h = u32::from_le_bytes(*qh);
    std::array::from_fn(|j| {
        let lo = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
        lo | ((((h >> j) & 1) as u8) << 4)
    })
}

pub fn dequant_q5_0(w: &[BlockQ5_0], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (o, q) in y.iter_mut().zip(q5_values(&b.qh, &b.qs)) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

pub fn dequant_q5_1(w: &[BlockQ5_1], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (o, q) in y.iter_mut().zip(q5_values(&b.qh, &b.qs)) {
            *o = d * q as f32 + m;
        }
    }
}

/// The 32 table values of an IQ4_NL block, in element order.
pub fn iq4nl_values(b: &BlockIq4Nl) -> [i8; QK] {
    std::array::from_fn(|j| {
        let i = if j < 16 {
            b.qs[j] & 0xF
        } else {
            b.qs[j - 16] >> 4
        };
        IQ4NL_VALUES[i as usize]
    })
}

pub fn dequant_iq4nl(w: &[BlockIq4Nl], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (o, v) in y.iter_mut().zip(iq4nl_values(b)) {
            *o = d * v as f32;
        }
    }
}

/// The 256 two-bit values (0..4) of a Q2_K or Q3_K `qs`, in element order.
pub fn q2_values(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    std::array::from_fn(|i| {
        let (n, k, l) = (i / 128, (i / 32) % 4, i % 32);
        (qs[32 * n + l] >> (2 * k)) & 3
    })
}

pub fn dequant_q2k(w: &[BlockQ2K], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = q2_values(&b.qs);
        for (s, ys) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * (b.scales[s] & 0xF) as f32;
            let ml = dmin * (b.scales[s] >> 4) as f32;
            for (l, o) in ys.iter_mut().enumerate() {
                *o = dl * q[16 * s + l] as f32 - ml;
            }
        }
    }
}

/// The 256 signed three-bit values (-4..4) of a Q3_K block, in element order.
pub fn q3k_values(b: &BlockQ3K) -> [i8; QK_K] {
    let lo = q2_values(&b.qs);
    std::array::from_fn(|i| {
        let high = (b.hmask[i % 32] >> (i / 32)) & 1;
        lo[i] as i8 - if high == 0 { 4 } else { 0 }
    })
}

pub fn dequant_q3k(w: &[BlockQ3K], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let (q, sc) = (q3k_values(b), q3k_scales(&b.scales));
        for (s, ys) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * sc[s] as f32;
            for (l, o) in ys.iter_mut().enumerate() {
                *o = dl * q[16 * s + l] as f32;
            }
        }
    }
}

/// The 256 five-bit values (0..32) of a Q5_K block, in element order.
pub fn q5k_values(b: &BlockQ5K) -> [u8; QK_K] {
    std::array::from_fn(|i| {
        let (c, l) = (i / 64, i % 32);
        let q = b.qs[32 * c + l];
        let lo = if (i / 32) % 2 == 0 { q & 0xF } else { q >> 4 };
        lo | (((b.qh[l] >> (i / 32)) & 1) << 4)
    })
}

pub fn dequant_q5k(w: &[BlockQ5K], out: &mut [f32]) {
    for (b, y) in w.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        let q = q5k_values(b);
        for (j, ys) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = q4k_scale_min(j, &b.scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for (l, o) in ys.iter_mut().enumerate() {
                *o = dl * q[32 * j + l] as f32 - ml;
            }
        }
    }
}

pub fn dequant_f16(w: &[u16], out: &mut [f32]) {
    for (o, &h) in out.iter_mut().zip(w) {
        *o = f16_to_f32(h);
    }
}

pub fn dequant_bf16(w: &[u16], out: &mut [f32]) {
    for (o, &h) in out.iter_mut().zip(w) {
        *o = bf16_to_f32(h);
    }
}

/// Σ (q - 8) · a over one row, per block scaled by d_w · d_a.
pub fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += ((b.qs[j] & 0xF) as i32 - 8) * x.qs[j] as i32;
            isum += ((b.qs[j] >> 4) as i32 - 8) * x.qs[j + 16] as i32;
        }
        acc += f16_to_f32(b.d) * x.d * isum as f32;
    }
    acc
}

/// A Q4_1 block's integer dot product with an activation block (its quants, unscaled).
fn isum_q4_1(b: &BlockQ4_1, x: &BlockQ8) -> i32 {
    let mut isum = 0i32;
    for j in 0..16 {
        isum += (b.qs[j] & 0xF) as i32 * x.qs[j] as i32;
        isum += (b.qs[j] >> 4) as i32 * x.qs[j + 16] as i32;
    }
    isum
}

/// A Q8_0 block's integer dot product with an activation block.
fn isum_q8_0(b: &BlockQ8_0, x: &BlockQ8) -> i32 {
    b.qs.iter()
        .zip(&x.qs)
        .map(|(&p, &q)| p as i32 * q as i32)
        .sum()
}

pub fn dot_q4_1(w: &[BlockQ4_1], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        acc += f16_to_f32(b.d) * x.d * isum_q4_1(b, x) as f32 + f16_to_f32(b.m) * x.s;
    }
    acc
}

/// [`dot_q4_1`] in the AVX-512 sixteen-row kernel's arithmetic (`avx512::tile_q4_1x16`):
/// per block, the block's integer sum scaled and fused into one sum, the min term fused
/// into another; then their sum.
pub fn dot_q4_1_rows16(w: &[BlockQ4_1], a: &[BlockQ8]) -> f32 {
    let (mut acc, mut macc) = (0f32, 0f32);
    for (b, x) in w.iter().zip(a) {
        let isum = isum_q4_1(b, x);
        macc = f16_to_f32(b.m).mul_add(x.s, macc);
        acc = (f16_to_f32(b.d) * x.d).mul_add(isum as f32, acc);
    }
    acc + macc
}

/// [`dot_q8_0`] in the AVX-512 sixteen-row kernel's arithmetic (`avx512::tile_q8_0x16`):
/// per block, the integer sum scaled and fused in.
pub fn dot_q8_0_rows16(w: &[BlockQ8_0], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let isum = isum_q8_0(b, x);
        acc = (f16_to_f32(b.d) * x.d).mul_add(isum as f32, acc);
    }
    acc
}

/// [`dot_q5_0`] in the AVX-512 sixteen-row kernel's arithmetic
/// (`avx512_kquants::tile_q32x16`), as [`signed_rows16`] gives it.
pub fn dot_q5_0_rows16(w: &[BlockQ5_0], a: &[BlockQ8]) -> f32 {
    signed_rows16(
        w.iter().map(|b| {
            let q = q5_values(&b.qh, &b.qs);
            (b.d, std::array::from_fn(|j| q[j] as i32 - 16))
        }),
        a,
    )
}

/// [`dot_q4_0`] in the AVX-512 sixteen-row kernel's arithmetic, as [`signed_rows16`].
pub fn dot_q4_0_rows16(w: &[BlockQ4_0], a: &[BlockQ8]) -> f32 {
    signed_rows16(
        w.iter().map(|b| {
            (
                b.d,
                std::array::from_fn(|j| {
                    let nib = if j < 16 {
                        b.qs[j] & 0xF
                    } else {
                        b.qs[j - 16] >> 4
                    };
                    nib as i32 - 8
                }),
            )
        }),
        a,
    )
}

/// [`dot_iq4nl`] in the AVX-512 sixteen-row kernel's arithmetic, as [`signed_rows16`].
pub fn dot_iq4nl_rows16(w: &[BlockIq4Nl], a: &[BlockQ8]) -> f32 {
    signed_rows16(w.iter().map(|b| (b.d, iq4nl_values(b).map(i32::from))), a)
}

/// Blocks of 32 signed values with one scale each (`(d, values)`) against `a`, in the
/// sixteen-row kernels' order: per block, the integer sum scaled by d·d_x and fused in.
fn signed_rows16(w: impl Iterator<Item = (u16, [i32; QK])>, a: &[BlockQ8]) -> f32 {
    w.zip(a).fold(0f32, |acc, ((d, q), x)| {
        let isum: i32 = q.iter().zip(&x.qs).map(|(&q, &v)| q * v as i32).sum();
        (f16_to_f32(d) * x.d).mul_add(isum as f32, acc)
    })
}

/// [`dot_q4k`] in the AVX-512 sixteen-row kernel's arithmetic
/// (`avx512_kquants::tile_q4kx16`), as [`kquant_rows16`] gives it.
pub fn dot_q4k_rows16(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    w.iter().zip(a).fold(0f32, |acc, (b, x)| {
        let q: [u8; QK_K] = std::array::from_fn(|i| {
            let byte = b.qs[(i / 64) * 32 + i % 32];
            if (i / 32) % 2 == 0 {
                byte & 0xF
            } else {
                byte >> 4
            }
        });
        kquant_rows16(acc, (b.d, b.dmin, &b.scales), &q, x)
    })
}

/// [`dot_q5k`] in the AVX-512 sixteen-row kernel's arithmetic
/// (`avx512_kquants::tile_q5kx16`), as [`kquant_rows16`] gives it.
pub fn dot_q5k_rows16(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    w.iter().zip(a).fold(0f32, |acc, (b, x)| {
        kquant_rows16(acc, (b.d, b.dmin, &b.scales), &q5k_values(b), x)
    })
}

/// One Q4_K or Q5_K super-block (its scales, its values `q` in weight order) against
/// `x`, added to `acc` in the sixteen-row kernels' order: per sub-block of 32, its
/// integer sum scaled by (d·sc)·d_x and fused in; then the mins' integer sum, by
/// -(dmin·d_x).
fn kquant_rows16(
    mut acc: f32,
    (d, dmin, scales): (u16, u16, &[u8; 12]),
    q: &[u8; QK_K],
    x: &BlockQ8K,
) -> f32 {
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    let mut summ = 0i32;
    for j in 0..8 {
        let (sc, m) = q4k_scale_min(j, scales);
        let isum: i32 = (32 * j..32 * j + 32)
            .map(|i| q[i] as i32 * x.qs[i] as i32)
            .sum();
        acc = (d * sc as f32 * x.d).mul_add(isum as f32, acc);
        summ += m as i32 * (x.bsums[2 * j] as i32 + x.bsums[2 * j + 1] as i32);
    }
    (-(dmin * x.d)).mul_add(summ as f32, acc)
}

/// [`dot_q6k`] in the AVX-512 sixteen-row kernel's arithmetic
/// (`avx512_kquants::tile_q6kx16`): per sub-block of 16, its integer sum scaled by
/// (d·sc)·d_x and fused in.
pub fn dot_q6k_rows16(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let (d, v) = (f16_to_f32(b.d), q6k_values(b));
        for s in 0..16 {
            let isum: i32 = (0..16)
                .map(|l| v[s * 16 + l] as i32 * x.qs[s * 16 + l] as i32)
                .sum();
            acc = (d * b.scales[s] as f32 * x.d).mul_add(isum as f32, acc);
        }
    }
    acc
}

pub fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        acc += f16_to_f32(b.d) * x.d * isum_q8_0(b, x) as f32;
    }
    acc
}

pub fn dot_q4k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = q4k_scale_min(j, &b.scales);
            let q = &b.qs[(j / 2) * 32..(j / 2) * 32 + 32];
            let mut isum = 0i32;
            for (&qb, &xq) in q.iter().zip(&x.qs[j * 32..j * 32 + 32]) {
                let v = if j % 2 == 0 { qb & 0xF } else { qb >> 4 };
                isum += v as i32 * xq as i32;
            }
            sumi += sc as i32 * isum;
            summ += m as i32 * (x.bsums[2 * j] as i32 + x.bsums[2 * j + 1] as i32);
        }
        acc += x.d * (f16_to_f32(b.d) * sumi as f32 - f16_to_f32(b.dmin) * summ as f32);
    }
    acc
}

pub fn dot_q6k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let v = q6k_values(b);
        let mut sumi = 0i32;
        for s in 0..16 {
            let isum: i32 = (0..16)
                .map(|l| v[s * 16 + l] as i32 * x.qs[s * 16 + l] as i32)
                .sum();
            sumi += b.scales[s] as i32 * isum;
        }
        acc += x.d * f16_to_f32(b.d) * sumi as f32;
    }
    acc
}

/// Σ (q - 16) · a over one row, per block scaled by d_w · d_a.
pub fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let isum: i32 = q5_values(&b.qh, &b.qs)
            .iter()
            .zip(&x.qs)
            .map(|(&q, &v)| (q as i32 - 16) * v as i32)
            .sum();
        acc += f16_to_f32(b.d) * x.d * isum as f32;
    }
    acc
}

pub fn dot_q5_1(w: &[BlockQ5_1], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let isum: i32 = q5_values(&b.qh, &b.qs)
            .iter()
            .zip(&x.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        acc += f16_to_f32(b.d) * x.d * isum as f32 + f16_to_f32(b.m) * x.s;
    }
    acc
}

pub fn dot_iq4nl(w: &[BlockIq4Nl], a: &[BlockQ8]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let isum: i32 = iq4nl_values(b)
            .iter()
            .zip(&x.qs)
            .map(|(&q, &v)| q as i32 * v as i32)
            .sum();
        acc += f16_to_f32(b.d) * x.d * isum as f32;
    }
    acc
}

/// The K-quant dots below sum each block exactly in integers and scale it in one fixed
/// float expression; their SIMD twins do the same, so the two give the same bits.
pub fn dot_q2k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let q = q2_values(&b.qs);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for s in 0..16 {
            let isum: i32 = (16 * s..16 * s + 16)
                .map(|i| q[i] as i32 * x.qs[i] as i32)
                .sum();
            sumi += (b.scales[s] & 0xF) as i32 * isum;
            summ += (b.scales[s] >> 4) as i32 * x.bsums[s] as i32;
        }
        acc += x.d * (f16_to_f32(b.d) * sumi as f32 - f16_to_f32(b.dmin) * summ as f32);
    }
    acc
}

pub fn dot_q3k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let (q, sc) = (q3k_values(b), q3k_scales(&b.scales));
        let mut sumi = 0i32;
        for (s, &scale) in sc.iter().enumerate() {
            let isum: i32 = (16 * s..16 * s + 16)
                .map(|i| q[i] as i32 * x.qs[i] as i32)
                .sum();
            sumi += scale as i32 * isum;
        }
        acc += x.d * f16_to_f32(b.d) * sumi as f32;
    }
    acc
}

pub fn dot_q5k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, x) in w.iter().zip(a) {
        let q = q5k_values(b);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = q4k_scale_min(j, &b.scales);
            let isum: i32 = (32 * j..32 * j + 32)
                .map(|i| q[i] as i32 * x.qs[i] as i32)
                .sum();
            sumi += sc as i32 * isum;
            summ += m as i32 * (x.bsums[2 * j] as i32 + x.bsums[2 * j + 1] as i32);
        }
        acc += x.d * (f16_to_f32(b.d) * sumi as f32 - f16_to_f32(b.dmin) * summ as f32);
    }
    acc
}

pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}

/// dot(w, x) for f16 w, in the order of the 8-lane SIMD twin (and of ggml's
/// `ggml_vec_dot_f16`): four 8-lane fused accumulators over each 32 elements, reduced
/// (0+2)+(1+3), then the halves and pairs of the last vector; the tail sequentially.
pub fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    dot_lanes(w.len().min(x.len()), |k| f16_to_f32(w[k]), x)
}

/// The 8-lane, four-accumulator dot product of `dot_f16` over any element source.
fn dot_lanes(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
    let np = n - n % 32;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *lane = w(k).mul_add(x[k], *lane);
            }
        }
    }
    let v: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| v[l] + v[l + 4]);
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    for (k, xk) in x.iter().enumerate().take(n).skip(np) {
        sum += w(k) * xk;
    }
    sum
}

pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(&a, b)| bf16_to_f32(a) * b).sum()
}

/// Constants of the vectorised exp used by SwiGLU: exp(x) = 2^n · (1 + p(b)) with
/// n = round(x / ln 2), b = x − n·ln 2 (ln 2 split in two parts), p a degree-5
/// polynomial. This is the single-precision scheme of ARM's optimized-routines that
/// ggml's SIMD `expf` uses; folio computes it the same way so that SwiGLU rounds like
/// llama.cpp's (plain libm `expf` differs by an ulp now and then, and 8-bit activation
/// quantization turns such ulps into visible differences).
pub mod exp_consts {
    pub const SHIFT: f32 = 12_582_912.0; // 1.5 · 2^23
    pub const INV_LN2: u32 = 0x3fb8_aa3b;
    pub const LN2_HI: u32 = 0x3f31_7200;
    pub const LN2_LO: u32 = 0x35bf_be8e;
    /// p(b) = C0·b + (C1 + C2·b)·b² + (C3 + C4·b)·b⁴
    pub const C: [u32; 5] = [
        0x3f7f_fff6,
        0x3eff_fedb,
        0x3e2a_af33,
        0x3d2b_9f17,
        0x3c07_2010,
    ];
}

/// exp(x) by the scheme above, with every fused step fused.
pub fn exp_poly(x: f32) -> f32 {
    use exp_consts::*;
    let c = |i: usize| f32::from_bits(C[i]);
    let z = x.mul_add(f32::from_bits(INV_LN2), SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(
        f32::from_bits(LN2_LO),
        (-n).mul_add(f32::from_bits(LN2_HI), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = c(4)
        .mul_add(b, c(3))
        .mul_add(u, c(2).mul_add(b, c(1)))
        .mul_add(u, c(0) * b);
    // (NaN falls through to the normal path, as in the SIMD twin's ordered compare.)
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(k, k);
    }
    // Scale in two steps when 2^n alone would overflow or underflow.
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// Constants of the table-driven `expf` that glibc uses (the single-precision scheme of
/// ARM's optimized-routines: x·32/ln 2 = k + r, e^x = 2^(k/32) · q(r) in double, q a
/// cubic). llama.cpp's CPU flash attention calls libm's `expf` for every key; folio
/// computes the same function itself, so the scalar and SIMD paths round alike on every
/// platform and equal glibc's x86-64 FMA build bit for bit (checked in the tests).
pub mod expf_consts {
    /// 32 / ln 2.
    pub const INV_LN2_N: u64 = 0x4047_1547_652b_82fe;
    /// 1.5 · 2^52: adding it rounds to an integer held in the low mantissa bits.
    pub const SHIFT: u64 = 0x4338_0000_0000_0000;
    /// q(r) = 1 + C2·r + (C1 + C0·r)·r².
    pub const C: [u64; 3] = [
        0x3ebc_6af8_4b91_2394,
        0x3f2e_bfce_50fa_c4f3,
        0x3f96_2e42_ff0c_52d6,
    ];
    /// TAB[i] = bits(2^(i/32)) − (i << 47): adding k << 47 gives 2^(k/32).
    pub const TAB: [u64; 32] = [
        0x3ff0_0000_0000_0000,
        0x3fef_d9b0_d315_8574,
        0x3fef_b558_6cf9_890f,
        0x3fef_9301_d012_5b51,
        0x3fef_72b8_3c7d_517b,
        0x3fef_5487_3168_b9aa,
        0x3fef_387a_6e75_6238,
        0x3fef_1e9d_f51f_dee1,
        0x3fef_06fe_0a31_b715,
        0x3fee_f1a7_373a_a9cb,
        0x3fee_dea6_4c12_3422,
        0x3fee_ce08_6061_892d,
        0x3fee_bfda_d536_2a27,
        0x3fee_b42b_569d_4f82,
        0x3fee_ab07_dd48_5429,
        0x3fee_a47e_b03a_5585,
        0x3fee_a09e_667f_3bcd,
        0x3fee_9f75_e8ec_5f74,
        0x3fee_a114_73eb_0187,
        0x3fee_a589_994c_ce13,
        0x3fee_ace5_422a_a0db,
        0x3fee_b737_b0cd_c5e5,
        0x3fee_c491_82a3_f090,
        0x3fee_d503_b23e_255d,
        0x3fee_e89f_995a_d3ad,
        0x3fee_ff76_f2fb_5e47,
        0x3fef_199b_dd85_529c,
        0x3fef_3720_dcef_9069,
        0x3fef_5818_dcfb_a487,
        0x3fef_7c97_337b_9b5f,
        0x3fef_a4af_a2a4_90da,
        0x3fef_d076_5b6e_4540,
    ];
    /// Above this e^x overflows to +∞.
    pub const OVERFLOW: u32 = 0x42b1_7217;
    /// Below this (−∞ included) e^x rounds to 0.
    pub const UNDERFLOW: u32 = 0xc2cf_f1b4;
}

/// e^x computed as glibc's `expf` does (see [`expf_consts`]), every step fused where
/// its FMA build fuses it.
pub fn expf_table(x: f32) -> f32 {
    use expf_consts::*;
    let f = f64::from_bits;
    if x.is_nan() {
        return x + x;
    }
    if x > f32::from_bits(OVERFLOW) {
        return f32::INFINITY;
    }
    if x < f32::from_bits(UNDERFLOW) {
        return 0.0;
    }
    let xd = f64::from(x);
    let kr = f(INV_LN2_N).mul_add(xd, f(SHIFT));
    let ki = kr.to_bits();
    let kd = kr - f(SHIFT);
    let r = f(INV_LN2_N).mul_add(xd, -kd);
    let z = r.mul_add(f(C[0]), f(C[1]));
    let s = f(TAB[(ki % 32) as usize].wrapping_add(ki << 47));
    let y = z.mul_add(r * r, r.mul_add(f(C[2]), 1.0));
    (y * s) as f32
}

/// Rotates each `head_dim`-wide head of `row` by `table`'s (cos, sin) pairs: pair i is
/// elements (2i, 2i + 1) when `adjacent` (llama), else (i, i + `half`) (NeoX). Fused as
/// ggml's C is compiled (FP contraction on). Inlined into the SIMD twin, whose target
/// features make `mul_add` one instruction instead of a call.
#[inline(always)]
pub fn rope_rotate(
    adjacent: bool,
    half: usize,
    head_dim: usize,
    table: &[(f32, f32)],
    row: &mut [f32],
) {
    for head in row.chunks_exact_mut(head_dim) {
        for (i, &(cos, sin)) in table.iter().enumerate() {
            let (a, b) = if adjacent {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0.mul_add(cos, -(x1 * sin));
            head[b] = x0.mul_add(sin, x1 * cos);
        }
    }
}

/// `out[i]` = `x[i]` as f16 bits (round to nearest even).
pub fn to_f16(x: &[f32], out: &mut [u16]) {
    for (d, &v) in out.iter_mut().zip(x) {
        *d = f32_to_f16(v);
    }
}

/// Appends `x` rounded to f16 precision to `out`.
pub fn round_f16_into(x: &[f32], out: &mut Vec<f32>) {
    out.extend(x.iter().map(|&v| f16_to_f32(f32_to_f16(v))));
}

/// gate = silu(gate) · up, silu(x) = x / (1 + exp(−x)).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_poly(0.0 - *g)) * u;
    }
}

/// Continues one query's online softmax over runs of keys: in each run, key `p`'s K and
/// V rows (head size `q.len()`) start at element `p * stride` of its `k` and `v`.
/// `acc` is the value accumulator; `m` the running maximum score and `sum` the running
/// sum of exp(score − m). With f16 K/V, `q` must already be rounded to f16, and with
/// `round` the accumulator is kept at f16 precision after every step (stored as f32),
/// as llama.cpp's CPU flash attention keeps it; otherwise nothing is rounded. Feeding
/// the keys in any split into runs or calls gives the same bits.
pub fn attend_runs(
    q: &[f32],
    runs: &[super::KvRun],
    stride: usize,
    scale: f32,
    state: (&mut f32, &mut f32),
    acc: &mut [f32],
    round: bool,
) {
    attend_runs_capped(q, runs, stride, scale, 0.0, state, acc, round)
}

/// [`attend_runs`] with soft-capped scores: with `cap` ≠ 0 each score
/// `s = q·k · scale` becomes `cap · tanh(s)` (the caller has divided `scale` by `cap`),
/// as ggml's flash attention caps them.
#[allow(clippy::too_many_arguments)]
pub fn attend_runs_capped(
    q: &[f32],
    runs: &[super::KvRun],
    stride: usize,
    scale: f32,
    cap: f32,
    state: (&mut f32, &mut f32),
    acc: &mut [f32],
    round: bool,
) {
    let (m, sum) = state;
    let hd = q.len();
    for run in runs {
        let f16 = round && matches!(run.k, super::KvRows::F16(_));
        let round = |x: f32| if f16 { f16_to_f32(f32_to_f16(x)) } else { x };
        for p in 0..run.n {
            let mut s = dot_lanes(hd, |i| run.k.get(p * stride + i), q) * scale;
            if cap != 0.0 {
                s = cap * s.tanh();
            }
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > *m {
                ms = expf_table(*m - s);
                *m = s;
                acc.iter_mut().for_each(|a| *a = round(*a * ms));
            } else {
                vs = expf_table(s - *m);
            }
            for (i, a) in acc.iter_mut().enumerate() {
                *a = round(run.v.get(p * stride + i).mul_add(vs, *a));
            }
            *sum = sum.mul_add(ms, vs);
        }
    }
}
