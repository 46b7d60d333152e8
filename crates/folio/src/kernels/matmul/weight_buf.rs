//! [`WeightBuf`]: the memory a weight matrix lives in. Each buffer is its own anonymous
//! mapping, asked to be backed by 2 MiB pages, and given back to the system the moment
//! it is dropped. With the allocator's memory instead, a buffer freed at load (a matrix
//! repacked, widened by the outlier pass, or moved into the shared region) stays in the
//! process's heap, so the peak held every copy a matrix ever had; here what is held is
//! what is live.

use std::ops::{Deref, DerefMut};

/// A zeroed buffer of `u64` words for weights, its pages untouched (and not resident)
/// until written.
pub struct WeightBuf {
    /// `None` for an empty buffer (a mapping of length 0 cannot be made).
    map: Option<memmap2::MmapMut>,
    len: usize,
}

impl WeightBuf {
    /// `n` zeroed words.
    ///
    /// # Panics
    /// When the system refuses the mapping (out of address space or memory), as an
    /// allocation that fails does.
    pub fn zeroed(n: usize) -> Self {
        if n == 0 {
            return Self::empty();
        }
        let bytes = n.checked_mul(8).expect("weight buffer size overflows");
        let map = memmap2::MmapMut::map_anon(bytes)
            .unwrap_or_else(|e| panic!("cannot map {bytes} bytes of weights: {e}"));
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Self {
            map: Some(map),
            len: n,
        }
    }

    pub fn empty() -> Self {
        Self { map: None, len: 0 }
    }

    /// Gives words `range`'s whole pages back to the system: they read as zero after
    /// (the caller is done with them: a matrix being rewritten into another buffer
    /// releases what it has read).
    pub fn release(&mut self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let Some(m) = &mut self.map else { return };
        let (a, b) = (
            (range.start * 8).next_multiple_of(PAGE),
            (range.end.min(self.len) * 8) / PAGE * PAGE,
        );
        if b <= a {
            return;
        }
        #[cfg(unix)]
        // SAFETY: [a, b) lies inside this private anonymous mapping, which `&mut self`
        // holds alone: no reference into it outlives this call. MADV_DONTNEED makes its
        // pages read as zero afterwards, which is what a release means here.
        #[allow(unsafe_code)]
        unsafe {
            let _ = m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a);
        }
    }
}

impl Deref for WeightBuf {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match &self.map {
            // A mapping starts on a page: aligned for u64, and `len` words long.
            Some(m) => bytemuck::cast_slice(&m[..self.len * 8]),
            None => &[],
        }
    }
}

impl DerefMut for WeightBuf {
    fn deref_mut(&mut self) -> &mut [u64] {
        match &mut self.map {
            Some(m) => bytemuck::cast_slice_mut(&mut m[..self.len * 8]),
            None => &mut [],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_zeroed_writable_and_may_be_empty() {
        let mut b = WeightBuf::zeroed(1000);
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
}
