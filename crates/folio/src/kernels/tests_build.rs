//! The inputs `Activations::build` makes (rows built and quantized in one parallel
//! pass) and `matmul_add`'s residual sums: the same bits as the steps they replace.

use super::matmul::{matmul, matmul_add, Activations, QMatrix};
use super::tests::{random_weights, run};
use super::{runnable, ThreadPool};
use crate::gguf::GgmlType;
use crate::rng::SplitMix64;

/// The formats of the 8-bit input (Q8, Q8 with block sums on the AVX-512 path), the
/// 8-bit input of the k-quants (made later, from the built values) and f32.
const FORMATS: [GgmlType; 4] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::F16,
];

#[test]
fn built_inputs_give_the_matmul_the_bits_of_set_inputs() {
    let mut rng = SplitMix64(21);
    let (rows, cols) = (40, 256);
    for ty in FORMATS {
        let bytes = random_weights(&mut rng, ty, rows, cols);
        // 1-3 rows: built on one thread; 4 and 13: split over the threads.
        for n in [1, 3, 4, 13] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32()).collect();
            for (isa, threads) in runnable()
                .into_iter()
                .flat_map(|i| [(i, 1), (i, 2), (i, 5)])
            {
                let w = QMatrix::new(ty, rows, cols, &bytes).unwrap().for_isa(isa);
                let pool = ThreadPool::new(threads).unwrap();
                let mut act = Activations::default();
                // Each row is x's row of its index: one built at another index shows.
                act.build(&pool, isa, (n, cols), &[&w], &|r, out| {
                    out.copy_from_slice(&x[r * cols..(r + 1) * cols])
                });
                assert_eq!(act.values(), &x[..], "{ty} on {isa}: the values as built");
                let mut built = vec![0f32; n * rows];
                matmul(&pool, isa, &mut act, &mut [(&w, &mut built)]);
                let set = run(isa, &w, &x, n, threads);
                assert_eq!(built, set, "{ty} on {isa}, {n} rows, {threads} threads");
            }
        }
    }
}

#[test]
fn matmul_add_is_the_matmul_then_one_add_per_output() {
    let mut rng = SplitMix64(22);
    // 70 rows: whole tiles and a padded last one.
    let (rows, cols) = (70, 256);
    for ty in FORMATS {
        let bytes = random_weights(&mut rng, ty, rows, cols);
        for n in [1, 5] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32()).collect();
            let y: Vec<f32> = (0..n * rows).map(|_| 3.0 * rng.signed_f32()).collect();
            for (isa, threads) in runnable().into_iter().flat_map(|i| [(i, 1), (i, 2)]) {
                let w = QMatrix::new(ty, rows, cols, &bytes).unwrap().for_isa(isa);
                let pool = ThreadPool::new(threads).unwrap();
                let mut act = Activations::default();
                act.set(&x, n, cols);
                let mut sum = y.clone();
                matmul_add(&pool, isa, &mut act, &w, &mut sum);
                let product = run(isa, &w, &x, n, threads);
                let want: Vec<f32> = y.iter().zip(&product).map(|(a, b)| a + b).collect();
                assert_eq!(sum, want, "{ty} on {isa}, {n} rows, {threads} threads");
            }
        }
    }
}
