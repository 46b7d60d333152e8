//! A persistent thread pool for the forward pass: `run(f)` calls `f(i)` once on each of
//! `n` threads (the caller is thread 0) and returns when all are done.
//!
//! Why not rayon: a decode step has ~150 parallel regions of a few microseconds each, so
//! the cost of one region matters. Workers spin briefly on an epoch counter, then sleep
//! on a condvar, so an idle engine costs no CPU.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = &'static (dyn Fn(usize) + Sync);

struct Shared {
    job: Mutex<Option<Job>>,
    epoch: AtomicU64,
    pending: AtomicUsize,
    sleepers: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A fixed set of worker threads.
pub struct ThreadPool {
    n: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

const SPINS: u32 = 200_000;

impl ThreadPool {
    /// A pool of `n` threads in all (the caller counts as one); `n` is at least 1.
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            job: Mutex::new(None),
            epoch: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("folio-worker-{i}"))
                    .spawn(move || worker(i, &s))
                    .expect("spawn worker thread")
            })
            .collect();
        Self {
            n,
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Number of threads, the caller included.
    pub fn threads(&self) -> usize {
        self.n
    }

    /// Runs `f(i)` for i in 0..threads(), in parallel, and waits for all of them.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n == 1 {
            f(0);
            return;
        }
        let _one_at_a_time = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the 'static lifetime is a lie told only to the workers: this function
        // does not return until `pending` is 0, i.e. until every worker has finished
        // calling the job, and it clears the slot before returning, so no worker can
        // reach `f` after the borrow ends.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        s.pending.store(self.n - 1, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.pending.load(Acquire) != 0 {
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a folio worker thread panicked");
        }
    }
}

fn worker(i: usize, s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Acquire) {
                return;
            }
            let e = s.epoch.load(Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
                continue;
            }
            let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, SeqCst);
            while s.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, SeqCst);
            spins = 0;
        }
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job {
            if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
                s.panicked.store(true, SeqCst);
            }
        }
        s.pending.fetch_sub(1, Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl ThreadPool {
    /// Row-wise work over `out` (rows of `width` elements): `f(first_row, rows)` runs on
    /// every thread for its contiguous share of the rows, or once on this thread when
    /// there are fewer than `min_rows` rows (a parallel region costs more than small
    /// work). Each row is handled by exactly one call, so the results do not depend on
    /// the split.
    pub fn rows_mut<T: Send>(
        &self,
        out: &mut [T],
        width: usize,
        min_rows: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        assert!(width > 0 && out.len().is_multiple_of(width));
        let rows = out.len() / width;
        if self.n == 1 || rows < min_rows.max(2) {
            return f(0, out);
        }
        let mut parts = Vec::with_capacity(self.n);
        let mut rest = out;
        for i in 0..self.n {
            let (a, b) = share(rows, i, self.n);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut((b - a) * width);
            parts.push((a, Mutex::new(mine)));
            rest = tail;
        }
        self.run(&|i| {
            let (first, part) = &parts[i];
            let mut guard = part.lock().unwrap_or_else(|e| e.into_inner());
            f(*first, &mut guard);
        });
    }
}

/// A thread's list of work items `0..n`: its owner pops from the front, a thread that
/// has run out of its own work pops from the back; front and back live in one atomic
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

    #[test]
    fn every_thread_runs_once_per_region() {
        let pool = ThreadPool::new(3);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i| {
                hits[i].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
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
        let pool = ThreadPool::new(3);
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
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for rows in [0, 1, 5, 64] {
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
