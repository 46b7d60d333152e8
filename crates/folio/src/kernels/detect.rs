//! Which instruction-set path the kernels take on this CPU.
//!
//! CPUID alone is not trusted for AVX-512: some machines list it and fault on the first
//! zmm instruction (a hypervisor hiding the state, or AMX-style features the OS never
//! enabled). So before the AVX-512 path is chosen, a child process executes one 512-bit
//! VNNI instruction; if the child dies, folio logs it and takes the AVX2 path.

use super::Isa;
use std::sync::OnceLock;

/// The path in use: the best this CPU runs, or `FOLIO_ISA` (`scalar`, `avx2`, `avx512`)
/// when it names one the CPU runs. A name it does not run, or an unknown name, is
/// logged and ignored.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        let Ok(want) = std::env::var("FOLIO_ISA") else {
            return best;
        };
        match parse(&want) {
            Some(isa) if isa <= best => isa,
            Some(isa) => {
                tracing::warn!(wanted = %isa, using = %best, "FOLIO_ISA names a path this CPU cannot run");
                best
            }
            None => {
                tracing::warn!(value = %want, using = %best, "FOLIO_ISA is not scalar, avx2 or avx512: ignored");
                best
            }
        }
    })
}

/// A path by its `FOLIO_ISA` name.
pub fn parse(name: &str) -> Option<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .find(|i| i.name() == name)
}

/// Every path this CPU runs, scalar first (tests run each one).
pub fn runnable() -> Vec<Isa> {
    let best = detect();
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&i| i <= best)
        .collect()
}

/// The best path this CPU runs, ignoring any override (probed once per process).
pub fn detect() -> Isa {
    static BEST: OnceLock<Isa> = OnceLock::new();
    *BEST.get_or_init(probe_best)
}

#[cfg(target_arch = "x86_64")]
fn probe_best() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    if !avx2 {
        return Isa::Scalar;
    }
    let listed = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if !listed {
        return Isa::Avx2;
    }
    // SAFETY: the probe needs avx512f/bw/vl/vnni, which CPUID lists (checked above); it
    // runs in a child process, so a CPU that faults on it kills only the child.
    if runs_in_child(|| unsafe { super::avx512::probe() }) {
        Isa::Avx512
    } else {
        tracing::warn!("the CPU lists AVX-512 VNNI but faults on it: using the AVX2 kernels");
        Isa::Avx2
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe_best() -> Isa {
    Isa::Scalar
}

/// Whether `f` returns normally when run in a forked child (a fault such as SIGILL
/// kills the child only). False where processes cannot be forked.
#[cfg(unix)]
pub(crate) fn runs_in_child(f: impl FnOnce()) -> bool {
    // SAFETY: after fork the child calls only `f` (register-only instructions),
    // setrlimit and _exit, none of which take locks another thread might hold.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // A fault must not leave a core file behind.
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain system calls in the child, on a valid rlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        f();
        // SAFETY: ends the child without running the parent's destructors or atexit.
        unsafe { libc::_exit(0) };
    }
    if pid < 0 {
        return false;
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

#[cfg(not(unix))]
pub(crate) fn runs_in_child(_f: impl FnOnce()) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faulting_instruction_is_caught_in_the_child() {
        assert!(runs_in_child(|| ()));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: ud2 raises SIGILL by definition; it runs in the child only.
        assert!(!runs_in_child(|| unsafe { std::arch::asm!("ud2") }));
    }

    #[test]
    fn names_round_trip() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(parse(isa.name()), Some(isa));
        }
        assert_eq!(parse("sse"), None);
        assert_eq!(runnable()[0], Isa::Scalar);
        assert_eq!(*runnable().last().unwrap(), detect());
        eprintln!("this CPU runs: {:?}", runnable());
    }
}
