//! The 8-bit dot step of the AVX2 matmul kernels, and the AVX-VNNI probe.
//!
//! The AVX2 kernels multiply unsigned by signed bytes and need each 32-bit lane's sum of
//! four adjacent products. AVX2 does that in two instructions (`vpmaddubsw`, pairs to
//! saturating 16-bit sums; `vpmaddwd` by ones, pairs of those to 32 bits); AVX-VNNI's
//! 256-bit `vpdpbusd` (VEX-encoded) does it in one, without any 16-bit step. The
//! kernels take the step as a const parameter `D` ([`MADD`] or [`VEX`]), so both paths
//! are one source.
//!
//! The sums are equal, so the AVX-VNNI path gives the AVX2 path's bits: the 16-bit
//! step never saturates in these kernels (the 32-element formats: Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, IQ4_NL). Its largest pair sum is 2 · 128 · 127 = 32 512 < 32 767: a Q8_0
//! weight of -128 made positive, times an activation, which `quantize_q8` keeps within
//! ±127. (The K-quant row dots keep the AVX2 step on this path; the sixteen-row tiles of
//! `avx2_tiles16` and `avx2_tiles16_more` take `D`, their 16-bit sums bounded in those
//! modules' docs.)
//!
//! `vpdpbusd` is written as assembly, not `_mm256_dpbusd_avx_epi32`: the intrinsic needs
//! the `avxvnni` target feature on the whole kernel, which would mean a second copy of
//! every kernel compiled for other features, where the one generic kernel (compiled
//! for avx2, fma, f16c) now picks its step per instantiation; and the `{vex}` prefix
//! pins the encoding that AVX-VNNI CPUs run (the EVEX form is AVX-512's).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// The AVX2 step: `vpmaddubsw` then `vpmaddwd` by ones.
pub const MADD: u8 = 0;
/// AVX-VNNI's `vpdpbusd ymm` (VEX): only where detection ran it.
pub const VEX: u8 = 1;
/// AVX-512 VNNI's `vpdpbusd ymm` (EVEX, needs avx512vl and avx512vnni): the same
/// operation, which a CPU that faults on the VEX form may run (AMD Zen 4). The AVX-512
/// path's row kernels of the formats without an AVX-512 tile of their own (Q4_0, Q5_0,
/// Q5_1, IQ4_NL, Q8_0 rows) take their 8-bit dots with it: the same bits as AVX2's.
pub const EVEX: u8 = 2;

/// Each 32-bit lane j: Σ_k u[4j+k] · s[4j+k] (u as unsigned bytes, s as signed), with
/// step `D`.
///
/// # Safety
/// The CPU must run avx2, fma, f16c, and the step's instruction ([`VEX`]: avxvnni).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sums<const D: u8>(u: __m256i, s: __m256i) -> __m256i {
    match D {
        VEX => {
            let mut acc = _mm256_setzero_si256();
            // SAFETY: register-only `vpdpbusd`, which the caller guarantees the CPU runs.
            unsafe {
                std::arch::asm!(
                    "{{vex}} vpdpbusd {acc}, {u}, {s}",
                    acc = inout(ymm_reg) acc,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }
        EVEX => {
            let mut acc = _mm256_setzero_si256();
            // SAFETY: register-only `vpdpbusd` (EVEX, ymm0-15 only), which the caller
            // guarantees the CPU runs.
            unsafe {
                std::arch::asm!(
                    "{{evex}} vpdpbusd {acc}, {u}, {s}",
                    acc = inout(ymm_reg) acc,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }
        _ => _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
    }
}

/// `acc` plus [`sums`]`::<D>(u, s)`, wrapping: `vpdpbusd` accumulates in place (the
/// sixteen-row tile kernels' chains, `avx2_tiles16`), `MADD` adds its sums.
///
/// # Safety
/// As [`sums`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn sums_add<const D: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let mut acc = acc;
    match D {
        VEX => {
            // SAFETY: register-only `vpdpbusd`, which the caller guarantees the CPU runs.
            unsafe {
                std::arch::asm!(
                    "{{vex}} vpdpbusd {acc}, {u}, {s}",
                    acc = inout(ymm_reg) acc,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }
        EVEX => {
            // SAFETY: register-only `vpdpbusd` (EVEX, ymm0-15 only), which the caller
            // guarantees the CPU runs.
            unsafe {
                std::arch::asm!(
                    "{{evex}} vpdpbusd {acc}, {u}, {s}",
                    acc = inout(ymm_reg) acc,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }
        // SAFETY: the same features as this function.
        _ => _mm256_add_epi32(acc, unsafe { sums::<D>(u, s) }),
    }
}

/// Runs one VEX `vpdpbusd` (and a ymm xor): `detect` executes this in a child process
/// before counting the AVX-VNNI path as runnable.
///
/// # Safety
/// The CPU must list avx and avxvnni (it may still fault: hence the child).
#[target_feature(enable = "avx2")]
pub unsafe fn probe() {
    // SAFETY: register-only instructions of the features this function requires.
    unsafe {
        std::arch::asm!(
            "vpxor {y}, {y}, {y}",
            "{{vex}} vpdpbusd {y}, {y}, {y}",
            y = out(ymm_reg) _,
            options(nomem, nostack, preserves_flags),
        );
    }
}
