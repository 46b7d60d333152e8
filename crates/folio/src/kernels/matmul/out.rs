//! [`OutView`]: a matmul's output buffer as the threads write it, each index once.

#[cfg(target_arch = "x86_64")]
use crate::kernels::avx512;

/// A shared view of one output buffer that threads write at disjoint indices, each
/// once: the value, or (`add`) the value added to what is there.
pub(super) struct OutView {
    ptr: *mut f32,
    len: usize,
    pub(super) add: bool,
}
// SAFETY: threads write through the view only at disjoint (row, token) indices, each
// bounds-checked against `len`, while the buffer is exclusively borrowed by `matmul`.
unsafe impl Sync for OutView {}

impl OutView {
    /// A view of `out` (written, or with `add` added to), for the parallel region of
    /// the call that holds `out` exclusively.
    #[inline]
    pub(super) fn new(out: &mut [f32], add: bool) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            add,
        }
    }

    #[inline]
    pub(super) fn write(&self, i: usize, v: f32) {
        assert!(i < self.len);
        // SAFETY: in bounds (checked above); no two threads touch the same index, and
        // nothing else reads the buffer until the parallel region ends.
        unsafe {
            let p = self.ptr.add(i);
            *p = if self.add { *p + v } else { v };
        }
    }

    /// Writes `v` at indices `i..i + v.len()`.
    #[inline]
    pub(super) fn write_run(&self, i: usize, v: &[f32]) {
        let out = self.run(i, v.len());
        if self.add {
            out.iter_mut().zip(v).for_each(|(o, v)| *o += v);
        } else {
            out.copy_from_slice(v);
        }
    }

    /// Indices `i..i + len`, for a kernel that writes them itself (each once, by
    /// `add`'s rule). A caller asks for each index once, as for `write`.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(super) fn run(&self, i: usize, len: usize) -> &mut [f32] {
        assert!(i + len <= self.len);
        // SAFETY: in bounds (checked above); no other thread touches these indices, and
        // nothing else reads the buffer until the parallel region ends.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i), len) }
    }

    /// `rows` runs of `len` from index `i`, `stride` apart, for an AVX-512 tile call
    /// (its contract holds: in bounds, checked here, and each index asked for once).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(super) fn tile_out(
        &self,
        i: usize,
        stride: usize,
        rows: usize,
        len: usize,
    ) -> avx512::TileOut {
        assert!(rows > 0 && i + (rows - 1) * stride + len <= self.len);
        avx512::TileOut {
            ptr: self.ptr.wrapping_add(i),
            stride,
            len,
            add: self.add,
        }
    }
}
