//! What the machine can do, for benchmarks and logs: the kernel ISA folio chose at run
//! time and the memory read bandwidth its threads reach (the ceiling of decode, which
//! reads every weight once per token).

use crate::error::PoolError;
use crate::kernels::{self, ThreadPool};
use std::time::Instant;

/// The kernels in use: "avx512", "avxvnni", "avx2" or "scalar" (`FOLIO_ISA` forces one
/// the CPU runs).
pub fn isa_name() -> String {
    kernels::isa().to_string()
}

/// Bytes per second that `threads` threads read from memory (256 MiB, the best of 3
/// rounds of a plain fold and of [`kernels::stream_sum`], which prefetches far ahead).
pub fn read_bandwidth(threads: usize) -> Result<f64, PoolError> {
    let threads = threads.max(1);
    let data: Vec<u64> = (0..32 << 20).map(|i| i as u64).collect();
    let pool = ThreadPool::new(threads)?;
    let mut best = 0f64;
    for _ in 0..3 {
        for prefetched in [false, true] {
            let sums: Vec<std::sync::atomic::AtomicU64> =
                (0..threads).map(|_| Default::default()).collect();
            let t = Instant::now();
            pool.run(&|i| {
                let (a, b) = kernels::pool::share(data.len(), i, threads);
                let s = if prefetched {
                    kernels::stream_sum(&data[a..b])
                } else {
                    data[a..b].iter().fold(0u64, |s, &v| s.wrapping_add(v))
                };
                sums[i].store(s, std::sync::atomic::Ordering::Relaxed);
            });
            let secs = t.elapsed().as_secs_f64();
            std::hint::black_box(&sums);
            best = best.max((data.len() * 8) as f64 / secs);
        }
    }
    Ok(best)
}

/// This process's resident memory in bytes: (now, the peak so far), from
/// /proc/self/status (`VmRSS`, `VmHWM`); `None` where it cannot be read.
pub fn resident_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Bytes of memory this process can still take: what the OS says is available
/// (`MemAvailable` in /proc/meminfo), or less where a cgroup (a container's memory
/// limit) leaves less room; `None` where neither can be read. A pool sized past it
/// would be killed by the OOM killer once its pages are touched, so it is refused.
pub fn available_memory() -> Option<u64> {
    match (meminfo_available(), cgroup_room()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Room left under the tightest cgroup memory limit above this process (the limit
/// minus the usage, for the process's own group and each ancestor): cgroup v2
/// (`memory.max`, `memory.current`) or v1's memory controller
/// (`memory.limit_in_bytes`, `memory.usage_in_bytes`). `None` when nothing can be read.
fn cgroup_room() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // "0::/path" is v2; "N:memory:/path" (or a list holding memory) is v1's controller.
    let (root, rel, files) = own
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == "memory") {
                Some((
                    "/sys/fs/cgroup/memory",
                    path,
                    ["memory.limit_in_bytes", "memory.usage_in_bytes"],
                ))
            } else {
                None
            }
        })
        .or_else(|| {
            let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            Some(("/sys/fs/cgroup", path, ["memory.max", "memory.current"]))
        })?;
    let root = std::path::Path::new(root);
    let mut dir = root.join(rel.trim().trim_start_matches('/'));
    let read = |d: &std::path::Path, f: &str| -> Option<u64> {
        std::fs::read_to_string(d.join(f)).ok()?.trim().parse().ok()
    };
    let mut room: Option<u64> = None;
    loop {
        // v2's "max" (no limit) does not parse, and is skipped.
        if let (Some(max), Some(cur)) = (read(&dir, files[0]), read(&dir, files[1])) {
            let r = max.saturating_sub(cur);
            room = Some(room.map_or(r, |x| x.min(r)));
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return room;
        }
    }
}
