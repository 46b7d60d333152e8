//! Zeroed buffers asked to be backed by 2 MiB pages before anything touches them.
//!
//! Decode streams every weight once per token and, at depth, hundreds of megabytes of
//! K/V pages; with 4 KiB pages the TLB misses on nearly every page it reads. Large
//! allocations are fresh mappings, faulted in on first touch, so advice given right
//! after allocating decides how they are backed (the kernel merges adjacent mappings
//! with the same advice). Advice only: without transparent huge pages nothing changes,
//! and the contents are never affected.

/// `n` zeroed values of `T` (a plain number type) whose pages are advised huge.
pub fn zeroed<T: bytemuck::Zeroable + Clone>(n: usize) -> Vec<T> {
    let v = vec![T::zeroed(); n];
    advise(&v);
    v
}

fn advise<T>(v: &[T]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = v.as_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if b > a {
            // SAFETY: [a, b) lies inside `v`'s allocation (rounded inwards to pages);
            // MADV_HUGEPAGE changes only how the kernel backs those pages, never their
            // contents, and a failure (no THP) is harmless.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}
