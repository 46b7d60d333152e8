//! What the second pass over outlier blocks builds on: a matrix's block columns copied
//! bit for bit, and the 8-bit rounding's residual.

use super::matmul::{ActKind, QMatrix};
use super::quant::{BlockQ8, QK};
use super::runnable;
use super::tests::{random_weights, run, TYPES};
use crate::rng::SplitMix64;

#[test]
fn block_columns_are_the_same_weights_bit_for_bit() {
    let mut rng = SplitMix64(11);
    let (rows, cols) = (10, 256);
    for ty in TYPES {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let blocks = [6, 1, 7];
        let Some(c) = w.block_columns(&blocks) else {
            assert_ne!(
                w.act_kind(),
                ActKind::Q8,
                "{ty}: a 32-wide format has block columns"
            );
            continue;
        };
        assert_eq!(
            (c.ty, c.rows, c.cols),
            (ty, rows, blocks.len() * QK),
            "{ty}"
        );
        let (mut full, mut part) = (vec![0f32; cols], vec![0f32; c.cols]);
        for r in 0..rows {
            w.dequant_row(r, &mut full);
            c.dequant_row(r, &mut part);
            for (i, &b) in blocks.iter().enumerate() {
                let (want, got) = (&full[b * QK..][..QK], &part[i * QK..][..QK]);
                let same = want
                    .iter()
                    .zip(got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty}: row {r}, block {b}");
            }
        }
        assert!(
            w.block_columns(&[cols / QK]).is_none(),
            "{ty}: a block past the end"
        );
    }
}

#[test]
fn the_residual_is_what_the_8_bit_rounding_left() {
    let mut rng = SplitMix64(12);
    // One outlier, as in a model's hidden state, in the second block.
    let x: Vec<f32> = (0..3 * QK)
        .map(|i| if i == 37 { 60.0 } else { rng.signed_f32() })
        .collect();
    let mut r = vec![0f32; x.len()];
    let mut q = vec![<BlockQ8 as bytemuck::Zeroable>::zeroed(); 3];
    for isa in runnable() {
        super::q8_residual(isa, &x, &mut r);
        super::quantize_q8(isa, &x, &mut q);
        for (b, (xs, rs)) in x.chunks_exact(QK).zip(r.chunks_exact(QK)).enumerate() {
            for ((&v, &e), &qv) in xs.iter().zip(rs).zip(&q[b].qs) {
                assert_eq!(e.to_bits(), (v - q[b].d * f32::from(qv)).to_bits(), "{isa}");
                assert!(e.abs() <= 0.5001 * q[b].d, "{isa}: within half a step");
            }
        }
    }
    // The outlier's block rounds its other values coarsely: a fifth and more of their
    // magnitude is left over (a step of 60/127 against values under 1).
    let lost: f32 = r[QK..2 * QK].iter().map(|e| e.abs()).sum();
    let small: f32 = x[QK..2 * QK].iter().map(|v| v.abs()).sum::<f32>() - 60.0;
    assert!(lost > 0.2 * small, "residual {lost} of {small}");
}

#[test]
fn a_matrix_with_repeated_columns_is_the_sum_of_its_parts() {
    // What the outlier pass runs: [W | W's block b] · [x | r] = W·x + W_b·r, each side
    // rounded to 8 bits per block, on every path (within float summation error).
    let mut rng = SplitMix64(13);
    let (rows, cols, n) = (12, 256, 3);
    for ty in TYPES {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let own: Vec<usize> = (0..cols / QK).collect();
        let Some(wide) = w.block_columns(&[own, vec![2]].concat()) else {
            continue;
        };
        let part = w.block_columns(&[2]).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32()).collect();
        let r: Vec<f32> = (0..n * QK).map(|_| rng.signed_f32() * 0.01).collect();
        let xr: Vec<f32> = (0..n)
            .flat_map(|t| {
                x[t * cols..(t + 1) * cols]
                    .iter()
                    .chain(&r[t * QK..(t + 1) * QK])
            })
            .copied()
            .collect();
        for isa in runnable() {
            let (a, b, c) = (
                run(isa, &w, &x, n, 2),
                run(isa, &part, &r, n, 1),
                run(isa, &wide, &xr, n, 2),
            );
            for i in 0..n * rows {
                let want = a[i] + b[i];
                assert!(
                    (c[i] - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{ty} on {isa}: {} vs {want}",
                    c[i]
                );
            }
        }
    }
}
