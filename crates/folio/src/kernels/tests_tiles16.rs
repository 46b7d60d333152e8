//! The AVX-512 sixteen-row tile kernels of Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K and Q6_K (`avx512_kquants`, over
//! the `tiles16` layouts) against their scalar twins, and the layouts' packing.

use super::matmul::{Layout, QMatrix};
use super::quant::*;
use super::scalar;
use super::tests::{extreme_weights, run, simd_paths};
use super::Isa;
use crate::gguf::GgmlType;
use crate::rng::SplitMix64;

const TYPES: [GgmlType; 4] = [
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// dot(row r, activation row t) for every t, r by the scalar twin of `ty`'s sixteen-row
/// kernel, over GGUF's rows.
fn twins(
    ty: GgmlType,
    bytes: &[u8],
    (rows, cols): (usize, usize),
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let rb = bytes.len() / rows;
    let mut out = Vec::with_capacity(n * rows);
    for t in 0..n {
        let x = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let row = &bytes[r * rb..(r + 1) * rb];
            out.push(match ty {
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL => {
                    let mut a = vec![<BlockQ8 as bytemuck::Zeroable>::zeroed(); cols / QK];
                    scalar::quantize_q8(x, &mut a);
                    match ty {
                        GgmlType::Q4_0 => scalar::dot_q4_0_rows16(bytemuck::cast_slice(row), &a),
                        GgmlType::Q5_0 => scalar::dot_q5_0_rows16(bytemuck::cast_slice(row), &a),
                        _ => scalar::dot_iq4nl_rows16(bytemuck::cast_slice(row), &a),
                    }
                }
                _ => {
                    let mut a = vec![<BlockQ8K as bytemuck::Zeroable>::zeroed(); cols / QK_K];
                    scalar::quantize_q8k(x, &mut a);
                    match ty {
                        GgmlType::Q4_K => scalar::dot_q4k_rows16(bytemuck::cast_slice(row), &a),
                        GgmlType::Q5_K => scalar::dot_q5k_rows16(bytemuck::cast_slice(row), &a),
                        _ => scalar::dot_q6k_rows16(bytemuck::cast_slice(row), &a),
                    }
                }
            });
        }
    }
    out
}

/// The sixteen-row Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K and Q6_K kernels compute exactly their scalar twins, bit
/// for bit: on every tile width (37 activation rows: 16, 16 and 5; one row: the decode
/// form over many tiles), rows past the last whole tile, either thread count, the
/// extreme quants, and activations whose largest value quantizes to -128. Every other
/// path given that layout gives the same bits (through the twins).
#[test]
fn sixteen_row_kquant_kernels_are_their_scalar_twins_exactly() {
    let mut rng = SplitMix64(53);
    let (rows, cols) = (37, 768);
    for ty in TYPES {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &bytes)
            .unwrap()
            .for_isa(Isa::Avx512);
        assert_eq!(w.layout(), Layout::Tiles16);
        for n in [1, 37] {
            let mut x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
            x[cols - 7] = 9.0;
            let want = twins(ty, &bytes, (rows, cols), &x, n);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let mut paths = vec![Isa::Scalar];
            paths.extend(simd_paths());
            for isa in paths {
                for threads in [1, 2] {
                    let got = run(isa, &w, &x, n, threads);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{ty} on {isa}, {n} rows, {threads} threads"
                    );
                }
            }
        }
    }
}

/// The twins are the GGUF dot products up to float rounding: the layouts compute the
/// same function as every other path (a wrong bit placement would be far off).
#[test]
fn sixteen_row_kquant_twins_agree_with_the_row_kernels() {
    let mut rng = SplitMix64(59);
    let (rows, cols, n) = (21, 512, 3);
    for ty in TYPES {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
        let rows_layout = QMatrix::new(ty, rows, cols, &bytes).unwrap();
        let a = run(Isa::Scalar, &rows_layout, &x, n, 1);
        let b = twins(ty, &bytes, (rows, cols), &x, n);
        super::tests::close_to_scalar(&rows_layout, &x, n, &a, &b, &format!("{ty}"));
    }
}

/// Packing into sixteen-row tiles keeps every bit: the GGUF rows read back, the rows
/// dequantized, another path's layout made from the tiles, and block columns.
#[test]
fn sixteen_row_kquant_tiles_keep_every_bit() {
    let mut rng = SplitMix64(61);
    let (rows, cols) = (35, 512);
    for ty in TYPES {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let flat = QMatrix::new(ty, rows, cols, &bytes).unwrap();
        let tiled = QMatrix::new_for(Isa::Avx512, ty, rows, cols, &bytes).unwrap();
        assert_eq!(flat.layout(), Layout::Rows);
        assert_eq!(tiled.layout(), Layout::Tiles16);
        assert_eq!(tiled.gguf_bytes(), bytes, "{ty}");
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            flat.dequant_row(r, &mut a);
            tiled.dequant_row(r, &mut b);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{ty} row {r}");
        }
        let back = QMatrix::new_for(Isa::Avx512, ty, rows, cols, &bytes)
            .unwrap()
            .for_isa(Isa::Avx2);
        assert_eq!(back.layout(), Layout::Rows);
        assert_eq!(back.gguf_bytes(), bytes, "{ty}");
        if matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL) {
            let cut = tiled.block_columns(&[3, 0, 3]).unwrap();
            assert_eq!(cut.layout(), Layout::Tiles16);
            assert_eq!(
                cut.gguf_bytes(),
                flat.block_columns(&[3, 0, 3]).unwrap().gguf_bytes()
            );
        }
    }
}
