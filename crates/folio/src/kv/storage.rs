//! [`KvStorage`]: the K/V slots a forward step writes and reads, addressed by page id
//! and slot. It is the model's whole view of a cache: no allocation, no tables, no
//! hashes. The paged pool's [`KvArena`] is one; the contiguous oracle is another (one
//! "page" per sequence, see `basic.rs`).

use super::arena::KvArena;
use super::buf::KvPair;

/// Page-addressed K/V storage.
pub trait KvStorage: Sync {
    /// Pages there are: ids `0..num_pages()`.
    fn num_pages(&self) -> usize;
    /// Token slots of `page`.
    fn page_slots(&self, page: u32) -> usize;
    /// Stores K and V of one slot in one layer (all KV heads).
    fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]);
    /// K and V rows of `layer` from `slot` of `page` to the end of page
    /// `page + count - 1` where the storage keeps a layer's consecutive pages side by
    /// side (those `count` ids must exist), else to the end of `page` alone: a caller
    /// takes what it got and asks again from there.
    fn run_pages(&self, page: u32, count: usize, layer: usize, slot: usize) -> KvPair<'_>;
    /// K and V rows of `layer` in `page` from `slot` to the end of the page.
    fn run(&self, page: u32, layer: usize, slot: usize) -> KvPair<'_> {
        self.run_pages(page, 1, layer, slot)
    }
    /// A number that changes whenever any slot of `page` is written, and that no other
    /// content of any page ever had; `None` where the storage keeps none (a backend
    /// holding its own copy of pages must then read them afresh every step).
    fn generation(&self, _page: u32) -> Option<u64> {
        None
    }
}

impl KvStorage for KvArena {
    fn num_pages(&self) -> usize {
        KvArena::num_pages(self)
    }
    fn page_slots(&self, _page: u32) -> usize {
        self.page_size()
    }
    fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        KvArena::write(self, page, layer, slot, k, v)
    }
    fn run_pages(&self, page: u32, count: usize, layer: usize, slot: usize) -> KvPair<'_> {
        KvArena::run_pages(self, page, count, layer, slot)
    }
    fn generation(&self, page: u32) -> Option<u64> {
        Some(KvArena::generation(self, page))
    }
}
