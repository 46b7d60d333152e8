//! The sixteen-row tile kernels over the `tiles16` layouts (AVX-512, `avx512_kquants`:
//! Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K and Q6_K; AVX2 and AVX-VNNI, `avx2_tiles16`: Q5_0, Q4_K
//! and Q6_K, `avx2_tiles16_more`: Q4_1, Q8_0, Q4_0, IQ4_NL and Q5_K) against their scalar twins and
//! one another, and the layouts' packing.

use super::matmul::{Layout, QMatrix};
use super::quant::*;
use super::scalar;
use super::tests::{every_path_gives, extreme_weights, run, simd_paths};
use super::tiles16::Tile16;
use super::Isa;
use crate::gguf::GgmlType;
use crate::rng::SplitMix64;

/// The types in sixteen-row tiles on the AVX-512 path.
const TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::IQ4_NL,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The types with AVX2 sixteen-row tile kernels: the AVX-512 path's, and Q4_1 and Q8_0
/// (whose AVX-512 kernels `tests.rs` holds to their twins).
const AVX2_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::IQ4_NL,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The types the AVX2 paths lay out in sixteen-row tiles (Q5_K stays in rows there:
/// `QMatrix::layout_for`).
const AVX2_TILED: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::IQ4_NL,
    GgmlType::Q4_K,
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
                GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q8_0
                | GgmlType::Q5_0
                | GgmlType::IQ4_NL => {
                    let mut a = vec![<BlockQ8 as bytemuck::Zeroable>::zeroed(); cols / QK];
                    scalar::quantize_q8(x, &mut a);
                    match ty {
                        GgmlType::Q4_1 => scalar::dot_q4_1_rows16(bytemuck::cast_slice(row), &a),
                        GgmlType::Q8_0 => scalar::dot_q8_0_rows16(bytemuck::cast_slice(row), &a),
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

/// The sixteen-row kernels of `types` compute exactly their scalar twins, bit for bit,
/// in the layout `for_isa(layout_isa)` gives (sixteen-row tiles on the AVX-512
/// and the AVX2 paths): on every tile width (1, 3, 6 and 37 activation rows: the AVX2
/// paths' widths 1..=4 and the AVX-512 path's 1..=8 and 16; one row is the decode form
/// over many tiles), rows past the last whole tile, either thread count, the extreme
/// quants, and activations whose largest value quantizes to -128. Every path runs:
/// those without a kernel for the layout through the twins.
fn kquant_tiles_compute_their_twins(layout_isa: Isa, types: &[GgmlType], seed: u64) {
    let mut rng = SplitMix64(seed);
    let (rows, cols) = (37, 768);
    for &ty in types {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &bytes)
            .unwrap()
            .for_isa(layout_isa);
        assert_eq!(w.layout(), Layout::Tiles16, "{ty} for {layout_isa}");
        for n in [1, 3, 6, 37] {
            let mut x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
            x[cols - 7] = 9.0;
            let want = twins(ty, &bytes, (rows, cols), &x, n);
            every_path_gives(&w, &x, n, &want, &format!("{ty} in {layout_isa}'s layout"));
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn sixteen_row_kquant_kernels_are_their_scalar_twins_exactly() {
    kquant_tiles_compute_their_twins(Isa::Avx512, &TYPES, 53);
}

/// [`kquant_tiles_compute_their_twins`] in the AVX2 path's layout (the AVX-VNNI path's
/// too): the `avx2_tiles16` kernels on this CPU's AVX2 paths.
#[test]
fn avx2_sixteen_row_kquant_kernels_are_their_scalar_twins_exactly() {
    assert_eq!(
        QMatrix::layout_for(Isa::AvxVnni, GgmlType::Q4_K),
        Layout::Tiles16
    );
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        assert_eq!(
            QMatrix::llama_layout_for(Isa::Avx2, ty),
            Layout::Tiles4,
            "{ty}, llama.cpp's order"
        );
    }
    for ty in TYPES {
        assert_eq!(QMatrix::layout_for(Isa::Scalar, ty), Layout::Rows, "{ty}");
    }
    assert_eq!(QMatrix::layout_for(Isa::Avx2, GgmlType::Q5_K), Layout::Rows);
    kquant_tiles_compute_their_twins(Isa::Avx2, &AVX2_TILED, 67);
    // Q5_K in tiles (laid out for AVX-512) runs the AVX2 kernel on the AVX2 paths.
    kquant_tiles_compute_their_twins(Isa::Avx512, &[GgmlType::Q5_K], 67);
}

/// The AVX2 and AVX-512 paths give the same bits on the sixteen-row layouts, on
/// ordinary random weights of a model's shape (many tiles, several blocks), for the
/// decode form, batched decode and prefill widths, and with the result added to the
/// output (`matmul_add`).
#[test]
fn avx2_and_avx512_sixteen_row_kernels_give_the_same_bits() {
    let paths = simd_paths();
    if !paths.contains(&Isa::Avx512) || !paths.contains(&Isa::Avx2) {
        eprintln!("skipped: this CPU does not run both the avx2 and avx512 kernels");
        return;
    }
    let mut rng = SplitMix64(71);
    let (rows, cols) = (200, 1536);
    for ty in AVX2_TYPES {
        let bytes = super::tests::random_weights(&mut rng, ty, rows, cols);
        // The AVX-512 layout: the AVX2 one but for Q5_K, which the AVX2 paths keep in
        // rows (and run in tiles where given them).
        let w = QMatrix::new_for(Isa::Avx512, ty, rows, cols, &bytes).unwrap();
        for n in [1, 2, 16, 21] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 2.0).collect();
            let a = run(Isa::Avx2, &w, &x, n, 2);
            let b = run(Isa::Avx512, &w, &x, n, 2);
            assert_eq!(bits(&a), bits(&b), "{ty}, {n} rows");
            let pool = super::ThreadPool::new(2).unwrap();
            let mut sums = Vec::new();
            for isa in [Isa::Avx2, Isa::Avx512] {
                let mut act = super::Activations::default();
                act.set(&x, n, cols);
                let mut out = vec![0.5f32; n * rows];
                super::matmul::matmul_add(&pool, isa, &mut act, &w, &mut out);
                sums.push(bits(&out));
            }
            assert_eq!(sums[0], sums[1], "{ty}, {n} rows, added");
        }
    }
}

/// Sixteen rows' GGUF blocks (`nb` each, row-major in `blocks`) as a tile column.
fn tile16<T: Tile16>(blocks: &[T::Block], nb: usize) -> Vec<T> {
    (0..nb)
        .map(|i| {
            let mut t: T = bytemuck::Zeroable::zeroed();
            for r in 0..16 {
                t.put(r, &blocks[r * nb + i]);
            }
            t
        })
        .collect()
}

/// Activation rows as Q8 blocks, their blocks' -128·Σx, and as Q8_K blocks.
type Acts<'a> = (&'a [Vec<BlockQ8>], &'a [Vec<i32>], &'a [Vec<BlockQ8K>]);

/// Sixteen GGUF rows of `ty` (`bytes`) as tiles against the first C activation rows
/// (`q8` and their `sums`, or `q8k`) through the AVX2 paths' kernel for `ty` with dot
/// step `D`, at width C: the results, C rows of sixteen. Q5_0's also go through the
/// kernel on unpacked tiles (`tile_q5_0x16_bytes`), asserted to give the same bits.
///
/// # Safety
/// The CPU must run avx2, fma, f16c and step `D`'s instruction (or have it emulated).
unsafe fn avx2_tiles16_at<const D: u8, const C: usize>(
    ty: GgmlType,
    bytes: &[u8],
    (q8, sums, q8k): Acts,
) -> Vec<f32> {
    use super::avx2_tiles16::{
        expand_q5_0x16, tile_q4kx16, tile_q5_0x16, tile_q5_0x16_bytes, tile_q6kx16,
    };
    use super::avx2_tiles16_more::{tile_q4_1x16, tile_q4x16, tile_q5kx16, tile_q8_0x16};
    use super::avx512::TileOut;
    use super::tiles16::{BlockIq4Nlx16, BlockQ4_0x16};
    let mut o = vec![0f32; C * 16];
    let out = TileOut {
        ptr: o.as_mut_ptr(),
        stride: 16,
        len: 16,
        add: false,
    };
    let a8: [&[BlockQ8]; C] = std::array::from_fn(|c| &q8[c][..]);
    let s8: [&[i32]; C] = std::array::from_fn(|c| &sums[c][..]);
    let ak: [&[BlockQ8K]; C] = std::array::from_fn(|c| &q8k[c][..]);
    let (nb, nbk) = (q8[0].len(), q8k[0].len());
    // SAFETY: the caller guarantees the CPU features; `out` is `o`'s C rows of sixteen,
    // borrowed mutably here.
    unsafe {
        match ty {
            GgmlType::Q4_1 => {
                tile_q4_1x16::<D, C>(&tile16(bytemuck::cast_slice(bytes), nb), a8, &out)
            }
            GgmlType::Q8_0 => {
                tile_q8_0x16::<D, C>(&tile16(bytemuck::cast_slice(bytes), nb), a8, s8, &out)
            }
            GgmlType::Q4_0 => tile_q4x16::<D, BlockQ4_0x16, C>(
                &tile16(bytemuck::cast_slice(bytes), nb),
                a8,
                s8,
                &out,
            ),
            GgmlType::Q5_0 => {
                // Also unpacked first (prefill's form): the same bits.
                let w = tile16(bytemuck::cast_slice(bytes), nb);
                let mut unpacked = vec![[[0u8; 64]; 8]; w.len()];
                expand_q5_0x16(&w, &mut unpacked);
                let mut o2 = vec![0f32; C * 16];
                let out2 = TileOut {
                    ptr: o2.as_mut_ptr(),
                    ..out
                };
                tile_q5_0x16_bytes::<D, C>(&w, &unpacked, a8, s8, &out2);
                tile_q5_0x16::<D, C>(&w, a8, s8, &out);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&o), bits(&o2), "Q5_0 unpacked at width {C}");
            }
            GgmlType::IQ4_NL => tile_q4x16::<D, BlockIq4Nlx16, C>(
                &tile16(bytemuck::cast_slice(bytes), nb),
                a8,
                s8,
                &out,
            ),
            GgmlType::Q4_K => {
                tile_q4kx16::<D, C>(&tile16(bytemuck::cast_slice(bytes), nbk), ak, &out)
            }
            GgmlType::Q5_K => {
                tile_q5kx16::<D, C>(&tile16(bytemuck::cast_slice(bytes), nbk), ak, &out)
            }
            GgmlType::Q6_K => {
                tile_q6kx16::<D, C>(&tile16(bytemuck::cast_slice(bytes), nbk), ak, &out)
            }
            ty => unreachable!("no AVX2 sixteen-row tile kernel for {ty}"),
        }
    }
    o
}

/// The AVX2 paths' sixteen-row kernels (`avx2_tiles16`, `avx2_tiles16_more`) with 8-bit
/// dot step `D` give the bits they give with `MADD`, and those of the twins, at every
/// width 1..=4, on the extreme quants against activation blocks all +127 and all -127
/// (the widest 16-bit sums of `MADD`). The tests of `tests_vnni` run this with
/// AVX-VNNI's VEX step, natively or emulated, and AVX-512's EVEX one.
///
/// # Safety
/// The CPU must run avx2, fma, f16c and step `D`'s instruction (or have it emulated).
pub(crate) unsafe fn avx2_tiles16_give_the_madd_bits<const D: u8>() -> Result<(), String> {
    use super::avxvnni::MADD;
    let mut rng = SplitMix64(73);
    let (rows, cols, n) = (16, 512, 4);
    let mut x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
    // Row 0 within ±1, its first block (of 32, and of the extreme weights) all +1 and
    // its fourth all -1: quantized to ±127 in both forms.
    x[..QK_K].iter_mut().for_each(|v| *v /= 3.0);
    x[..QK].fill(1.0);
    x[3 * QK..4 * QK].fill(-1.0);
    let xs = |t: usize| &x[t * cols..(t + 1) * cols];
    let q8: Vec<Vec<BlockQ8>> = (0..n)
        .map(|t| {
            let mut a = vec![bytemuck::Zeroable::zeroed(); cols / QK];
            scalar::quantize_q8(xs(t), &mut a);
            a
        })
        .collect();
    let sums: Vec<Vec<i32>> = q8
        .iter()
        .map(|a| {
            a.iter()
                .map(|b| -128 * b.qs.iter().map(|&q| i32::from(q)).sum::<i32>())
                .collect()
        })
        .collect();
    let q8k: Vec<Vec<BlockQ8K>> = (0..n)
        .map(|t| {
            let mut a = vec![bytemuck::Zeroable::zeroed(); cols / QK_K];
            scalar::quantize_q8k(xs(t), &mut a);
            a
        })
        .collect();
    assert!(q8[0][0].qs.iter().all(|&q| q == 127) && q8[0][3].qs.iter().all(|&q| q == -127));
    let acts = (&q8[..], &sums[..], &q8k[..]);
    for ty in AVX2_TYPES {
        let bytes = extreme_weights(&mut rng, ty, rows, cols);
        let want = twins(ty, &bytes, (rows, cols), &x, n);
        for width in 1..=n {
            // SAFETY: the caller guarantees the CPU features.
            let (madd, d) = unsafe {
                match width {
                    1 => (
                        avx2_tiles16_at::<MADD, 1>(ty, &bytes, acts),
                        avx2_tiles16_at::<D, 1>(ty, &bytes, acts),
                    ),
                    2 => (
                        avx2_tiles16_at::<MADD, 2>(ty, &bytes, acts),
                        avx2_tiles16_at::<D, 2>(ty, &bytes, acts),
                    ),
                    3 => (
                        avx2_tiles16_at::<MADD, 3>(ty, &bytes, acts),
                        avx2_tiles16_at::<D, 3>(ty, &bytes, acts),
                    ),
                    _ => (
                        avx2_tiles16_at::<MADD, 4>(ty, &bytes, acts),
                        avx2_tiles16_at::<D, 4>(ty, &bytes, acts),
                    ),
                }
            };
            let want = bits(&want[..width * rows]);
            if bits(&madd) != want {
                return Err(format!(
                    "AVX2 sixteen-row {ty}, width {width}: the MADD step differs from the twins"
                ));
            }
            if bits(&d) != want {
                return Err(format!(
                    "AVX2 sixteen-row {ty}, width {width}: step {D} differs from the twins"
                ));
            }
        }
    }
    Ok(())
}

/// The AVX2 sixteen-row kernels at every width 1..=4 with the AVX2 step (`MADD`), bit
/// for bit their scalar twins (and, at no extra cost, with the EVEX step where the CPU
/// runs AVX-512; `tests_vnni` runs the VEX one).
#[test]
fn avx2_sixteen_row_kernels_at_every_width_are_their_twins() {
    use super::avxvnni::{EVEX, MADD};
    if !simd_paths().contains(&Isa::Avx2) {
        return;
    }
    // SAFETY: the AVX2 path runs only where avx2, fma and f16c were detected, the
    // AVX-512 one only where avx512f/bw/vl/vnni executed.
    unsafe {
        avx2_tiles16_give_the_madd_bits::<MADD>().unwrap();
        if simd_paths().contains(&Isa::Avx512) {
            avx2_tiles16_give_the_madd_bits::<EVEX>().unwrap();
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
            .for_isa(Isa::Scalar);
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
