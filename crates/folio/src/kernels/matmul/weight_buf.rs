//! [`WeightBuf`]: the memory a weight matrix lives in, and [`WeightArena`]: one mapping
//! that a model's buffers are cut from, one after another, as it loads.
//!
//! A buffer is either its own anonymous mapping or a range of an arena; both are asked
//! to be backed by 2 MiB pages, and both give their pages back to the system the moment
//! the buffer is dropped. With the allocator's memory instead, a buffer freed at load (a
//! matrix repacked or widened by the outlier pass) stays in the process's heap, so the
//! peak held every copy a matrix ever had; here what is held is what is live.
//!
//! Why an arena: decode streams every weight once per token, and with 4 KiB pages the
//! TLB misses on every page. Matrices mapped one by one mostly fall on 4 KiB pages (a
//! huge page needs a whole aligned 2 MiB of one mapping), so the weights used to be
//! packed into buffers of their own and then copied into one region: every page was
//! faulted in twice. While an arena is entered on a thread ([`WeightArena::enter`],
//! the model loader's scope), every buffer made on it is cut from the arena instead:
//! the weights are packed once, straight into memory on huge pages. A buffer dropped
//! from the arena gives its whole pages back; its range is not reused.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of a page given back by a release.
const PAGE: usize = 4096;
/// A huge page: the arena's first buffer starts on one.
const HUGE: usize = 2 << 20;
/// Each arena buffer starts on a cache line.
const LINE: usize = 64;

/// A zeroed buffer of `u64` words for weights, its pages untouched (and not resident)
/// until written.
pub struct WeightBuf {
    backing: Backing,
    len: usize,
}

enum Backing {
    /// Nothing (a mapping of length 0 cannot be made).
    Empty,
    /// Its own mapping.
    Map(memmap2::MmapMut),
    /// Bytes `at..at + 8·len` of an arena, this buffer's alone.
    Arena(Arc<Arena>, usize),
}

impl WeightBuf {
    /// `n` zeroed words: cut from the arena entered on this thread if there is one
    /// with room, else a mapping of their own.
    ///
    /// # Panics
    /// When the system refuses the mapping (out of address space or memory), as an
    /// allocation that fails does.
    pub fn zeroed(n: usize) -> Self {
        if n == 0 {
            return Self::empty();
        }
        let bytes = n.checked_mul(8).expect("weight buffer size overflows");
        let from_arena = CURRENT.with_borrow(|a| a.as_ref().and_then(|a| a.take(bytes)));
        if let Some((arena, at)) = from_arena {
            return Self {
                backing: Backing::Arena(arena, at),
                len: n,
            };
        }
        let map = memmap2::MmapMut::map_anon(bytes)
            .unwrap_or_else(|e| panic!("cannot map {bytes} bytes of weights: {e}"));
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Self {
            backing: Backing::Map(map),
            len: n,
        }
    }

    pub fn empty() -> Self {
        Self {
            backing: Backing::Empty,
            len: 0,
        }
    }

    /// Whether this buffer was cut from an arena (and so lies beside the model's other
    /// weights, on huge pages where the system gives them).
    pub fn in_arena(&self) -> bool {
        matches!(self.backing, Backing::Arena(..))
    }

    /// Gives words `range`'s whole pages back to the system: they read as zero after
    /// (the caller is done with them: a matrix being rewritten into another buffer
    /// releases what it has read).
    pub fn release(&mut self, range: std::ops::Range<usize>) {
        let (start, end) = (range.start * 8, range.end.min(self.len) * 8);
        match &self.backing {
            Backing::Empty => {}
            Backing::Map(m) => {
                let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
                if b > a {
                    #[cfg(unix)]
                    // SAFETY: [a, b) lies inside this private anonymous mapping, which
                    // `&mut self` holds alone: no reference into it outlives this call.
                    // MADV_DONTNEED makes its pages read as zero afterwards, which is
                    // what a release means here.
                    #[allow(unsafe_code)]
                    unsafe {
                        let _ =
                            m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a);
                    }
                }
            }
            Backing::Arena(arena, at) => arena.release(at + start, at + end),
        }
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        // A mapping of its own is unmapped by its own drop.
        if let Backing::Arena(arena, at) = &self.backing {
            arena.release(*at, at + self.len * 8);
        }
    }
}

impl Deref for WeightBuf {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match &self.backing {
            Backing::Empty => &[],
            // A mapping starts on a page: aligned for u64, and `len` words long.
            Backing::Map(m) => bytemuck::cast_slice(&m[..self.len * 8]),
            // SAFETY: bytes at..at + 8·len lie inside the arena's mapping (`take`), on a
            // cache line (aligned for u64), and belong to this buffer alone: no other
            // buffer's range overlaps them, and the mapping lives as long as the `Arc`.
            #[allow(unsafe_code)]
            Backing::Arena(arena, at) => unsafe {
                std::slice::from_raw_parts(arena.map.as_ptr().add(*at) as *const u64, self.len)
            },
        }
    }
}

impl DerefMut for WeightBuf {
    fn deref_mut(&mut self) -> &mut [u64] {
        match &mut self.backing {
            Backing::Empty => &mut [],
            Backing::Map(m) => bytemuck::cast_slice_mut(&mut m[..self.len * 8]),
            // SAFETY: as `deref`; `&mut self` makes this the only reference to the range.
            #[allow(unsafe_code)]
            Backing::Arena(arena, at) => unsafe {
                std::slice::from_raw_parts_mut(
                    arena.map.as_mut_ptr().add(*at) as *mut u64,
                    self.len,
                )
            },
        }
    }
}

thread_local! {
    /// The arena entered on this thread ([`WeightArena::enter`]).
    static CURRENT: RefCell<Option<Arc<Arena>>> = const { RefCell::new(None) };
}

/// One reserved mapping, asked to be backed by 2 MiB pages, that weight buffers are cut
/// from in order ([`WeightBuf::zeroed`] while it is entered). Reserving costs address
/// space only: a page becomes resident when a buffer writes it.
struct Arena {
    map: memmap2::MmapRaw,
    /// The next free byte.
    next: AtomicUsize,
}

impl Arena {
    /// A range of `bytes` at the next cache line, or `None` when the arena is full.
    fn take(self: &Arc<Self>, bytes: usize) -> Option<(Arc<Self>, usize)> {
        let cap = self.map.len();
        let at = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                let end = next.checked_add(bytes)?;
                (end <= cap).then(|| end.next_multiple_of(LINE).min(cap))
            })
            .ok()?;
        Some((self.clone(), at))
    }

    /// Gives the whole pages inside bytes `start..end` back to the system, and takes
    /// them out of the huge-page advice first: otherwise the kernel's background
    /// collapser (khugepaged, which fills a 2 MiB range however few of its pages are
    /// resident) makes the hole resident again. Measured: an idle `folio serve` of
    /// SmolLM2, whose widened matrices leave their first copies' holes, grew from 166
    /// to 198 MB in 50 s.
    fn release(&self, start: usize, end: usize) {
        let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if b <= a {
            return;
        }
        #[cfg(target_os = "linux")]
        let _ = self.map.advise_range(memmap2::Advice::NoHugePage, a, b - a);
        #[cfg(unix)]
        // SAFETY: [a, b) lies inside the mapping, and only the buffer that owns those
        // bytes (through `&mut self` or its drop) releases them: no reference into them
        // outlives the call. MADV_DONTNEED makes them read as zero afterwards, and no
        // range is handed out twice.
        #[allow(unsafe_code)]
        unsafe {
            let _ = self
                .map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a);
        }
    }
}

/// An arena entered on this thread: until it is dropped, [`WeightBuf::zeroed`] cuts
/// buffers from it (and then, when it is full, maps them one by one as without it).
/// The memory lives as long as its buffers.
pub struct WeightArena {
    previous: Option<Arc<Arena>>,
}

impl WeightArena {
    /// Reserves `capacity` bytes (rounded up to whole huge pages; address space, not
    /// memory) and enters the arena on this thread. Where the reservation is refused
    /// the arena is empty and buffers are mapped one by one.
    pub fn enter(capacity: usize) -> Self {
        let len = (capacity.checked_next_multiple_of(HUGE)).and_then(|c| c.checked_add(HUGE));
        let arena = len
            .and_then(|len| {
                (memmap2::MmapOptions::new()
                    .len(len)
                    .no_reserve_swap()
                    .map_anon())
                .map_err(|e| {
                    tracing::warn!(
                        "no weight arena of {len} bytes ({e}): weights mapped one by one"
                    )
                })
                .ok()
            })
            .map(|map| {
                #[cfg(target_os = "linux")]
                let _ = map.advise(memmap2::Advice::HugePage);
                // The first buffer starts on a huge page.
                let start = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
                Arc::new(Arena {
                    map: memmap2::MmapRaw::from(map),
                    next: AtomicUsize::new(start),
                })
            });
        let previous = CURRENT.with_borrow_mut(|c| std::mem::replace(c, arena));
        Self { previous }
    }
}

impl Drop for WeightArena {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with_borrow_mut(|c| *c = previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_zeroed_writable_and_may_be_empty() {
        let mut b = WeightBuf::zeroed(1000);
        assert!(!b.in_arena());
        assert_eq!(b.len(), 1000);
        assert!(b.iter().all(|&w| w == 0));
        b[999] = 7;
        assert_eq!(b[999], 7);
        b.release(0..1000);
        assert_eq!(b[999], 7, "the last, partial page is kept");
        assert!(b[..512].iter().all(|&w| w == 0));
        assert!(WeightBuf::zeroed(0).is_empty());
        assert!(WeightBuf::empty().is_empty());
    }

    #[test]
    fn buffers_made_in_an_arena_are_cut_from_it_in_order_zeroed_and_apart() {
        let arena = WeightArena::enter(3 << 20);
        let mut a = WeightBuf::zeroed(1000);
        let mut b = WeightBuf::zeroed(300_000);
        assert!(a.in_arena() && b.in_arena());
        assert_eq!(
            a.as_ptr() as usize % HUGE,
            0,
            "the first starts on a huge page"
        );
        assert_eq!(b.as_ptr() as usize % LINE, 0);
        assert_eq!(
            b.as_ptr() as usize,
            (a.as_ptr() as usize + 8000).next_multiple_of(LINE)
        );
        assert!(a.iter().chain(b.iter()).all(|&w| w == 0));
        a.fill(u64::MAX);
        b.fill(3);
        assert!(a.iter().all(|&w| w == u64::MAX), "b's writes stay in b");
        // Released pages read as zero; the partial last page is kept.
        b.release(0..b.len());
        assert_eq!(b[b.len() - 1], 3);
        assert_eq!(b[1024], 0);
        drop(a);
        // Past the capacity, a buffer is mapped on its own.
        let c = WeightBuf::zeroed(1 << 20);
        assert!(!c.in_arena());
        drop(arena);
        assert!(
            !WeightBuf::zeroed(8).in_arena(),
            "left: buffers are their own again"
        );
        assert_eq!(
            b[b.len() - 1],
            3,
            "the arena outlives its scope while buffers hold it"
        );
    }
}
