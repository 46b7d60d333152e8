//! The AVX-VNNI path against the AVX2 path: the same bits (see `avxvnni.rs`), kernel
//! by kernel for each 8-bit dot step and through the matmul, and against the scalar
//! twins. Runs natively where the CPU runs the step's instruction; where it faults on
//! AVX-VNNI, in a forked child under `vnni_emulator` (the kernels' instruction stream is
//! the real one, each `vpdpbusd`'s arithmetic the emulator's). The EVEX form of the
//! same instruction (AVX-512 VNNI, which such a CPU may run) checks the kernels' VNNI
//! arithmetic on real hardware.

use super::avxvnni::{sums, EVEX, MADD, VEX};
use super::quant::*;
use super::tests::{close_to_scalar, random_weights, run, TYPES};
use super::{runnable, scalar, vnni_emulator, Isa, QMatrix};
use crate::gguf::GgmlType;
use crate::rng::SplitMix64;
use std::arch::x86_64::*;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Random activations as 8-bit blocks, the first block all +127 (the largest product
/// against a Q8_0 weight of -128).
fn acts(rng: &mut SplitMix64, cols: usize) -> Vec<BlockQ8> {
    let mut x: Vec<f32> = (0..cols).map(|_| rng.signed_f32() * 4.0).collect();
    x[..QK].fill(1.0);
    let mut q = vec![bytemuck::Zeroable::zeroed(); cols / QK];
    scalar::quantize_q8(&x, &mut q);
    q
}

/// `sums::<D>` against `vpdpbusd`'s formula on random bytes (all 256 values of each).
///
/// # Safety
/// The CPU must run avx2, fma, f16c and step `D`'s instruction (or have it emulated).
unsafe fn step_computes_vpdpbusd<const D: u8>() -> Result<(), String> {
    let mut rng = SplitMix64(43);
    for _ in 0..200 {
        let u: [u8; 32] = std::array::from_fn(|_| rng.next_u64() as u8);
        let s: [u8; 32] = std::array::from_fn(|_| rng.next_u64() as u8);
        let mut got = [0u8; 32];
        // SAFETY: 32-byte arrays; the caller guarantees the CPU features.
        unsafe {
            let v = sums::<D>(
                _mm256_loadu_si256(u.as_ptr() as *const __m256i),
                _mm256_loadu_si256(s.as_ptr() as *const __m256i),
            );
            _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, v);
        }
        let want = vnni_emulator::dpbusd([0; 32], u, s, 8);
        if got != want {
            return Err(format!("step {D}: u {u:?} s {s:?}: {got:?}, want {want:?}"));
        }
    }
    Ok(())
}

/// Every AVX2 kernel with an 8-bit dot step gives, with step `D`, the bits it gives
/// with `MADD` (row kernels of the six formats, the packed Q4_1 and Q8_0 tiles, the
/// sixteen-row tiles of every format the AVX2 paths tile).
///
/// # Safety
/// The CPU must run avx2, fma, f16c and step `D`'s instruction (or have it emulated).
unsafe fn kernels_give_the_madd_bits<const D: u8>() -> Result<(), String> {
    use super::avx2;
    let mut rng = SplitMix64(41);
    let (rows, cols) = (4, 576);
    let nb = cols / QK;
    let a: Vec<Vec<BlockQ8>> = (0..3).map(|_| acts(&mut rng, cols)).collect();
    let mut weights = |ty: GgmlType| {
        let mut bytes = random_weights(&mut rng, ty, rows, cols);
        if ty == GgmlType::Q8_0 {
            // Row 0's first block all -128, against activations all +127.
            bytes[2..2 + QK].fill(0x80);
        }
        bytes
    };
    macro_rules! row_kernel {
        ($k:ident, $blk:ty, $ty:expr) => {{
            let bytes = weights($ty);
            let blocks: &[$blk] = bytemuck::cast_slice(&bytes);
            let w: [&[$blk]; 4] = std::array::from_fn(|r| &blocks[r * nb..(r + 1) * nb]);
            let (mut x, mut y) = ([[0f32; 2]; 4], [[0f32; 2]; 4]);
            // SAFETY: the caller guarantees the CPU features.
            unsafe {
                avx2::$k::<MADD, 4, 2>(w, [&a[0], &a[1]], &mut x);
                avx2::$k::<D, 4, 2>(w, [&a[0], &a[1]], &mut y);
            }
            if bits(x.as_flattened()) != bits(y.as_flattened()) {
                return Err(format!("{}, step {D}: {y:?}, want {x:?}", stringify!($k)));
            }
        }};
    }
    row_kernel!(tile_q4_0, BlockQ4_0, GgmlType::Q4_0);
    row_kernel!(tile_q4_1, BlockQ4_1, GgmlType::Q4_1);
    row_kernel!(tile_q5_0, BlockQ5_0, GgmlType::Q5_0);
    row_kernel!(tile_q5_1, BlockQ5_1, GgmlType::Q5_1);
    row_kernel!(tile_q8_0, BlockQ8_0, GgmlType::Q8_0);
    row_kernel!(tile_iq4nl, BlockIq4Nl, GgmlType::IQ4_NL);

    let bytes = weights(GgmlType::Q4_1);
    let b: &[BlockQ4_1] = bytemuck::cast_slice(&bytes);
    let q4: Vec<BlockQ4_1x4> = (0..nb)
        .map(|i| {
            let r = |k: usize| b[k * nb + i];
            BlockQ4_1x4 {
                dm: std::array::from_fn(|k| if k < 4 { r(k).d } else { r(k - 4).m }),
                qs: std::array::from_fn(|k| r(k).qs),
            }
        })
        .collect();
    let (mut x, mut y) = ([[0f32; 3]; 4], [[0f32; 3]; 4]);
    // SAFETY: the caller guarantees the CPU features.
    unsafe {
        avx2::tile_q4_1x4::<MADD, 3>(&q4, [&a[0], &a[1], &a[2]], &mut x);
        avx2::tile_q4_1x4::<D, 3>(&q4, [&a[0], &a[1], &a[2]], &mut y);
    }
    if bits(x.as_flattened()) != bits(y.as_flattened()) {
        return Err(format!("tile_q4_1x4, step {D}: {y:?}, want {x:?}"));
    }

    let bytes = weights(GgmlType::Q8_0);
    let b: &[BlockQ8_0] = bytemuck::cast_slice(&bytes);
    let q8: Vec<BlockQ8_0x4> = (0..nb)
        .map(|i| {
            let r = |k: usize| b[(k % 4) * nb + i];
            BlockQ8_0x4 {
                d: std::array::from_fn(|k| r(k).d),
                qs: std::array::from_fn(|k| {
                    let h = if k < 4 { 0 } else { QK / 2 };
                    std::array::from_fn(|j| r(k).qs[h + j])
                }),
            }
        })
        .collect();
    let (mut x, mut y) = ([[0f32; 2]; 4], [[0f32; 2]; 4]);
    // SAFETY: the caller guarantees the CPU features.
    unsafe {
        avx2::tile_q8_0x4::<MADD, 2>(&q8, [&a[0], &a[1]], &mut x);
        avx2::tile_q8_0x4::<D, 2>(&q8, [&a[0], &a[1]], &mut y);
    }
    if bits(x.as_flattened()) != bits(y.as_flattened()) {
        return Err(format!("tile_q8_0x4, step {D}: {y:?}, want {x:?}"));
    }
    // SAFETY: the caller guarantees the CPU features.
    unsafe { super::tests_tiles16::avx2_tiles16_give_the_madd_bits::<D>() }
}

/// The matmul on the AVX-VNNI path: the AVX2 path's bits for every format, close to
/// the scalar twins, and the same bits for a row alone as in a batch.
fn matmul_gives_the_avx2_bits() -> Result<(), String> {
    let mut rng = SplitMix64(47);
    // Rows past a multiple of four exercise the tails; 37 tokens every tile width.
    let (rows, cols, n) = (30, 768, 37);
    for ty in TYPES {
        // In the AVX2 paths' layout (sixteen-row tiles for Q4_0, Q5_0, IQ4_NL, Q4_K,
        // Q5_K and Q6_K).
        let w = QMatrix::new(ty, rows, cols, &random_weights(&mut rng, ty, rows, cols))
            .unwrap()
            .for_isa(Isa::Avx2);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.signed_f32() * 3.0).collect();
        let a = run(Isa::Avx2, &w, &x, n, 2);
        let b = run(Isa::AvxVnni, &w, &x, n, 2);
        if bits(&a) != bits(&b) {
            return Err(format!("{ty}: the avxvnni matmul differs from avx2"));
        }
        let s = run(Isa::Scalar, &w, &x, n, 1);
        close_to_scalar(&w, &x, n, &s, &b, &format!("{ty} on avxvnni"));
        for t in (0..n).step_by(9) {
            let alone = run(Isa::AvxVnni, &w, &x[t * cols..(t + 1) * cols], 1, 1);
            if bits(&alone) != bits(&b[t * rows..(t + 1) * rows]) {
                return Err(format!("{ty}: token {t} alone differs from the batch"));
            }
        }
    }
    Ok(())
}

/// Everything above on the VEX step; in the emulator's child, it must have emulated.
fn all_checks_on_vex(emulated: bool) -> Result<(), String> {
    // SAFETY: the CPU runs avx2, fma, f16c (checked by the callers) and AVX-VNNI, or
    // the emulator does it.
    unsafe {
        step_computes_vpdpbusd::<VEX>()?;
        kernels_give_the_madd_bits::<VEX>()?;
    }
    matmul_gives_the_avx2_bits()?;
    let count = vnni_emulator::EMULATED.load(std::sync::atomic::Ordering::Relaxed);
    if emulated && count == 0 {
        return Err("the emulator ran no vpdpbusd".into());
    }
    Ok(())
}

#[test]
fn avxvnni_path_gives_the_avx2_bits_natively() {
    if !runnable().contains(&Isa::AvxVnni) {
        let why = if std::arch::is_x86_feature_detected!("avxvnni") {
            "faults on AVX-VNNI"
        } else {
            "does not list AVX-VNNI"
        };
        eprintln!("skipped: this CPU {why} (the emulated test runs the path)");
        return;
    }
    all_checks_on_vex(false).unwrap();
}

#[test]
fn avxvnni_path_gives_the_avx2_bits_under_the_sigill_emulator() {
    if !runnable().contains(&Isa::Avx2) {
        eprintln!("skipped: this CPU does not run the avx2 kernels");
        return;
    }
    if runnable().contains(&Isa::AvxVnni) {
        eprintln!("skipped: this CPU runs AVX-VNNI (the native test covers it)");
        return;
    }
    assert!(
        vnni_emulator::passes_under_the_emulator(|| all_checks_on_vex(true)),
        "the AVX-VNNI path under the SIGILL emulator (its message is on stderr)"
    );
}

#[test]
fn evex_vnni_step_gives_the_avx2_bits_in_every_kernel() {
    if !runnable().contains(&Isa::Avx512) {
        eprintln!("skipped: this CPU does not run the avx512 kernels (EVEX vpdpbusd)");
        return;
    }
    // SAFETY: the AVX-512 path runs only where avx512f/bw/vl/vnni executed.
    unsafe {
        step_computes_vpdpbusd::<EVEX>().unwrap();
        kernels_give_the_madd_bits::<EVEX>().unwrap();
    }
}
