//! What the machine can do, for benchmarks and logs: the kernel ISA folio chose at run
//! time and the memory read bandwidth its threads reach (the ceiling of decode, which
//! reads every weight once per token).

use crate::error::PoolError;
use crate::kernels::{self, ThreadPool};
use std::time::Instant;

/// The kernels in use: "avx512", "avx2" or "scalar" (`FOLIO_ISA` forces one the CPU runs).
pub fn isa_name() -> String {
    kernels::isa().to_string()
}

/// Bytes per second that `threads` threads read from memory (256 MiB, best of 3).
pub fn read_bandwidth(threads: usize) -> Result<f64, PoolError> {
    let threads = threads.max(1);
    let data: Vec<u64> = (0..32 << 20).map(|i| i as u64).collect();
    let pool = ThreadPool::new(threads)?;
    let mut best = 0f64;
    for _ in 0..3 {
        let sums: Vec<std::sync::atomic::AtomicU64> =
            (0..threads).map(|_| Default::default()).collect();
        let t = Instant::now();
        pool.run(&|i| {
            let (a, b) = kernels::pool::share(data.len(), i, threads);
            let s = data[a..b].iter().fold(0u64, |s, &v| s.wrapping_add(v));
            sums[i].store(s, std::sync::atomic::Ordering::Relaxed);
        });
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&sums);
        best = best.max((data.len() * 8) as f64 / secs);
    }
    Ok(best)
}

/// Bytes of memory the OS says are available now (`MemAvailable` in /proc/meminfo),
/// or `None` where that cannot be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
