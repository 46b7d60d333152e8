//! Which instruction-set path the kernels take on this CPU.
//!
//! CPUID alone is not trusted for the VNNI paths: some machines list an extension and
//! fault on it (a hypervisor hiding the state, features the OS never enabled, or an
//! emulator that lists more than it runs). So before the AVX-512 or the AVX-VNNI path
//! is counted as runnable, a child process executes one of its instructions; if the
//! child dies, folio logs it and leaves that path out. The paths are not a ladder: an
//! AMD Zen 4 runs AVX-512 VNNI but faults on AVX-VNNI (its VEX form), so the set of
//! paths that ran is kept, not only the best one.

use super::Isa;
use std::sync::OnceLock;

/// Every path, in `Isa` order.
const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512];

/// The path in use: the best this CPU runs, or `FOLIO_ISA` (`scalar`, `avx2`,
/// `avxvnni`, `avx512`) when it names one the CPU runs. A name it does not run is
/// logged and replaced by the best path it runs below that one ([`runnable_at_most`]);
/// an unknown name is logged and ignored.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        let Ok(want) = std::env::var("FOLIO_ISA") else {
            return best;
        };
        match parse(&want) {
            Some(isa) => runnable_at_most(isa),
            None => {
                tracing::warn!(value = %want, using = %best, "FOLIO_ISA is not scalar, avx2, avxvnni or avx512: ignored");
                best
            }
        }
    })
}

/// `want` if this CPU runs it; else the best path it runs that is below `want` (for
/// `avxvnni` on a CPU without it, `avx2`: the same bits), with a log line. Never a
/// path that did not run here.
pub fn runnable_at_most(want: Isa) -> Isa {
    let got = at_most(want, &runnable());
    if got != want {
        tracing::warn!(wanted = %want, using = %got, "this CPU cannot run the kernel path");
    }
    got
}

/// The best of `runnable` (which holds `Scalar`) that is at most `want`.
fn at_most(want: Isa, runnable: &[Isa]) -> Isa {
    runnable
        .iter()
        .copied()
        .filter(|&i| i <= want)
        .max()
        .unwrap_or(Isa::Scalar)
}

/// A path by its `FOLIO_ISA` name.
pub fn parse(name: &str) -> Option<Isa> {
    ALL.into_iter().find(|i| i.name() == name)
}

/// Every path this CPU runs, scalar first (tests run each one): only paths whose
/// instructions executed here.
pub fn runnable() -> Vec<Isa> {
    static RUNS: OnceLock<Vec<Isa>> = OnceLock::new();
    RUNS.get_or_init(probe).clone()
}

/// The best path this CPU runs, ignoring any override (probed once per process).
pub fn detect() -> Isa {
    *runnable().last().expect("scalar always runs")
}

#[cfg(target_arch = "x86_64")]
fn probe() -> Vec<Isa> {
    let mut runs = vec![Isa::Scalar];
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    if !avx2 {
        return runs;
    }
    runs.push(Isa::Avx2);
    if is_x86_feature_detected!("avxvnni") {
        // SAFETY: the probe's one VEX instruction needs avxvnni, which CPUID lists
        // (checked above); it runs in a child process, so a CPU that faults on it kills
        // only the child.
        if runs_in_child(|| unsafe { super::avxvnni::probe() }) {
            runs.push(Isa::AvxVnni);
        } else {
            tracing::warn!(
                "the CPU lists AVX-VNNI but faults on it: not using the AVX-VNNI kernels"
            );
        }
    }
    let listed = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if listed {
        // SAFETY: the probe needs avx512f/bw/vl/vnni, which CPUID lists (checked
        // above); it runs in a child process, so a CPU that faults on it kills only the
        // child.
        if runs_in_child(|| unsafe { super::avx512::probe() }) {
            runs.push(Isa::Avx512);
        } else {
            tracing::warn!(
                "the CPU lists AVX-512 VNNI but faults on it: not using the AVX-512 kernels"
            );
        }
    }
    runs
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> Vec<Isa> {
    vec![Isa::Scalar]
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
        for isa in ALL {
            assert_eq!(parse(isa.name()), Some(isa));
        }
        assert_eq!(parse("sse"), None);
        assert_eq!(runnable()[0], Isa::Scalar);
        assert_eq!(*runnable().last().unwrap(), detect());
        eprintln!("this CPU runs: {:?}", runnable());
    }

    /// A Zen 4 runs AVX-512 but not AVX-VNNI: asking it for `avxvnni` gives the AVX2
    /// path (the same bits), never a path that did not run; a path that ran is kept.
    #[test]
    fn a_wanted_path_that_did_not_run_falls_back_to_the_best_below_it() {
        let zen4 = [Isa::Scalar, Isa::Avx2, Isa::Avx512];
        assert_eq!(at_most(Isa::AvxVnni, &zen4), Isa::Avx2);
        assert_eq!(at_most(Isa::Avx512, &zen4), Isa::Avx512);
        assert_eq!(at_most(Isa::Avx2, &zen4), Isa::Avx2);
        let avx2_only = [Isa::Scalar, Isa::Avx2];
        assert_eq!(at_most(Isa::Avx512, &avx2_only), Isa::Avx2);
        assert_eq!(at_most(Isa::AvxVnni, &avx2_only), Isa::Avx2);
        let vnni = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni];
        assert_eq!(at_most(Isa::AvxVnni, &vnni), Isa::AvxVnni);
        assert_eq!(at_most(Isa::Avx512, &vnni), Isa::AvxVnni);
        assert_eq!(at_most(Isa::Scalar, &vnni), Isa::Scalar);
        for isa in ALL {
            assert!(runnable().contains(&runnable_at_most(isa)));
        }
    }
}
