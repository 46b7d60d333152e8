//! A persistent thread pool for the forward pass: `run(f)` calls `f(i)` once for each
//! task index `i` in `0..threads()` and returns when all have returned.
//!
//! Why not rayon: a decode step has ~150 parallel regions of a few microseconds each, so
//! the cost of one region matters: on a quiet machine a region is one store to publish
//! it, one claim per task and one counter to wait on, with no system call.
//!
//! Why it degrades gracefully when threads outnumber free cores (more threads than
//! cores, or a busy neighbour process):
//! - Task indices are claimed, not assigned: the caller and every awake worker take the
//!   next unclaimed index from one counter, so a worker that is descheduled (or never
//!   woke) does not hold a region up: whoever runs takes its task. Which thread runs
//!   index `i` never changes what `f(i)` computes.
//! - Waiting is bounded: a worker waiting for the next region, and the caller waiting
//!   for the last task, spin for [`SPIN`], then yield [`YIELDS`] times, then park. A
//!   parked worker is woken (unparked) when a region is published; the caller by the
//!   worker that finishes the last task.
//! - At most `available_parallelism - 1` workers are awake at once (the caller is the
//!   other core): excess workers park and no more are woken, and users split work into
//!   [`ThreadPool::parallelism`] shares, so `--threads 64` on two cores runs like two
//!   threads instead of 64 spinning ones.
//!
//! Threads are capped at [`MAX_THREADS`] ([`PoolError::TooManyThreads`]), and a failed
//! spawn is [`PoolError::Spawn`], not a panic.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

pub use crate::error::PoolError;

/// The most threads a pool may have; more is [`PoolError::TooManyThreads`].
pub const MAX_THREADS: usize = 1024;

/// How long a waiting thread spins before it starts yielding, then parks. A park and
/// unpark round trip costs several times the gap between one token's parallel
/// regions, and a decode region only a few times that round trip (docs/BENCHMARKS.md):
/// spinning this long keeps workers awake through a token and parks them between
/// requests, or while the caller is descheduled.
pub const SPIN: Duration = Duration::from_micros(100);
/// `yield_now` calls after spinning and before parking.
pub const YIELDS: u32 = 8;

type Job = &'static (dyn Fn(usize) + Sync);

/// One cache line, so that counters written by different threads do not share one.
#[repr(align(64))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The current region, in one cache line: whoever claims a task reads the job next.
#[repr(align(64))]
struct Region {
    /// The next unclaimed task index; `>= n` when all are claimed.
    next: AtomicUsize,
    /// Points at `run`'s reference to the region's job (dangling between regions, when
    /// no task can be claimed).
    job: AtomicPtr<Job>,
}

/// The end of the current region, in one cache line: whoever counts a task done reads
/// whether the caller sleeps.
#[repr(align(64))]
struct Finish {
    /// Tasks of the region that have returned.
    done: AtomicUsize,
    /// The caller of `run` parked waiting for the last task.
    caller_parked: AtomicBool,
}

/// A worker's parking place.
#[repr(align(64))]
struct Slot {
    /// Set by the worker before it parks; cleared by whoever wakes it (or by the worker
    /// itself if it finds work before parking). Whoever clears it counts the worker awake.
    parked: AtomicBool,
    thread: OnceLock<Thread>,
}

struct Shared {
    /// Tasks per region (the caller counts as one thread).
    n: usize,
    /// The most workers awake at once: one fewer than the cores (the caller is the other).
    cap: usize,
    /// The current region: its next unclaimed task and its job.
    region: Region,
    /// Tasks of the current region that have returned.
    finish: Finish,
    /// Workers not parked.
    awake: Padded<AtomicUsize>,
    /// One parking place per worker.
    slots: Box<[Slot]>,
    /// The caller of `run`, parked waiting for the last task.
    waiter: Mutex<Option<Thread>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
}

/// A fixed set of worker threads.
pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

/// The cores this process may run on (1 where that cannot be told).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl ThreadPool {
    /// A pool of `n` threads in all (the caller counts as one); 0 counts as 1. More than
    /// [`MAX_THREADS`] is refused; more than the available cores is allowed (a warning
    /// is logged once), but only as many as there are cores are awake at once.
    pub fn new(n: usize) -> Result<Self, PoolError> {
        if n > MAX_THREADS {
            return Err(PoolError::TooManyThreads {
                requested: n,
                limit: MAX_THREADS,
            });
        }
        let n = n.max(1);
        let cores = cores();
        if n > cores {
            static WARN: Once = Once::new();
            WARN.call_once(|| {
                tracing::warn!(
                    threads = n,
                    cores,
                    "more threads than available cores: at most {cores} run at once"
                );
            });
        }
        let shared = Arc::new(Shared {
            n,
            cap: (cores - 1).clamp(1, n.max(2) - 1),
            region: Region {
                next: AtomicUsize::new(n),
                job: AtomicPtr::new(std::ptr::null_mut()),
            },
            finish: Finish {
                done: AtomicUsize::new(n),
                caller_parked: AtomicBool::new(false),
            },
            awake: Padded(AtomicUsize::new(n - 1)),
            slots: (1..n)
                .map(|_| Slot {
                    parked: AtomicBool::new(false),
                    thread: OnceLock::new(),
                })
                .collect(),
            waiter: Mutex::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let mut pool = Self {
            n,
            shared,
            workers: Vec::with_capacity(n - 1),
            run_lock: Mutex::new(()),
        };
        for w in 0..n - 1 {
            let s = pool.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("folio-worker-{}", w + 1))
                .spawn(move || worker(w, &s));
            match spawned {
                Ok(h) => pool.workers.push(h),
                // Dropping the pool stops the workers already started.
                Err(error) => {
                    return Err(PoolError::Spawn {
                        index: w + 1,
                        error,
                    })
                }
            }
        }
        Ok(pool)
    }

    /// Number of task indices per region (threads, the caller included).
    pub fn threads(&self) -> usize {
        self.n
    }

    /// How many threads run at once: `threads()`, or fewer when it exceeds the cores.
    /// Work is best split into this many shares (one per task below it; tasks above
    /// it have nothing to do): more shares than running threads leave each thread
    /// several shares, whose weights it no longer reads in one ascending stream, and
    /// decode ran ~1.6x slower so with 8 threads on 2 cores.
    pub fn parallelism(&self) -> usize {
        (self.shared.cap + 1).min(self.n)
    }

    /// Runs `f(i)` for every i in 0..threads(), in parallel, and waits for all of them.
    /// Any thread of the pool may run any index (the caller too), each exactly once.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n == 1 {
            f(0);
            return;
        }
        let _one_at_a_time = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the 'static lifetime is a lie told only to the workers: a worker reads
        // the job (and calls it) only after claiming a task of this region, and this
        // function does not return (nor `f` end) until `done` says every task of the
        // region has returned. Once all are claimed, nothing reads the stale pointer.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        s.region.job.store((&job as *const Job).cast_mut(), Relaxed);
        s.finish.done.store(0, Relaxed);
        // Publishes the region (the release makes `job` and `done` visible to whoever
        // claims from it); SeqCst pairs with a parking worker's (see `Shared::park`).
        s.region.next.store(0, SeqCst);
        let awake = s.awake.load(SeqCst);
        for _ in awake..s.cap {
            if !s.wake_one() {
                break;
            }
        }
        let mut first_panic = None;
        while let Some(k) = s.claim() {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(k))) {
                first_panic.get_or_insert(p);
            }
            s.finish_task();
        }
        s.wait_done();
        let worker_panicked = s.panicked.load(Relaxed) && s.panicked.swap(false, SeqCst);
        if let Some(p) = first_panic {
            std::panic::resume_unwind(p);
        }
        if worker_panicked {
            panic!("a folio worker thread panicked");
        }
    }
}

/// Spins, then yields, until `ready()` or the budget is spent; returns whether it is.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) || start.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            break;
        }
    }
    for _ in 0..YIELDS {
        std::thread::yield_now();
        if ready() {
            return true;
        }
    }
    false
}

impl Shared {
    /// Whether the current region has an unclaimed task.
    fn has_work(&self) -> bool {
        self.region.next.load(Acquire) < self.n
    }

    /// Claims the next task of the current region, if any. A claim is valid for
    /// whatever region is current when it lands (the counter only grows within one).
    fn claim(&self) -> Option<usize> {
        if !self.has_work() {
            return None;
        }
        let k = self.region.next.fetch_add(1, AcqRel);
        (k < self.n).then_some(k)
    }

    /// Counts a task as returned; the last one wakes a parked caller.
    fn finish_task(&self) {
        if self.finish.done.fetch_add(1, SeqCst) + 1 == self.n
            && self.finish.caller_parked.load(SeqCst)
        {
            if let Some(t) = &*self.waiter.lock().unwrap_or_else(|e| e.into_inner()) {
                t.unpark();
            }
        }
    }

    /// The caller waits until every task of the region has returned.
    fn wait_done(&self) {
        let all = || self.finish.done.load(Acquire) == self.n;
        if spin_until(all) {
            return;
        }
        *self.waiter.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
        // SeqCst on both sides (here and `finish_task`): either the last task sees the
        // flag and unparks, or this load sees its count.
        self.finish.caller_parked.store(true, SeqCst);
        while self.finish.done.load(SeqCst) != self.n {
            std::thread::park();
        }
        self.finish.caller_parked.store(false, SeqCst);
    }

    /// Wakes one parked worker; false when none is parked.
    fn wake_one(&self) -> bool {
        for slot in self.slots.iter() {
            if slot.parked.load(Relaxed) && slot.parked.swap(false, SeqCst) {
                self.awake.fetch_add(1, SeqCst);
                if let Some(t) = slot.thread.get() {
                    t.unpark();
                }
                return true;
            }
        }
        false
    }

    /// Worker `w` parks until woken; returns at once if work appears while it lies down.
    fn park(&self, w: usize) {
        let slot = &self.slots[w];
        slot.parked.store(true, SeqCst);
        self.awake.fetch_sub(1, SeqCst);
        // SeqCst pairs with `run` (publish, then read `awake`): either this sees the new
        // region, or `run` sees this worker asleep and may wake it.
        if self.has_work() || self.shutdown.load(SeqCst) {
            if slot.parked.swap(false, SeqCst) {
                self.awake.fetch_add(1, SeqCst);
            }
            return;
        }
        while slot.parked.load(SeqCst) && !self.shutdown.load(SeqCst) {
            std::thread::park();
        }
    }
}

fn worker(w: usize, s: &Shared) {
    let _ = s.slots[w].thread.set(std::thread::current());
    loop {
        while let Some(k) = s.claim() {
            let job = s.region.job.load(Acquire);
            // SAFETY: a claimed task keeps its region open (`run` waits for `done`), so
            // `job` points at `run`'s live reference to this region's job.
            let job = unsafe { *job };
            if catch_unwind(AssertUnwindSafe(|| job(k))).is_err() {
                s.panicked.store(true, SeqCst);
            }
            s.finish_task();
        }
        if s.shutdown.load(Acquire) {
            return;
        }
        // A worker beyond the cap parks at once; the others wait a while first. (The
        // spin reads only the region's line; `park` checks for shutdown.)
        let excess = s.awake.load(Relaxed) > s.cap;
        if excess || !spin_until(|| s.has_work()) {
            s.park(w);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, SeqCst);
        for (slot, w) in s.slots.iter().zip(&self.workers) {
            slot.parked.store(false, SeqCst);
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl ThreadPool {
    /// Row-wise work over `out` (rows of `width` elements): `f(first_row, rows)` runs on
    /// chunks of contiguous rows, each claimed by whichever thread is free (a few chunks
    /// per thread, so that a descheduled thread holds back little), or once on this
    /// thread when there are fewer than `min_rows` rows (a parallel region costs more
    /// than small work). Each row is handled by exactly one call, so the results do not
    /// depend on the split.
    pub fn rows_mut<T: Send>(
        &self,
        out: &mut [T],
        width: usize,
        min_rows: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        assert!(width > 0 && out.len().is_multiple_of(width));
        let rows = out.len() / width;
        let mut parts = Vec::new();
        let mut rest = out;
        for (a, b) in self.row_chunks(rows, min_rows) {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut((b - a) * width);
            parts.push((a, mine));
            rest = tail;
        }
        self.each(parts, &|(first, part)| f(first, part));
    }

    /// How [`rows_mut`](Self::rows_mut) splits `rows` rows: one chunk (this thread)
    /// under `min_rows` rows or on one thread, else a few chunks per thread, so that a
    /// descheduled thread holds back little. `(first, end)` of each.
    pub fn row_chunks(&self, rows: usize, min_rows: usize) -> Vec<(usize, usize)> {
        let chunks = if self.n == 1 || rows < min_rows.max(2) {
            1
        } else {
            rows.min(self.parallelism() * 4)
        };
        (0..chunks).map(|c| share(rows, c, chunks)).collect()
    }

    /// Calls `f` once on each of `parts`, each claimed by whichever thread is free (on
    /// this thread alone when there is at most one part).
    pub fn each<P: Send>(&self, mut parts: Vec<P>, f: &(dyn Fn(P) + Sync)) {
        if parts.len() <= 1 {
            return parts.pop().into_iter().for_each(f);
        }
        let parts: Vec<Mutex<Option<P>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
        let next = AtomicUsize::new(0);
        self.run(&|_| loop {
            let c = next.fetch_add(1, Relaxed);
            let Some(part) = parts.get(c) else {
                return;
            };
            let part = part.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(p) = part {
                f(p);
            }
        });
    }
}

/// A task's list of work items `0..n`: its task pops from the front, a task that has
/// run out of its own work pops from the back or the front (matmul: the front, so
/// that it reads weights in ascending order); front and back live in one atomic
/// word, so each item is taken exactly once. Which thread runs an item must not change
/// what it computes (every user writes each output from one item only). One per cache
/// line, so that threads claiming from their own lists do not contend.
#[repr(align(64))]
pub struct WorkList(std::sync::atomic::AtomicU64);

impl WorkList {
    pub fn new(n: usize) -> Self {
        Self(std::sync::atomic::AtomicU64::new((n as u64) << 32))
    }

    fn take(&self, front: bool) -> Option<usize> {
        use std::sync::atomic::Ordering::*;
        let mut cur = self.0.load(Relaxed);
        loop {
            let (f, b) = (cur & 0xffff_ffff, cur >> 32);
            if f >= b {
                return None;
            }
            let (new, k) = if front {
                (cur + 1, f)
            } else {
                (cur - (1 << 32), b - 1)
            };
            match self.0.compare_exchange_weak(cur, new, AcqRel, Relaxed) {
                Ok(_) => return Some(k as usize),
                Err(now) => cur = now,
            }
        }
    }

    pub fn pop_front(&self) -> Option<usize> {
        self.take(true)
    }

    pub fn pop_back(&self) -> Option<usize> {
        self.take(false)
    }
}

/// The contiguous share `[start, end)` of `total` items that thread `i` of `n` takes.
pub fn share(total: usize, i: usize, n: usize) -> (usize, usize) {
    (total * i / n, total * (i + 1) / n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_once_per_region() {
        let pool = ThreadPool::new(3).unwrap();
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i| {
                hits[i].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
        }
    }

    #[test]
    fn more_threads_than_cores_run_many_small_regions_quickly() {
        let cores = cores();
        for n in [3, 8, 2 * cores, (8 * cores).min(MAX_THREADS)] {
            let pool = ThreadPool::new(n).unwrap();
            let sums: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            let start = Instant::now();
            for r in 1..=1000u64 {
                pool.run(&|i| {
                    sums[i].fetch_add(r * (i as u64 + 1), Relaxed);
                });
            }
            let took = start.elapsed();
            for (i, s) in sums.iter().enumerate() {
                assert_eq!(s.load(SeqCst), 500_500 * (i as u64 + 1), "{n} threads");
            }
            assert!(
                took < Duration::from_secs(2),
                "{n} threads on {cores} cores: 1000 regions took {took:?}"
            );
        }
    }

    #[test]
    fn parked_workers_take_part_when_work_returns() {
        let pool = ThreadPool::new(2).unwrap();
        pool.run(&|_| {});
        // Long enough for the worker to spin, yield and park.
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..3 {
            // Each task waits for the other to start: only two threads at once finish.
            let started: Vec<AtomicBool> = (0..2).map(|_| AtomicBool::new(false)).collect();
            let met = AtomicUsize::new(0);
            pool.run(&|i| {
                started[i].store(true, SeqCst);
                let t = Instant::now();
                while !started[1 - i].load(SeqCst) && t.elapsed() < Duration::from_secs(5) {
                    std::thread::yield_now();
                }
                if started[1 - i].load(SeqCst) {
                    met.fetch_add(1, SeqCst);
                }
            });
            assert_eq!(met.load(SeqCst), 2);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn too_many_threads_is_an_error_naming_the_limit() {
        for n in [MAX_THREADS + 1, 100_000_000] {
            match ThreadPool::new(n) {
                Err(e @ PoolError::TooManyThreads { requested, limit }) => {
                    assert_eq!((requested, limit), (n, MAX_THREADS));
                    assert!(e.to_string().contains(&MAX_THREADS.to_string()), "{e}");
                }
                other => panic!("{n} threads: {:?}", other.map(|p| p.threads())),
            }
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_still_runs() {
        let pool = ThreadPool::new(3).unwrap();
        for bad in 0..3 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|i| assert_ne!(i, bad, "task {i} fails"));
            }));
            assert!(r.is_err(), "task {bad} panicked but run returned");
            let hits = AtomicUsize::new(0);
            pool.run(&|_| {
                hits.fetch_add(1, SeqCst);
            });
            assert_eq!(hits.load(SeqCst), 3);
        }
    }

    #[test]
    fn shares_cover_everything_once() {
        for total in [0, 1, 7, 100] {
            for n in 1..5 {
                let mut next = 0;
                for i in 0..n {
                    let (a, b) = share(total, i, n);
                    assert_eq!(a, next);
                    next = b;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn work_lists_hand_out_every_item_once() {
        let pool = ThreadPool::new(3).unwrap();
        for n in [0, 1, 2, 5, 1000] {
            let lists: Vec<WorkList> = (0..3).map(|i| WorkList::new(n * (i + 1))).collect();
            let taken: Vec<Vec<AtomicUsize>> = (0..3)
                .map(|i| (0..n * (i + 1)).map(|_| AtomicUsize::new(0)).collect())
                .collect();
            pool.run(&|t| {
                while let Some(k) = lists[t].pop_front() {
                    taken[t][k].fetch_add(1, SeqCst);
                }
                for o in (1..3).map(|o| (t + o) % 3) {
                    while let Some(k) = lists[o].pop_back() {
                        taken[o][k].fetch_add(1, SeqCst);
                    }
                }
            });
            assert!(
                taken.iter().flatten().all(|c| c.load(SeqCst) == 1),
                "n = {n}"
            );
        }
    }

    #[test]
    fn rows_mut_visits_each_row_once_with_its_index() {
        for threads in [1, 2, 3, 8] {
            let pool = ThreadPool::new(threads).unwrap();
            for rows in [0, 1, 5, 64, 100] {
                let mut v = vec![0usize; rows * 3];
                pool.rows_mut(&mut v, 3, 4, &|first, part| {
                    for (r, row) in part.chunks_exact_mut(3).enumerate() {
                        row.iter_mut().for_each(|x| *x += first + r + 1);
                    }
                });
                let want: Vec<usize> = (0..rows).flat_map(|r| [r + 1; 3]).collect();
                assert_eq!(v, want, "{threads} threads, {rows} rows");
            }
        }
    }
}
