//! [`KvStorage`]: the K/V slots a forward step writes and reads, addressed by page id
//! and slot. It is the model's whole view of a cache: no allocation, no tables, no
//! hashes. The paged pool's [`KvArena`] is one; the contiguous oracle is another (one
//! "page" per sequence, see `basic.rs`).

use super::arena::KvArena;
use super::buf::KvPair;
use super::error::KvError;
use super::held::DevicePages;
use std::ops::Range;
use std::sync::Arc;

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

    /// A number no other storage of the process has, where this storage can leave the
    /// rows a backend computes on the backend's device ([`KvStorage::attach`]); `None`
    /// where it cannot (the backend then writes every row through
    /// [`KvStorage::write`]).
    fn identity(&self) -> Option<u64> {
        None
    }

    /// Takes `device` as where [`KvStorage::hold`] leaves rows (reading back first what
    /// another device held). Only for a storage with an [`KvStorage::identity`].
    fn attach(&mut self, _device: &Arc<dyn DevicePages>) -> Result<(), KvError> {
        Err(KvError::Device(
            "this storage keeps no rows on a device".into(),
        ))
    }

    /// Slots `slots` of `page`, every layer, were written on the attached device and
    /// not here: the page takes a new generation, and the storage reads them back from
    /// the device when the host needs them (`kv/held.rs`).
    fn hold(&mut self, _page: u32, _slots: Range<usize>) {}

    /// The slots of `page` held on the device only (their bytes here may be stale).
    fn held_slots(&self, _page: u32) -> Range<usize> {
        0..0
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
    fn identity(&self) -> Option<u64> {
        Some(KvArena::identity(self))
    }
    fn attach(&mut self, device: &Arc<dyn DevicePages>) -> Result<(), KvError> {
        KvArena::attach(self, device)
    }
    fn hold(&mut self, page: u32, slots: Range<usize>) {
        KvArena::hold(self, page, slots)
    }
    fn held_slots(&self, page: u32) -> Range<usize> {
        KvArena::held_slots(self, page)
    }
}
