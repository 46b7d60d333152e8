//! Test-only: lets a CPU that faults on AVX-VNNI run the AVX-VNNI kernels, by catching
//! the SIGILL of each `vpdpbusd` and doing its arithmetic on the saved registers.
//!
//! No emulator at hand runs AVX-VNNI (QEMU's TCG, 10.0 and 11.1, and Valgrind 3.27
//! fault on it; Intel's SDE is not reachable here), and AMD Zen 4 lists AVX-512 VNNI
//! but not the VEX form. The kernels write `vpdpbusd` in one form only (assembly,
//! register operands: `avxvnni::sums`), so this decodes that form and nothing else:
//! `C4 RXB.00010 0.vvvv.L.01 50 /r` with mod = 11. Anything else is not emulated (the
//! handler steps aside and the instruction faults as before).
//!
//! The handler is process-wide: install it only in a forked child (`detect`'s probes,
//! run in children of a process with it installed, would otherwise pass).
//!
//! Registers come from the signal frame: xmm0-15 in the FXSAVE area (byte 160 on),
//! their upper halves in the XSAVE area's YMM component, the upper halves of zmm0-15
//! (AVX-512 machines; a VEX instruction zeroes them) in its ZMM_Hi256 component, at the
//! offsets CPUID leaf 0xD gives (Linux writes signal frames in XSAVE's standard format).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

/// How many instructions the handler has emulated.
pub(crate) static EMULATED: AtomicU64 = AtomicU64::new(0);

/// `FP_XSTATE_MAGIC1`: the signal frame holds an XSAVE area, not only FXSAVE's.
const MAGIC1: u32 = 0x4650_5853;

/// Installs the handler (for the whole process: call it in a forked child only).
pub(crate) fn install() {
    // SAFETY: a zeroed sigaction is valid; the handler has the SA_SIGINFO signature.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigill as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGILL, &sa, std::ptr::null_mut()), 0);
    }
}

/// The operands of a register-form VEX `vpdpbusd`: (destination, unsigned source,
/// signed source, 256-bit).
fn decode(b: &[u8; 5]) -> Option<(usize, usize, usize, bool)> {
    let ok = b[0] == 0xC4
        && b[1] & 0x1F == 0x02 // map 0F38
        && b[2] & 0x83 == 0x01 // W0, pp = 66
        && b[3] == 0x50
        && b[4] >> 6 == 3; // register operand
    if !ok {
        return None;
    }
    let r = usize::from((!b[1] >> 7) & 1);
    let bx = usize::from((!b[1] >> 5) & 1);
    let dst = r << 3 | usize::from((b[4] >> 3) & 7);
    let src2 = bx << 3 | usize::from(b[4] & 7);
    let src1 = usize::from((!b[2] >> 3) & 0xF);
    Some((dst, src1, src2, b[2] & 0x04 != 0))
}

/// `vpdpbusd`'s arithmetic on 32-byte registers: lane j of `acc` plus the four
/// products of `u`'s (unsigned) and `s`'s (signed) bytes 4j..4j+4, wrapping.
pub(crate) fn dpbusd(acc: [u8; 32], u: [u8; 32], s: [u8; 32], lanes: usize) -> [u8; 32] {
    let mut out = [0u8; 32];
    for j in 0..lanes {
        let a = i32::from_le_bytes(acc[4 * j..4 * j + 4].try_into().unwrap());
        let p: i32 = (4 * j..4 * j + 4)
            .map(|k| i32::from(u[k]) * i32::from(s[k] as i8))
            .sum();
        out[4 * j..4 * j + 4].copy_from_slice(&a.wrapping_add(p).to_le_bytes());
    }
    out
}

/// The XSAVE offset of state component `i` (CPUID.(0xD, i).EBX).
fn component_offset(i: u32) -> usize {
    std::arch::x86_64::__cpuid_count(0xD, i).ebx as usize
}

/// Stops emulating: the instruction runs again and faults with the default action.
fn step_aside() {
    // SAFETY: resetting a signal's disposition is async-signal-safe.
    unsafe { libc::signal(libc::SIGILL, libc::SIG_DFL) };
}

extern "C" fn on_sigill(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid ucontext for SA_SIGINFO handlers; the
    // instruction bytes at RIP are mapped (they just faulted as an instruction); the
    // FP area is the frame's XSAVE image (magic checked) of at least the size it gives.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let rip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
        let code = *(rip as *const [u8; 5]);
        let Some((dst, src1, src2, wide)) = decode(&code) else {
            return step_aside();
        };
        let fp = uc.uc_mcontext.fpregs as *mut u8;
        if fp.is_null() {
            return step_aside();
        }
        let magic = (fp.add(464) as *const u32).read_unaligned();
        let size = (fp.add(480) as *const u32).read_unaligned() as usize;
        let (ymm, zmm) = (component_offset(2), component_offset(6));
        if magic != MAGIC1 || size < ymm + 256 {
            return step_aside();
        }
        let bv = fp.add(512) as *mut u64;
        // A component whose XSTATE_BV bit is clear is in its initial state (zeros),
        // whatever its area holds: make it explicit before setting the bit.
        if bv.read_unaligned() & 2 == 0 {
            std::ptr::write_bytes(fp.add(160), 0, 256);
        }
        if bv.read_unaligned() & 4 == 0 {
            std::ptr::write_bytes(fp.add(ymm), 0, 256);
        }
        let read = |i: usize| {
            let mut v = [0u8; 32];
            std::ptr::copy_nonoverlapping(fp.add(160 + 16 * i), v.as_mut_ptr(), 16);
            std::ptr::copy_nonoverlapping(fp.add(ymm + 16 * i), v.as_mut_ptr().add(16), 16);
            v
        };
        let out = dpbusd(read(dst), read(src1), read(src2), if wide { 8 } else { 4 });
        std::ptr::copy_nonoverlapping(out.as_ptr(), fp.add(160 + 16 * dst), 16);
        std::ptr::copy_nonoverlapping(out.as_ptr().add(16), fp.add(ymm + 16 * dst), 16);
        bv.write_unaligned(bv.read_unaligned() | 6);
        // A VEX instruction zeroes bits 256 and up of its destination.
        if bv.read_unaligned() & (1 << 6) != 0 && size >= zmm + 512 {
            std::ptr::write_bytes(fp.add(zmm + 32 * dst), 0, 32);
        }
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] = (rip + 5) as i64;
        EMULATED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `f` in a forked child with the emulator installed; its outcome (how many
/// instructions it emulated, or its error or panic) is written to stderr there. True if
/// it passed.
pub(crate) fn passes_under_the_emulator(f: fn() -> Result<(), String>) -> bool {
    super::detect::runs_in_child(|| {
        install();
        let (passed, msg) = match std::panic::catch_unwind(f) {
            Ok(Ok(())) => {
                let n = EMULATED.load(Ordering::Relaxed);
                (true, format!("{n} vpdpbusd emulated, all checks passed"))
            }
            Ok(Err(e)) => (false, e),
            Err(p) => (
                false,
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        };
        let msg = format!("emulated avxvnni: {msg}\n");
        // SAFETY: writes a valid buffer to stderr (no lock: the child of a threaded
        // process), then ends a failed child.
        unsafe {
            libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
            if !passed {
                libc::_exit(1);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_register_forms_only() {
        // vpdpbusd ymm1, ymm0, ymm2 (as the assembler writes it), and with ymm8-15.
        assert_eq!(
            decode(&[0xC4, 0xE2, 0x7D, 0x50, 0xCA]),
            Some((1, 0, 2, true))
        );
        assert_eq!(
            decode(&[0xC4, 0x42, 0x35, 0x50, 0xC2]),
            Some((8, 9, 10, true))
        );
        // The 128-bit form.
        assert_eq!(
            decode(&[0xC4, 0xE2, 0x79, 0x50, 0xCA]),
            Some((1, 0, 2, false))
        );
        // A memory operand, `vpdpbusds` (0x51), W1.
        assert_eq!(decode(&[0xC4, 0xE2, 0x7D, 0x50, 0x0A]), None);
        assert_eq!(decode(&[0xC4, 0xE2, 0x7D, 0x51, 0xCA]), None);
        assert_eq!(decode(&[0xC4, 0xE2, 0xFD, 0x50, 0xCA]), None);
    }
}
