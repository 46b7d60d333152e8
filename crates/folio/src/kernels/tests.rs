//! SIMD kernels against their scalar twins on random data, and the batch-invariance of
//! the matmul.

#[cfg(target_arch = "x86_64")]
use super::avxvnni::MADD;
use super::matmul::{matmul, Activations, QMatrix};
use super::quant::*;
use super::{detect, runnable, scalar, Isa, KvDtype, ThreadPool};
use crate::gguf::GgmlType;
use crate::rng::SplitMix64;

/// Random but well-formed weight bytes: random quants, finite modest scales.
pub(crate) fn random_weights(
    rng: &mut SplitMix64,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> Vec<u8> {
    let n = rows * cols;
    let h = |rng: &mut SplitMix64, s: f32| f32_to_f16(rng.signed_f32() * s).to_le_bytes();
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| rng.signed_f32().to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n).flat_map(|_| h(rng, 1.0)).collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| {
                half::bf16::from_f32(rng.signed_f32())
                    .to_bits()
                    .to_le_bytes()
            })
            .collect(),
        _ => {
            let (be, bb) = ty.block_layout();
            let mut out = Vec::new();
            for _ in 0..n / be as usize {
                let mut b: Vec<u8> = (0..bb).map(|_| rng.next_u64() as u8).collect();
                let scales: &[usize] = match ty {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[0],
                    GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                    GgmlType::Q6_K => &[208],
                    GgmlType::Q3_K => &[108],
                    GgmlType::Q2_K => &[80, 82],
                    _ => unreachable!(),
                };
                for &o in scales {
                    b[o..o + 2].copy_from_slice(&h(rng, 0.05));
                }
                out.extend(b);
            }
            out
        }
    }
}

pub(crate) const TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

pub(crate) fn run(isa: Isa, w: &QMatrix, x: &[f32], n: usize, threads: usize) -> Vec<f32> {
    let pool = ThreadPool::new(threads).unwrap();
    let mut act = Activations::default();
    act.set(x, n, w.cols);
    let mut out = vec![0f32; n * w.rows];
    matmul(&pool, isa, &mut act, &mut [(w, &mut out)]);
    out
}

/// Whether this CPU runs `isa`'s kernels (as `detect` chose them); if not, says so on
/// stderr, so a test that returns early is skipped, not silent.
fn cpu_runs(isa: Isa) -> bool {
    let best = detect();
    let runs = match isa {
        Isa::Avx512 => best.avx512(),
        Isa::Avx2 => best.avx2(),
        other => runnable().contains(&other),
    };
    if !runs {
        eprintln!("skipped: this CPU does not run the {isa} kernels");
    }
    runs
}

/// The SIMD paths this CPU runs; a path it lacks is named on stderr (skipped, not silent).
pub(crate) fn simd_paths() -> Vec<Isa> {
    for missing in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
        .into_iter()
        .filter(|i| !runnable().contains(i))
    {
        eprintln!("skipped: this CPU does not run the {missing} kernels");
    }
    runnable()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect()
}

#[test]
fn simd_matches_scalar_on_random_data() {
    let mut rng = SplitMix64(7);
    let (rows, cols, n) = (13, 512, 11);
    for ty in TYPES {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
        let a = run(Isa::Scalar, &w, &x, n, 1);
        for isa in simd_paths() {
            // In the layout the path's kernels read (four-row tiles, or sixteen on
            // AVX-512).
            let w = QMatrix::new(ty, rows, cols, &w.gguf_bytes())
                .unwrap()
                .for_isa(isa);
            let b = run(isa, &w, &x, n, 2);
            close_to_scalar(&w, &x, n, &a, &b, &format!("{ty} on {isa}"));
        }
    }
}

/// Each of `b` within float-summation error of `a`, relative to the terms' magnitude.
pub(crate) fn close_to_scalar(w: &QMatrix, x: &[f32], n: usize, a: &[f32], b: &[f32], what: &str) {
    let (rows, cols) = (w.rows, w.cols);
    // Magnitude of the terms, for a tolerance relative to what was summed.
    let mut deq = vec![0f32; cols];
    for r in 0..rows {
        w.dequant_row(r, &mut deq);
        for t in 0..n {
            let mag: f32 = deq
                .iter()
                .zip(&x[t * cols..])
                .map(|(p, q)| (p * q).abs())
                .sum();
            let (s, v) = (a[t * rows + r], b[t * rows + r]);
            assert!(
                (s - v).abs() <= 1e-5 * mag + 1e-6,
                "{what}: row {r} token {t}: scalar {s} simd {v} (magnitude {mag})"
            );
        }
    }
}

/// The AVX-512 path keeps the AVX2 path's bits for every format without an AVX-512
/// kernel of its own, and for Q4_1 and Q8_0 in four-row tiles (which it runs through
/// the AVX2 kernels, with EVEX `vpdpbusd`).
#[test]
fn avx512_matmul_gives_the_avx2_bits_outside_its_own_layout() {
    if !cpu_runs(Isa::Avx512) {
        return;
    }
    let mut rng = SplitMix64(23);
    // Rows past a multiple of four exercise the tails; 37 tokens every tile width.
    let (rows, cols, n) = (30, 768, 37);
    for ty in TYPES {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
        let a = run(Isa::Avx2, &w, &x, n, 2);
        let b = run(Isa::Avx512, &w, &x, n, 2);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{ty}");
    }
}

/// Random rows with the extreme quants of the tile formats in some blocks (Q8_0's -128,
/// the 4-, 5- and 6-bit formats' all-zero and all-ones quants, the K-quants' largest
/// sub-block scales and mins); other types as [`random_weights`] makes them.
pub(crate) fn extreme_weights(
    rng: &mut SplitMix64,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> Vec<u8> {
    let mut bytes = random_weights(rng, ty, rows, cols);
    match ty {
        GgmlType::Q8_0 => {
            let blocks: &mut [BlockQ8_0] = bytemuck::cast_slice_mut(&mut bytes);
            blocks[0].qs = [i8::MIN; QK];
            blocks[5].qs[7] = i8::MIN;
        }
        GgmlType::Q4_1 => {
            let blocks: &mut [BlockQ4_1] = bytemuck::cast_slice_mut(&mut bytes);
            blocks[0].qs = [0xFF; QK / 2];
            blocks[3].qs = [0; QK / 2];
        }
        GgmlType::Q4_0 | GgmlType::IQ4_NL => {
            // The same bytes: a scale and sixteen bytes of nibbles.
            let blocks: &mut [BlockQ4_0] = bytemuck::cast_slice_mut(&mut bytes);
            blocks[0].qs = [0xFF; QK / 2];
            blocks[3].qs = [0; QK / 2];
        }
        GgmlType::Q5_0 => {
            let blocks: &mut [BlockQ5_0] = bytemuck::cast_slice_mut(&mut bytes);
            (blocks[0].qs, blocks[0].qh) = ([0xFF; QK / 2], [0xFF; 4]);
            (blocks[3].qs, blocks[3].qh) = ([0; QK / 2], [0; 4]);
        }
        GgmlType::Q4_K => {
            let blocks: &mut [BlockQ4K] = bytemuck::cast_slice_mut(&mut bytes);
            (blocks[0].qs, blocks[0].scales) = ([0xFF; QK_K / 2], [0xFF; 12]);
            blocks[1].qs = [0; QK_K / 2];
        }
        GgmlType::Q5_K => {
            let blocks: &mut [BlockQ5K] = bytemuck::cast_slice_mut(&mut bytes);
            (blocks[0].qs, blocks[0].qh) = ([0xFF; QK_K / 2], [0xFF; QK_K / 8]);
            blocks[0].scales = [0xFF; 12];
            (blocks[1].qs, blocks[1].qh) = ([0; QK_K / 2], [0; QK_K / 8]);
        }
        GgmlType::Q6_K => {
            let blocks: &mut [BlockQ6K] = bytemuck::cast_slice_mut(&mut bytes);
            (blocks[0].ql, blocks[0].qh) = ([0xFF; QK_K / 2], [0xFF; QK_K / 4]);
            blocks[0].scales = [i8::MIN; 16];
            (blocks[1].ql, blocks[1].qh) = ([0; QK_K / 2], [0; QK_K / 4]);
            blocks[1].scales = [i8::MAX; 16];
        }
        _ => {}
    }
    bytes
}

/// The AVX-512 sixteen-row kernels compute exactly their scalar twins
/// (`scalar::dot_q4_1_rows16`, `dot_q8_0_rows16`): bit for bit, on every tile width,
/// the one-row form, rows past the last whole tile, either thread count, and the
/// extreme quants. Every other path given that layout gives the same bits (through the
/// twins).
#[test]
fn avx512_sixteen_row_kernels_are_their_scalar_twins_exactly() {
    let mut rng = SplitMix64(41);
    let (rows, cols) = (37, 768);
    let nb = cols / QK;
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &bytes)
            .unwrap()
            .for_isa(Isa::Avx512);
        assert_eq!(w.layout(), super::matmul::Layout::Tiles16);
        for n in [1, 37] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
            let mut a = vec![<BlockQ8 as bytemuck::Zeroable>::zeroed(); n * nb];
            scalar::quantize_q8(&x, &mut a);
            let mut want = Vec::with_capacity(n * rows);
            for t in 0..n {
                let x = &a[t * nb..(t + 1) * nb];
                for r in 0..rows {
                    want.push(match ty {
                        GgmlType::Q8_0 => {
                            let w: &[BlockQ8_0] = bytemuck::cast_slice(&bytes);
                            scalar::dot_q8_0_rows16(&w[r * nb..(r + 1) * nb], x)
                        }
                        _ => {
                            let w: &[BlockQ4_1] = bytemuck::cast_slice(&bytes);
                            scalar::dot_q4_1_rows16(&w[r * nb..(r + 1) * nb], x)
                        }
                    });
                }
            }
            every_path_gives(&w, &x, n, &want, &format!("{ty}"));
        }
    }
}

/// `w` × the `n` rows of `x` give `want` bit for bit on every path this CPU runs (the
/// scalar one included), on one thread and on two.
pub(crate) fn every_path_gives(w: &QMatrix, x: &[f32], n: usize, want: &[f32], what: &str) {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let mut paths = vec![Isa::Scalar];
    paths.extend(simd_paths());
    for isa in paths {
        for threads in [1, 2] {
            let got = run(isa, w, x, n, threads);
            assert_eq!(
                bits(&got),
                bits(want),
                "{what} on {isa}, {n} rows, {threads} threads"
            );
        }
    }
}

/// Laying a matrix out for another path keeps its weights bit for bit, both ways, and
/// a matrix of a tile layout keeps it through `block_columns`.
#[test]
fn layouts_keep_the_weights_bit_for_bit() {
    let mut rng = SplitMix64(43);
    let (rows, cols) = (21, 256);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let w4 = QMatrix::new(ty, rows, cols, &bytes).unwrap();
        let w16 = QMatrix::new(ty, rows, cols, &bytes)
            .unwrap()
            .for_isa(Isa::Avx512);
        let back = QMatrix::new(ty, rows, cols, &bytes)
            .unwrap()
            .for_isa(Isa::Avx512)
            .for_isa(Isa::Scalar);
        assert_eq!(w4.layout(), super::matmul::Layout::Tiles4);
        assert_eq!(back.layout(), super::matmul::Layout::Tiles4);
        for m in [&w4, &w16, &back] {
            assert_eq!(m.gguf_bytes(), bytes, "{ty} {:?}", m.layout());
        }
        let cut = w16.block_columns(&[3, 0, 3]).unwrap();
        assert_eq!(cut.layout(), super::matmul::Layout::Tiles16);
        assert_eq!(
            cut.gguf_bytes(),
            w4.block_columns(&[3, 0, 3]).unwrap().gguf_bytes()
        );
    }
}

/// Every way of packing gives the same matrix, bit for bit: straight into a path's
/// layout (`new_for`), from a row source (`from_rows`), and moved into the shared
/// region (`gather`), as `new` then `for_isa` does; a matrix consumed by
/// `into_block_columns` (its buffer given back as it is read) gives what
/// `block_columns` gives, on every type and both tile sizes.
#[test]
fn every_packing_gives_the_same_bits() {
    let mut rng = SplitMix64(47);
    // 300 rows: more than the 256 rows after which a consumed matrix gives pages back.
    let (rows, cols) = (300, 512);
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
    ] {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            let want = QMatrix::new(ty, rows, cols, &bytes).unwrap().for_isa(isa);
            let direct = QMatrix::new_for(isa, ty, rows, cols, &bytes).unwrap();
            let rb = bytes.len() / rows;
            let source =
                |r: usize, out: &mut Vec<u8>| out.extend_from_slice(&bytes[r * rb..(r + 1) * rb]);
            let sourced = QMatrix::from_rows(isa, ty, (rows, cols), &source).unwrap();
            let mut gathered = QMatrix::new_for(isa, ty, rows, cols, &bytes).unwrap();
            let mut other = QMatrix::new_for(isa, ty, 4, cols, &bytes[..4 * rb]).unwrap();
            QMatrix::gather(&mut [&mut other, &mut gathered]);
            for m in [&direct, &sourced, &gathered] {
                assert_eq!(m.layout(), want.layout(), "{ty} {isa}");
                assert_eq!(m.gguf_bytes(), bytes, "{ty} {isa}");
            }
            let blocks = [5, 0, 15, 5];
            let cut = want.block_columns(&blocks).unwrap();
            let consumed = direct.into_block_columns(&blocks).ok().unwrap();
            assert_eq!(consumed.layout(), cut.layout(), "{ty} {isa}");
            assert_eq!(consumed.gguf_bytes(), cut.gguf_bytes(), "{ty} {isa}");
        }
    }
    // A format without 32-wide blocks comes back untouched.
    let q4k = random_weights(&mut rng, GgmlType::Q4_K, 4, 256);
    let m = QMatrix::new(GgmlType::Q4_K, 4, 256, &q4k).unwrap();
    let back = m.into_block_columns(&[0]).err().unwrap();
    assert_eq!(back.gguf_bytes(), q4k);
}

/// The Q2_K, Q3_K and Q5_K kernels sum each block exactly in integers and scale it in
/// the scalar twin's float steps: every SIMD path gives the scalar bits.
#[test]
fn k_quant_simd_is_bit_identical_to_scalar_for_q2_k_q3_k_q5_k() {
    let mut rng = SplitMix64(37);
    let (rows, cols, n) = (9, 1024, 5);
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_K] {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let mut x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
        // A block whose largest value is positive quantizes it to -128: the extreme.
        x[300] = 9.0;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let a = run(Isa::Scalar, &w, &x, n, 1);
        for isa in simd_paths() {
            assert_eq!(bits(&a), bits(&run(isa, &w, &x, n, 2)), "{ty} on {isa}");
        }
    }
}

/// Blocks so large that their f16 sum `s` overflows: the signed formats (no min term)
/// must still give the scalar twin's finite result on every path.
#[test]
fn huge_activations_stay_finite_for_signed_formats() {
    let mut rng = SplitMix64(29);
    let (rows, cols, n) = (8, 256, 3);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
    ] {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| 5000.0 + rng.signed_f32()).collect();
        let a = run(Isa::Scalar, &w, &x, n, 1);
        assert!(a.iter().all(|v| v.is_finite()), "{ty}: scalar");
        for isa in simd_paths() {
            let b = run(isa, &w, &x, n, 2);
            assert!(b.iter().all(|v| v.is_finite()), "{ty} on {isa}: {b:?}");
        }
    }
}

#[test]
fn quantized_dot_is_close_to_the_dequantized_dot() {
    let mut rng = SplitMix64(11);
    let (rows, cols) = (4, 512);
    for ty in TYPES {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let x: Vec<f32> = (0..cols).map(|_| rng.signed_f32()).collect();
        let got = run(Isa::Scalar, &w, &x, 1, 1);
        let mut deq = vec![0f32; cols];
        for (r, &g) in got.iter().enumerate() {
            w.dequant_row(r, &mut deq);
            let exact: f32 = deq.iter().zip(&x).map(|(p, q)| p * q).sum();
            let mag: f32 = deq.iter().zip(&x).map(|(p, q)| (p * q).abs()).sum();
            // 8-bit activations: relative error of order 1/127 of the magnitude.
            assert!(
                (g - exact).abs() <= 0.02 * mag + 1e-6,
                "{ty}: row {r}: quantized {g} exact {exact}"
            );
        }
    }
}

#[test]
fn matmul_results_do_not_depend_on_batch_or_threads() {
    let mut rng = SplitMix64(3);
    // 70 rows: 17 whole four-row tiles, so one thread's share of a one-row matmul runs
    // as one call over its tiles (`run_tiles_one_row`), and the last tile's padding.
    for ((rows, cols, n), ty) in [(22, 256, 13), (70, 256, 3)]
        .into_iter()
        .flat_map(|shape| TYPES.map(|ty| (shape, ty)))
    {
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols)).unwrap();
        let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32()).collect();
        // 5 threads: more than a small machine's cores, so fewer threads claim the tasks.
        for (isa, threads) in runnable().into_iter().flat_map(|i| [(i, 2), (i, 5)]) {
            let all = run(isa, &w, &x, n, threads);
            for t in 0..n {
                let alone = run(isa, &w, &x[t * cols..(t + 1) * cols], 1, 1);
                assert_eq!(
                    &all[t * rows..(t + 1) * rows],
                    &alone[..],
                    "{ty} on {isa}, {threads} threads: token {t}"
                );
            }
        }
    }
}

#[test]
fn f16_helpers_match_scalar() {
    let mut rng = SplitMix64(5);
    for n in [1, 7, 8, 64, 100, 131] {
        let w: Vec<u16> = (0..n).map(|_| f32_to_f16(rng.signed_f32())).collect();
        let x: Vec<f32> = (0..n).map(|_| rng.signed_f32()).collect();
        let a = scalar::dot_f16(&w, &x);
        let b = super::dot_f16(detect(), &w, &x);
        assert_eq!(a.to_bits(), b.to_bits(), "dot_f16 n={n}: {a} vs {b}");
    }
}

#[test]
fn rope_and_f16_rounding_simd_are_bit_identical_to_scalar() {
    let mut rng = SplitMix64(17);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for isa in simd_paths() {
        for n in [1, 7, 8, 64, 100, 131] {
            // Ordinary values, f16's edges (subnormals, overflow, ties) and signed zeros.
            let mut x: Vec<f32> = (0..n).map(|_| rng.signed_f32() * 1e3).collect();
            let edges = [
                6.0e-8,
                65504.0,
                65520.0,
                1e6,
                -0.0,
                1.0 + 1.0 / 2048.0,
                3e-5,
            ];
            for (v, e) in x.iter_mut().zip(edges) {
                *v = e;
            }
            let (mut a, mut b) = (vec![9.0], vec![9.0]);
            scalar::round_f16_into(&x, &mut a);
            super::round_f16_into(isa, &x, &mut b);
            assert_eq!(bits(&a), bits(&b), "{isa} round_f16_into n={n}");
            // K/V stores: f16 bits, the scalar twin's.
            let (mut h, mut want) = (vec![0u16; n], vec![0u16; n]);
            scalar::to_f16(&x, &mut want);
            super::to_f16(&x, &mut h);
            assert_eq!(h, want, "to_f16 n={n}");
        }
        for (adjacent, dims, head_dim) in [(true, 64, 64), (false, 64, 64), (false, 32, 80)] {
            let table: Vec<(f32, f32)> = (0..dims / 2)
                .map(|i| {
                    let t = 3000.0 * (i as f32 * -0.3).exp() + rng.signed_f32();
                    (t.cos(), t.sin())
                })
                .collect();
            let row: Vec<f32> = (0..3 * head_dim).map(|_| rng.signed_f32() * 4.0).collect();
            let (mut a, mut b) = (row.clone(), row);
            scalar::rope_rotate(adjacent, dims / 2, head_dim, &table, &mut a);
            super::rope_rotate(isa, adjacent, dims / 2, head_dim, &table, &mut b);
            assert_eq!(
                bits(&a),
                bits(&b),
                "{isa} rope adjacent={adjacent} dims={dims}"
            );
        }
    }
}

#[test]
fn q8_quantization_round_trips() {
    let mut rng = SplitMix64(9);
    let x: Vec<f32> = (0..256).map(|_| rng.signed_f32() * 4.0).collect();
    let mut q = vec![
        BlockQ8 {
            d: 0.0,
            s: 0.0,
            qs: [0; 32]
        };
        8
    ];
    scalar::quantize_q8(&x, &mut q);
    for (b, xs) in q.iter().zip(x.chunks(32)) {
        for (&qi, &v) in b.qs.iter().zip(xs) {
            assert!((qi as f32 * b.d - v).abs() <= b.d * 0.51 + 1e-3);
        }
    }
    let mut k = vec![
        BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16]
        };
        1
    ];
    scalar::quantize_q8k(&x, &mut k);
    for (&qi, &v) in k[0].qs.iter().zip(&x) {
        assert!((qi as f32 * k[0].d - v).abs() <= k[0].d.abs() * 0.51 + 1e-6);
    }
    // ggml's scale: the largest magnitude is ∓127, never -128.
    let top = (0..256)
        .max_by(|&a, &b| x[a].abs().total_cmp(&x[b].abs()))
        .unwrap();
    assert_eq!(k[0].qs[top], -127, "the largest magnitude maps to -127");
    assert!(k[0].qs.iter().all(|&q| q > -128));
}

#[test]
fn swiglu_simd_is_bit_identical_and_exp_is_accurate() {
    let mut rng = SplitMix64(13);
    let mut xs: Vec<f32> = (0..4000).map(|_| rng.signed_f32() * 30.0).collect();
    xs.extend([
        0.0, -0.0, 88.0, -87.0, 100.0, -100.0, 150.0, -150.0, 200.0, -200.0,
    ]);
    xs.extend((0..6).map(|i| i as f32 * 0.5));
    let up: Vec<f32> = (0..xs.len()).map(|_| rng.signed_f32()).collect();
    let (mut a, mut b) = (xs.clone(), xs.clone());
    scalar::swiglu(&mut a, &up);
    super::swiglu(detect(), &mut b, &up);
    for i in 0..xs.len() {
        assert_eq!(a[i].to_bits(), b[i].to_bits(), "x = {}", xs[i]);
    }
    for &x in &xs {
        let (got, want) = (scalar::exp_poly(x) as f64, (x as f64).exp());
        if want.is_finite() && want > 1e-30 && want < 1e30 {
            assert!(
                (got - want).abs() <= want * 4e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
    }
}

#[test]
fn q8_quantization_is_identical_on_every_path() {
    let mut rng = SplitMix64(17);
    let mut x: Vec<f32> = (0..32 * 64).map(|_| rng.signed_f32() * 10.0).collect();
    x[40] = 0.5; // exact ties round to even on both paths
    x[64..96].fill(0.0);
    // A NaN anywhere in a block makes the whole block NaN-scaled, on every path.
    x[100] = f32::NAN;
    x[160..192].fill(f32::NAN);
    let zero = BlockQ8 {
        d: 0.0,
        s: 0.0,
        qs: [0; 32],
    };
    let (mut a, mut b) = (vec![zero; 64], vec![zero; 64]);
    scalar::quantize_q8(&x, &mut a);
    super::quantize_q8(detect(), &x, &mut b);
    assert!(a[3].d.is_nan() && a[5].d.is_nan() && !a[4].d.is_nan());
    for (p, q) in a.iter().zip(&b) {
        assert_eq!(
            (p.d.to_bits(), p.s.to_bits(), p.qs),
            (q.d.to_bits(), q.s.to_bits(), q.qs)
        );
    }
}

/// Q8_K quantization gives the scalar bytes on every path: random blocks, a block whose
/// largest magnitude is negative, repeated largest magnitudes of both signs (the first
/// one sets the scale), exact ties, an all-zero block and a NaN.
#[test]
fn q8k_quantization_is_identical_on_every_path() {
    let mut rng = SplitMix64(19);
    let mut x: Vec<f32> = (0..256 * 8).map(|_| rng.signed_f32() * 10.0).collect();
    x[300] = -40.0;
    x[301] = 40.0;
    // Block 2: largest magnitude 127/64, so iscale = -64 exactly and 2.5/64 is a tie.
    for v in &mut x[512..768] {
        *v *= 0.1;
    }
    (x[600], x[601]) = (1.984375, -1.984375);
    (x[700], x[701]) = (2.5 / 64.0, -3.5 / 64.0);
    x[768..1024].fill(0.0);
    x[1100] = f32::NAN;
    let zero = <BlockQ8K as bytemuck::Zeroable>::zeroed();
    let mut want = vec![zero; 8];
    scalar::quantize_q8k(&x, &mut want);
    assert!(want[4].d.is_nan() && want[3].d == 0.0);
    for isa in runnable() {
        let mut got = vec![zero; 8];
        super::quantize_q8k(isa, &x, &mut got);
        for (p, q) in want.iter().zip(&got) {
            assert_eq!(
                (p.d.to_bits(), p.qs, p.bsums),
                (q.d.to_bits(), q.qs, q.bsums),
                "{isa}"
            );
        }
    }
}

#[test]
fn attention_simd_is_bit_identical_to_scalar() {
    use super::{KvRows, KvRun};
    let mut rng = SplitMix64(21);
    let (n, stride) = (300, 192);
    let kf: Vec<f32> = (0..n * stride).map(|_| rng.signed_f32() * 2.0).collect();
    let vf: Vec<f32> = (0..n * stride).map(|_| rng.signed_f32() * 3.0).collect();
    let k16: Vec<u16> = kf.iter().map(|&x| f32_to_f16(x)).collect();
    let v16: Vec<u16> = vf.iter().map(|&x| f32_to_f16(x)).collect();
    let off = 64; // the second KV head of rows `stride` elements apart
                  // Both roundings on every kernel (the AVX2 path rounds to f16, the AVX-512 path
                  // does not; f32 K/V never rounds).
    for (f32_kv, round) in [(false, true), (false, false), (true, true)] {
        let rows = |x16: &'static [u16], x32: &'static [f32]| {
            if f32_kv {
                KvRows::F32(x32)
            } else {
                KvRows::F16(x16)
            }
        };
        let leak16 =
            |x: &[u16]| -> &'static [u16] { Box::leak(x[off..].to_vec().into_boxed_slice()) };
        let leak32 =
            |x: &[f32]| -> &'static [f32] { Box::leak(x[off..].to_vec().into_boxed_slice()) };
        let (k, v) = (
            rows(leak16(&k16), leak32(&kf)),
            rows(leak16(&v16), leak32(&vf)),
        );
        // `q` holds one or more queries of 64 back to back; the outputs likewise.
        let run = |isa: Isa, q: &[f32], len: usize, cut: usize| {
            let g = q.len() / 64;
            let mut state = vec![(f32::NEG_INFINITY, 0f32); g];
            let mut acc = vec![0f32; 64 * g];
            // Split at `cut` into two runs of one call, or two calls: the bits of one run.
            let cut = cut.min(len);
            let tail = |x: KvRows<'static>| {
                if cut * stride < x.len() {
                    x.skip(cut * stride)
                } else {
                    x.skip(x.len())
                }
            };
            let runs = [
                KvRun { k, v, n: cut },
                KvRun {
                    k: tail(k),
                    v: tail(v),
                    n: len - cut,
                },
            ];
            if cut.is_multiple_of(2) {
                super::attend_row(
                    isa,
                    round,
                    &row(q, &runs, stride, 0.125),
                    &mut state,
                    &mut acc,
                );
            } else {
                super::attend_row(
                    isa,
                    round,
                    &row(q, &runs[..1], stride, 0.125),
                    &mut state,
                    &mut acc,
                );
                super::attend_row(
                    isa,
                    round,
                    &row(q, &runs[1..], stride, 0.125),
                    &mut state,
                    &mut acc,
                );
            }
            acc.chunks(64)
                .zip(&state)
                .flat_map(|(a, st)| a.iter().map(|x| x / st.1).collect::<Vec<f32>>())
                .collect::<Vec<f32>>()
        };
        // Up to 6 queries sharing the keys (one call runs groups of at most 4) give
        // each query the bits it gets alone.
        for g in 1..=6 {
            let q: Vec<f32> = (0..64 * g).map(|_| rng.signed_f32() * 4.0).collect();
            let mut qk = q.clone();
            if !f32_kv {
                super::round_f16(&q, &mut qk);
            }
            for (len, cut) in [(1, 0), (40, 17), (300, 16)] {
                let alone: Vec<f32> = qk
                    .chunks(64)
                    .flat_map(|qi| run(Isa::Scalar, qi, len, len))
                    .collect();
                let what =
                    format!("{g} queries, {len} keys, cut {cut}, f32 {f32_kv}, round {round}");
                assert_eq!(alone, run(detect(), &qk, len, cut), "{what}");
                assert_eq!(alone, run(Isa::Scalar, &qk, len, cut), "scalar {what}");
            }
        }
        for len in [1, 2, 17, 300] {
            let q: Vec<f32> = (0..64).map(|_| rng.signed_f32() * 4.0).collect();
            let mut qk = q.clone();
            if !f32_kv {
                super::round_f16(&q, &mut qk);
            }
            let a = run(Isa::Scalar, &qk, len, len);
            for cut in [0, 1, 16, 299] {
                let what = format!("{len} keys, cut {cut}, f32 {f32_kv}, round {round}");
                assert_eq!(a, run(detect(), &qk, len, cut), "{what}");
                assert_eq!(a, run(Isa::Scalar, &qk, len, cut), "scalar {what}");
            }
            // And it is attention: close to an f64 softmax-weighted sum.
            let s: Vec<f64> = (0..len)
                .map(|p| {
                    (0..64)
                        .map(|d| k.get(p * stride + d) as f64 * q[d] as f64)
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::MIN, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            let tol = if f32_kv { 1e-4 } else { 0.02 };
            for (d, &got) in a.iter().enumerate() {
                let want: f64 = (0..len)
                    .map(|p| w[p] / z * v.get(p * stride + d) as f64)
                    .sum();
                assert!(
                    (got as f64 - want).abs() < tol,
                    "{len} keys, dim {d}, f32 {f32_kv}: {got} vs {want}"
                );
            }
        }
    }
}

/// Every head size that is a multiple of 32 (Phi-3's 96, Qwen3's 128, Gemma's 256 and
/// the rest) on every SIMD path this CPU runs: each query of a group gets the bits the
/// scalar twin gives it alone, with both roundings, f32 and 8-bit K/V, in one run or
/// two calls.
#[test]
fn attention_simd_is_bit_identical_to_scalar_at_every_head_size() {
    use super::{KvRows, KvRun};
    let paths: Vec<Isa> = runnable().into_iter().filter(|i| i.avx2()).collect();
    if paths.is_empty() {
        println!("skipped: this CPU runs no SIMD path");
        return;
    }
    let mut rng = SplitMix64(77);
    for hd in (32..=256).step_by(32) {
        let (n, stride) = (70, 2 * hd);
        let kf: Vec<f32> = (0..n * stride).map(|_| rng.signed_f32() * 2.0).collect();
        let vf: Vec<f32> = (0..n * stride).map(|_| rng.signed_f32() * 3.0).collect();
        let k16: Vec<u16> = kf.iter().map(|&x| f32_to_f16(x)).collect();
        let v16: Vec<u16> = vf.iter().map(|&x| f32_to_f16(x)).collect();
        let (k8, v8) = (Q8Rows::new(&kf, hd), Q8Rows::new(&vf, hd));
        // 8-bit rows never round (`round` is ignored for them, as for f32).
        let kinds = [
            (KvDtype::F16, true),
            (KvDtype::F16, false),
            (KvDtype::F32, false),
            (KvDtype::Q8, false),
            (KvDtype::Q8, true),
        ];
        for (dtype, round) in kinds {
            let f32_kv = dtype != KvDtype::F16;
            // The second KV head of each row.
            let (k, v) = match dtype {
                KvDtype::F32 => (KvRows::F32(&kf[hd..]), KvRows::F32(&vf[hd..])),
                KvDtype::F16 => (KvRows::F16(&k16[hd..]), KvRows::F16(&v16[hd..])),
                KvDtype::Q8 => (k8.rows(hd), v8.rows(hd)),
            };
            let run = |isa: Isa, q: &[f32], cut: usize| {
                let g = q.len() / hd;
                let mut state = vec![(f32::NEG_INFINITY, 0f32); g];
                let mut acc = vec![0f32; hd * g];
                let runs = [
                    KvRun { k, v, n: cut },
                    KvRun {
                        k: k.skip((cut * stride).min(k.len())),
                        v: v.skip((cut * stride).min(v.len())),
                        n: n - cut,
                    },
                ];
                if cut.is_multiple_of(2) {
                    super::attend_row(
                        isa,
                        round,
                        &row(q, &runs, stride, 0.1),
                        &mut state,
                        &mut acc,
                    );
                } else {
                    for r in runs.chunks(1) {
                        super::attend_row(
                            isa,
                            round,
                            &row(q, r, stride, 0.1),
                            &mut state,
                            &mut acc,
                        );
                    }
                }
                (acc, state)
            };
            for g in 1..=4 {
                let q: Vec<f32> = (0..hd * g).map(|_| rng.signed_f32() * 3.0).collect();
                let mut qk = q.clone();
                if !f32_kv {
                    super::round_f16(&q, &mut qk);
                }
                let (mut want, mut want_st) = (Vec::new(), Vec::new());
                for qi in qk.chunks(hd) {
                    let (a, st) = run(Isa::Scalar, qi, n);
                    want.extend(a.iter().map(|x| x.to_bits()));
                    want_st.extend(st.iter().map(|s| (s.0.to_bits(), s.1.to_bits())));
                }
                for &isa in &paths {
                    for cut in [0, 16, 33] {
                        let (a, st) = run(isa, &qk, cut);
                        let what = format!(
                            "{isa:?}, head {hd}, {g} queries, cut {cut}, {dtype}, round {round}"
                        );
                        assert_eq!(
                            want,
                            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "{what}"
                        );
                        let st: Vec<_> =
                            st.iter().map(|s| (s.0.to_bits(), s.1.to_bits())).collect();
                        assert_eq!(want_st, st, "{what}");
                    }
                }
            }
        }
    }
}

/// Asking for the next keys while computing (`Attend::ahead`, a decode step's next
/// piece) changes no bit: every path gives `attend_runs`'s state and accumulators, with
/// the next keys in pages or in one run, as many as the keys read or none, over f16
/// and 8-bit K/V.
#[test]
fn asking_for_the_next_keys_changes_no_bit() {
    use super::{KvRows, KvRun};
    let mut rng = SplitMix64(29);
    let (n, hd, stride) = (600, 64, 192);
    let k: Vec<u16> = (0..n * stride)
        .map(|_| f32_to_f16(rng.signed_f32() * 2.0))
        .collect();
    let v: Vec<u16> = (0..n * stride)
        .map(|_| f32_to_f16(rng.signed_f32() * 3.0))
        .collect();
    // The same values in the 8-bit format.
    let wide = |x: &[u16]| x.iter().map(|&h| f16_to_f32(h)).collect::<Vec<f32>>();
    let (k8, v8) = (Q8Rows::new(&wide(&k), hd), Q8Rows::new(&wide(&v), hd));
    // Keys `from..to` of the second head, as pages of `page`, or whole rows (`off` 0),
    // f16 or 8-bit.
    let pages = |from: usize, to: usize, page: usize, off: usize, q8: bool| -> Vec<KvRun> {
        (from..to)
            .step_by(page)
            .map(|p| {
                let at = p * stride + off;
                let (k, v) = if q8 {
                    (k8.rows(at), v8.rows(at))
                } else {
                    (KvRows::F16(&k[at..]), KvRows::F16(&v[at..]))
                };
                KvRun {
                    k,
                    v,
                    n: page.min(to - p),
                }
            })
            .collect()
    };
    let q: Vec<f32> = (0..3 * hd).map(|_| rng.signed_f32() * 4.0).collect();
    let mut qk = Vec::new();
    super::round_f16(&q, &mut qk);
    for (isa, q8) in runnable().into_iter().flat_map(|i| [(i, false), (i, true)]) {
        let pages = |from, to, page, off| pages(from, to, page, off, q8);
        for (read, page, later) in [(128, 16, 43), (300, 7, 300), (128, 128, 0), (40, 16, 600)] {
            let runs = pages(0, read, page, hd);
            let ahead = pages(read, (read + later).min(n), page, 0);
            let fresh = || (vec![(f32::NEG_INFINITY, 0f32); 3], vec![0f32; 3 * hd]);
            let (mut want_state, mut want_acc) = fresh();
            super::attend_runs(
                isa,
                &qk,
                &runs,
                stride,
                0.125,
                &mut want_state,
                &mut want_acc,
            );
            let (mut state, mut acc) = fresh();
            let (st, ac) = (&mut state, &mut acc);
            let c = super::Attend {
                from: &[],
                ahead: &ahead,
                ..row(&qk, &runs, stride, 0.125)
            };
            super::attend_row(isa, isa.f16_attention(), &c, st, ac);
            let what =
                format!("{isa}, 8-bit {q8}, {read} keys in pages of {page}, {later} asked for");
            assert_eq!(want_state, state, "{what}");
            assert_eq!(want_acc, acc, "{what}");
        }
    }
}

/// A block of query rows through `attend` (keys in pages, each row with its own
/// causal limit) gives every query exactly the bits the scalar kernel gives it alone
/// over its keys in one run, on every path, with and without llama.cpp's f16 value
/// accumulators, for f16, f32 and 8-bit K/V.
#[test]
fn attention_block_gives_each_row_its_bits_alone() {
    let mut rng = SplitMix64(23);
    // Every head size the AVX-512 block kernel takes (32 to 128), one it does not (160),
    // and Gemma 3's 256 (the AVX2 block kernel takes all of them).
    for hd in [64, 32, 96, 128, 160, 256] {
        block_case(&mut rng, hd);
    }
}

/// K or V rows in the 8-bit format: the bytes and the scales of head rows of `hd`.
struct Q8Rows {
    q: Vec<i8>,
    d: Vec<u16>,
    hd: usize,
}

impl Q8Rows {
    fn new(x: &[f32], hd: usize) -> Self {
        let (mut q, mut d) = (vec![0i8; x.len()], vec![0u16; x.len() / hd]);
        super::quantize_kv_q8(x, hd, &mut q, &mut d);
        Q8Rows { q, d, hd }
    }

    /// The rows from element `at` (a head row's first) on.
    fn rows(&self, at: usize) -> super::KvRows<'_> {
        super::KvRows::Q8 {
            q: &self.q,
            d: &self.d,
            hd: self.hd,
        }
        .skip(at)
    }
}

/// 8-bit K/V: each value is `q · d` within half a step (`d / 2`) of what was written,
/// `d = amax / 127` of its head row, a row of zeros stays zeros, and a non-finite
/// value leaves the row's other values readable (no NaN scale).
#[test]
fn q8_kv_rows_read_back_within_half_a_step() {
    let mut rng = SplitMix64(41);
    for hd in [32, 64, 128] {
        let mut x: Vec<f32> = (0..8 * hd).map(|_| rng.signed_f32() * 5.0).collect();
        x[hd..2 * hd].fill(0.0);
        x[2 * hd + 3] = f32::INFINITY;
        x[3 * hd + 5] = f32::NAN;
        let r = Q8Rows::new(&x, hd);
        let rows = r.rows(0);
        for (row, xs) in x.chunks(hd).enumerate() {
            let amax = xs
                .iter()
                .filter(|v| v.is_finite())
                .fold(0f32, |m, v| m.max(v.abs()));
            let d = f16_to_f32(r.d[row]);
            assert!(d.is_finite(), "head {hd}, row {row}: scale {d}");
            if row == 1 {
                assert_eq!(d, 0.0);
            }
            for (i, &v) in xs.iter().enumerate() {
                let got = rows.get(row * hd + i);
                assert!(got.is_finite(), "head {hd}, row {row}, {i}: {got}");
                if v.is_finite() && row != 2 {
                    let step = (amax / 127.0) * 1.001;
                    assert!(
                        (got - v).abs() <= step / 2.0 + 1e-6,
                        "head {hd}, row {row}: {got} for {v}"
                    );
                }
            }
        }
    }
}

/// The 8-bit format's rotation (`rotate_heads`) keeps dot products (it is orthogonal)
/// and is its own inverse, up to rounding, for powers of two; other head sizes are left
/// as they are.
#[test]
fn the_q8_rotation_keeps_dot_products_and_undoes_itself() {
    let mut rng = SplitMix64(43);
    for hd in [2, 32, 64, 128, 256] {
        let x: Vec<f32> = (0..3 * hd).map(|_| rng.signed_f32() * 4.0).collect();
        let y: Vec<f32> = (0..3 * hd).map(|_| rng.signed_f32() * 4.0).collect();
        let (mut rx, mut ry) = (x.clone(), y.clone());
        super::rotate_heads(&mut rx, hd);
        super::rotate_heads(&mut ry, hd);
        for h in 0..3 {
            let dot = |a: &[f32], b: &[f32]| -> f64 {
                a[h * hd..(h + 1) * hd]
                    .iter()
                    .zip(&b[h * hd..(h + 1) * hd])
                    .map(|(p, q)| f64::from(*p) * f64::from(*q))
                    .sum()
            };
            assert!(
                (dot(&x, &y) - dot(&rx, &ry)).abs() < 1e-3 * hd as f64,
                "head {hd}"
            );
        }
        assert_ne!(rx, x, "head {hd}: rotated");
        super::rotate_heads(&mut rx, hd);
        for (a, b) in rx.iter().zip(&x) {
            assert!(
                (a - b).abs() < 1e-5 * 4.0 * hd as f32,
                "head {hd}: {a} vs {b}"
            );
        }
    }
    let x: Vec<f32> = (0..96).map(|i| i as f32).collect();
    let mut r = x.clone();
    super::rotate_heads(&mut r, 96);
    assert_eq!(r, x, "96 is not a power of two: not rotated");
}

/// `attention_block_gives_each_row_its_bits_alone` for head size `hd`.
fn block_case(rng: &mut SplitMix64, hd: usize) {
    use super::{KvRows, KvRun};
    // K/V rows of three heads; the keys read are the second head's.
    let (n, stride, off) = (700, 3 * hd, hd);
    let kf: Vec<f32> = (0..n * stride).map(|_| rng.signed_f32() * 2.0).collect();
    let vf: Vec<f32> = (0..n * stride).map(|_| rng.signed_f32() * 3.0).collect();
    let k16: Vec<u16> = kf.iter().map(|&x| f32_to_f16(x)).collect();
    let v16: Vec<u16> = vf.iter().map(|&x| f32_to_f16(x)).collect();
    let (k8, v8) = (Q8Rows::new(&kf, hd), Q8Rows::new(&vf, hd));
    for dtype in [KvDtype::F16, KvDtype::F32, KvDtype::Q8] {
        let f32_kv = dtype != KvDtype::F16;
        let rows_at = |p: usize| {
            let at = p * stride + off;
            match dtype {
                KvDtype::F32 => (KvRows::F32(&kf[at..]), KvRows::F32(&vf[at..])),
                KvDtype::F16 => (KvRows::F16(&k16[at..]), KvRows::F16(&v16[at..])),
                KvDtype::Q8 => (k8.rows(at), v8.rows(at)),
            }
        };
        // The keys 0..len as pages of `page` keys.
        let paged = |len: usize, page: usize| -> Vec<KvRun> {
            (0..len)
                .step_by(page)
                .map(|p| {
                    let (k, v) = rows_at(p);
                    KvRun {
                        k,
                        v,
                        n: page.min(len - p),
                    }
                })
                .collect()
        };
        // (query heads per KV head, rows, page size, keys, window).
        for (g, rows, page, len, window) in [
            (3, 16, 16, 700, None),
            (3, 5, 7, 300, None),
            (1, 1, 16, 33, None),
            (2, 20, 1, 90, None),
            (4, 9, 64, 700, None),
            (3, 20, 16, 400, Some(100)),
            (2, 7, 5, 90, Some(3)),
        ] {
            let q: Vec<f32> = (0..rows * g * hd).map(|_| rng.signed_f32() * 4.0).collect();
            let mut qk = q.clone();
            if !f32_kv {
                super::round_f16(&q, &mut qk);
            }
            // Consecutive positions ending at the last key, as a prefill block has, and
            // some rows with other limits.
            let keys: Vec<usize> = (0..rows)
                .map(|r| match r % 4 {
                    3 => 1 + rng.below(len as u64) as usize,
                    _ => len - (rows - 1 - r).min(len - 1),
                })
                .collect();
            // With a window, row r reads keys from[r]..keys[r].
            let from: Vec<usize> = keys
                .iter()
                .map(|&k| window.map_or(0, |w: usize| k.saturating_sub(w)))
                .collect();
            // Each query alone over its keys in one run, with the path's rounding.
            let alone = |round: bool| {
                let mut want_state = vec![(f32::NEG_INFINITY, 0f32); rows * g];
                let mut want_acc = vec![0f32; rows * g * hd];
                for (r, &reach) in keys.iter().enumerate() {
                    let (k, v) = rows_at(from[r]);
                    let run = [KvRun {
                        k,
                        v,
                        n: reach - from[r],
                    }];
                    for h in 0..g {
                        let i = r * g + h;
                        let st = &mut want_state[i];
                        scalar::attend_runs(
                            &qk[i * hd..(i + 1) * hd],
                            &run,
                            stride,
                            0.125,
                            (&mut st.0, &mut st.1),
                            &mut want_acc[i * hd..(i + 1) * hd],
                            round,
                        );
                    }
                }
                (want_state, want_acc)
            };
            for (isa, round) in runnable()
                .into_iter()
                .flat_map(|isa| [(isa, false), (isa, isa.f16_attention())])
            {
                let (want_state, want_acc) = alone(round);
                let mut state = vec![(f32::NEG_INFINITY, 0f32); rows * g];
                let mut acc = vec![0f32; rows * g * hd];
                let runs = paged(len, page);
                let a = super::Attend {
                    q: &qk,
                    keys: &keys,
                    from: if window.is_some() { &from } else { &[] },
                    runs: &runs,
                    ahead: &[],
                    stride,
                    scale: 0.125,
                    cap: 0.0,
                };
                super::attend(isa, round, &a, &mut state, &mut acc);
                let what = format!(
                    "{isa}, round {round}, head {hd}, {g} heads, {rows} rows, page {page}, window {window:?}, {dtype}"
                );
                assert_eq!(want_state, state, "{what}");
                assert_eq!(want_acc, acc, "{what}");
            }
        }
    }
}

/// The packed four-row Q4_1 kernel (two rows per vector) must give exactly the bits of
/// the one-row kernel that follows ggml's lane layout, for every column count it runs.
#[test]
fn packed_q4_1_tile_is_bit_identical_to_the_row_kernel() {
    if !cpu_runs(Isa::Avx2) {
        return;
    }
    let mut rng = SplitMix64(19);
    let (rows, cols) = (4, 576);
    let nb = cols / QK;
    let bytes = random_weights(&mut rng, GgmlType::Q4_1, rows, cols);
    let blocks: &[BlockQ4_1] = bytemuck::cast_slice(&bytes);
    let packed: Vec<BlockQ4_1x4> = (0..nb)
        .map(|i| {
            let b = |r: usize| blocks[r * nb + i];
            BlockQ4_1x4 {
                dm: [
                    b(0).d,
                    b(1).d,
                    b(2).d,
                    b(3).d,
                    b(0).m,
                    b(1).m,
                    b(2).m,
                    b(3).m,
                ],
                qs: [b(0).qs, b(1).qs, b(2).qs, b(3).qs],
            }
        })
        .collect();
    let acts: Vec<Vec<BlockQ8>> = (0..3)
        .map(|_| {
            let x: Vec<f32> = (0..cols).map(|_| rng.signed_f32() * 4.0).collect();
            let mut q = vec![bytemuck::Zeroable::zeroed(); nb];
            scalar::quantize_q8(&x, &mut q);
            q
        })
        .collect();
    let mut want = [[0f32; 1]; 1];
    let mut got1 = [[0f32; 1]; 4];
    let mut got2 = [[0f32; 2]; 4];
    let mut got3 = [[0f32; 3]; 4];
    // SAFETY: AVX2, FMA and F16C were detected above.
    unsafe {
        super::avx2::tile_q4_1x4::<MADD, 1>(&packed, [&acts[0]], &mut got1);
        super::avx2::tile_q4_1x4::<MADD, 2>(&packed, [&acts[1], &acts[0]], &mut got2);
        super::avx2::tile_q4_1x4::<MADD, 3>(&packed, [&acts[2], &acts[1], &acts[0]], &mut got3);
    }
    for r in 0..rows {
        for (c, a) in acts.iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                super::avx2::tile_q4_1::<MADD, 1, 1>(
                    [&blocks[r * nb..(r + 1) * nb]],
                    [a],
                    &mut want,
                )
            };
            let w = want[0][0].to_bits();
            assert_eq!(got3[r][2 - c].to_bits(), w, "row {r} act {c} (3 columns)");
            if c < 2 {
                assert_eq!(got2[r][1 - c].to_bits(), w, "row {r} act {c} (2 columns)");
            }
            if c == 0 {
                assert_eq!(got1[r][0].to_bits(), w, "row {r} (1 column)");
            }
        }
    }
}

/// Bit patterns for the exp tests: every `step`-th of all 2^32, then the edges.
fn exp_inputs(step: u64) -> impl Iterator<Item = f32> {
    let edges = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        88.0,
        -88.0,
        f32::from_bits(scalar::expf_consts::OVERFLOW),
        f32::from_bits(scalar::expf_consts::OVERFLOW + 1),
        f32::from_bits(scalar::expf_consts::UNDERFLOW),
        f32::from_bits(scalar::expf_consts::UNDERFLOW + 1),
        f32::from_bits(scalar::expf_consts::UNDERFLOW - 1),
    ];
    (0..1u64 << 32)
        .step_by(step as usize)
        .map(|b| f32::from_bits(b as u32))
        .chain(edges)
}

fn same_float(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `exp` (`N` lanes at a time) gives `scalar::expf_table`'s bits on every 257th f32 bit
/// pattern and the edge values; `path` names it in the message.
fn exp_matches_scalar<const N: usize>(path: &str, exp: impl Fn(&[f32; N], &mut [f32; N])) {
    let xs: Vec<f32> = exp_inputs(257).collect();
    for chunk in xs.chunks(N) {
        let mut x = [0f32; N];
        x[..chunk.len()].copy_from_slice(chunk);
        let mut got = [0f32; N];
        exp(&x, &mut got);
        for (&xi, &g) in x.iter().zip(&got) {
            let want = scalar::expf_table(xi);
            assert!(
                same_float(g, want),
                "exp({xi:e}): {path} {g:e}, scalar {want:e}"
            );
        }
    }
}

#[test]
fn expf_table_simd_is_bit_identical_to_scalar() {
    if !cpu_runs(Isa::Avx2) {
        return;
    }
    // SAFETY: AVX2, FMA and F16C were detected above.
    exp_matches_scalar("avx2", |x, out| unsafe {
        super::avx2::expf_table_8(x, out)
    });
}

#[test]
fn expf_table_avx512_is_bit_identical_to_scalar() {
    if !cpu_runs(Isa::Avx512) {
        return;
    }
    // SAFETY: the AVX-512 path was detected (by running it) above.
    exp_matches_scalar("avx512", |x, out| unsafe {
        super::avx512_attend::expf16_mem(x, out)
    });
}

/// folio's `expf` is glibc's: on glibc with FMA (where llama.cpp's flash attention gets
/// its `expf`) every input gives the same bits as the C library.
#[test]
fn expf_table_equals_glibc() {
    if !(cfg!(all(
        target_os = "linux",
        target_env = "gnu",
        target_arch = "x86_64"
    )) && detect().avx2())
    {
        eprintln!("not glibc on x86-64 with FMA: nothing to compare");
        return;
    }
    let mut bad = 0;
    for x in exp_inputs(61) {
        let (ours, libm) = (scalar::expf_table(x), x.exp());
        if !same_float(ours, libm) {
            bad += 1;
            eprintln!("exp({x:e}) = {ours:e}, libm {libm:e}");
        }
    }
    assert_eq!(bad, 0);
}

/// The packed four-row Q8_0 kernel of the AVX2 path must give exactly the bits of the
/// row kernel that follows ggml's lanes (llama.cpp's AVX2 build's), tails included.
#[test]
fn packed_q8_0_matmul_is_bit_identical_to_the_row_kernel() {
    if !cpu_runs(Isa::Avx2) {
        return;
    }
    let mut rng = SplitMix64(31);
    let (rows, cols, n) = (10, 576, 5);
    let nb = cols / QK;
    let bytes = random_weights(&mut rng, GgmlType::Q8_0, rows, cols);
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(&bytes);
    let w = QMatrix::new(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
    let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 4.0).collect();
    let got = run(Isa::Avx2, &w, &x, n, 2);
    for t in 0..n {
        let mut q = vec![bytemuck::Zeroable::zeroed(); nb];
        scalar::quantize_q8(&x[t * cols..(t + 1) * cols], &mut q);
        for r in 0..rows {
            let mut want = [[0f32; 1]; 1];
            // SAFETY: AVX2, FMA and F16C were detected above.
            unsafe {
                super::avx2::tile_q8_0::<MADD, 1, 1>(
                    [&blocks[r * nb..(r + 1) * nb]],
                    [&q],
                    &mut want,
                )
            };
            assert_eq!(
                got[t * rows + r].to_bits(),
                want[0][0].to_bits(),
                "row {r} token {t}"
            );
        }
    }
}

#[test]
fn stream_sum_is_the_plain_wrapping_sum() {
    let mut rng = SplitMix64(47);
    let words: Vec<u64> = (0..5003).map(|_| rng.next_u64()).collect();
    for n in [0, 1, 7, 8, 9, 1024, 5003] {
        let want = words[..n].iter().fold(0u64, |s, &w| s.wrapping_add(w));
        assert_eq!(super::stream_sum(&words[..n]), want, "{n} words");
    }
}

/// A one-row call over `runs`, nothing asked for ahead, uncapped.
fn row<'a>(
    q: &'a [f32],
    runs: &'a [super::KvRun<'a>],
    stride: usize,
    scale: f32,
) -> super::Attend<'a> {
    super::Attend {
        q,
        keys: &[],
        from: &[],
        runs,
        ahead: &[],
        stride,
        scale,
        cap: 0.0,
    }
}
