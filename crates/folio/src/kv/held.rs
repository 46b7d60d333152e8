//! Pages a backend keeps on its device: [`DevicePages`], what a backend with its own
//! copy of the pool (the GPU's) offers the host storage, and [`HeldPages`], the
//! storage's record of which slots of which pages only that copy has.
//!
//! A backend that computes K/V on a device need not send every new row back: it
//! leaves them there and tells the storage which slots it wrote
//! ([`KvStorage::hold`](super::KvStorage::hold)). The storage then reads them from the
//! device only when the host needs the bytes: a snapshot written to a file, a page
//! spilled to the disk tier, or a host write into such a page. A copy-on-write copy of
//! a held page (a fork, a truncation into a committed page) is asked of the device
//! first, so it stays there.
//!
//! # Invariants
//!
//! - A page's held slots are one range `lo..hi` (empty: none): their host bytes may be
//!   stale. The device holds them at the page's current generation: the page was
//!   marked held under a fresh generation, and no host write happened since (every
//!   host write into a held page reads it back first, then takes a new generation;
//!   a page reserved afresh for the host to overwrite drops its marks: its old slots
//!   are no sequence's).
//! - Slots of a held range the device no longer holds at that generation (a failed
//!   step wrote over slots past a sequence's end) are no sequence's: a read-back
//!   returns what the device holds, and a caller that needs more slots of a page than
//!   came back gets an error.
//! - A page whose held slots could not be read back (the device lost) stays held: a
//!   later read-back fails again rather than the host's stale bytes passing for K/V.
//! - One device at a time: a storage attached to another device first reads back
//!   every page the previous one held.

use super::buf::KvDtype;
use std::ops::Range;
use std::sync::Arc;

/// What [`DevicePages::fetch`] is asked: slots `slots` of `page`, every layer, as
/// they were at the page's `generation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub page: u32,
    pub generation: u64,
    pub slots: Range<usize>,
}

/// A backend's device copy of the pool's pages, as the host storage reaches it.
pub trait DevicePages: Send + Sync {
    /// For each of `pages`, the bytes of its asked slots, every layer, in the layout
    /// of [`KvArena::read_slot`](super::KvArena::read_slot) for `dtype`, one slot
    /// after another: as many of them as the device holds at that generation (whole
    /// slots, from the first asked). `Err`: the device could not be read (lost), or
    /// holds another generation of a page (a bug: the host would lose K/V).
    fn fetch(&self, pages: &[Fetch], dtype: KvDtype) -> Result<Vec<Vec<u8>>, String>;

    /// Copies slots `0..n` of page `src` (at generation `src.1`) to page `dst` on the
    /// device, which then holds them at generation `dst.1`. `Ok(false)` where the
    /// device does not hold all of them at that generation (the host copies then).
    fn copy(&self, src: (u32, u64), dst: (u32, u64), n: usize) -> Result<bool, String>;
}

/// The storage's record of the slots only a device holds (module doc).
#[derive(Default)]
pub(crate) struct HeldPages {
    device: Option<Arc<dyn DevicePages>>,
    /// Per page: slots `lo..hi` are held on the device only (`hi` 0: none).
    held: Vec<(u32, u32)>,
    /// Pages with held slots.
    count: usize,
}

impl HeldPages {
    pub fn new(n_pages: usize) -> Self {
        HeldPages {
            device: None,
            held: vec![(0, 0); n_pages],
            count: 0,
        }
    }

    /// The device pages are left on, if any.
    pub fn device(&self) -> Option<&Arc<dyn DevicePages>> {
        self.device.as_ref()
    }

    /// Whether `device` is the one held pages are on.
    pub fn is_on(&self, device: &Arc<dyn DevicePages>) -> bool {
        self.device.as_ref().is_some_and(|d| Arc::ptr_eq(d, device))
    }

    /// Takes `device` as the one pages are left on; every page must have been read
    /// back from the previous one.
    pub fn set_device(&mut self, device: &Arc<dyn DevicePages>) {
        debug_assert_eq!(self.count, 0, "pages still held on the previous device");
        self.device = Some(Arc::clone(device));
    }

    /// The slots of `page` held on the device only (empty: none).
    pub fn range(&self, page: u32) -> Range<usize> {
        let (lo, hi) = self.held[page as usize];
        lo as usize..hi as usize
    }

    /// Pages with held slots.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Every page with held slots.
    pub fn pages(&self) -> Vec<u32> {
        if self.count == 0 {
            return Vec::new();
        }
        (0..self.held.len() as u32)
            .filter(|&p| self.held[p as usize].1 > 0)
            .collect()
    }

    /// Slots `slots` of `page` are held on the device (those held before stay held:
    /// the range grows to cover both).
    pub fn hold(&mut self, page: u32, slots: Range<usize>) {
        if slots.is_empty() {
            return;
        }
        let h = &mut self.held[page as usize];
        *h = match *h {
            (_, 0) => {
                self.count += 1;
                (slots.start as u32, slots.end as u32)
            }
            (lo, hi) => (lo.min(slots.start as u32), hi.max(slots.end as u32)),
        };
    }

    /// `page`'s host bytes are its own again (read back, or about to be overwritten).
    pub fn clear(&mut self, page: u32) {
        let h = &mut self.held[page as usize];
        if h.1 > 0 {
            self.count -= 1;
        }
        *h = (0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvArena;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A device copy kept in a second arena: per page the generation it holds and
    /// how many slots; counts what the host asks of it.
    struct Fake {
        arena: Mutex<KvArena>,
        held: Mutex<HashMap<u32, (u64, usize)>>,
        fetched: Mutex<Vec<Fetch>>,
        copies: Mutex<usize>,
        /// Every fetch and copy fails (a device lost).
        lost: Mutex<bool>,
    }

    impl Fake {
        fn new(n_pages: usize) -> Arc<Self> {
            Arc::new(Fake {
                arena: Mutex::new(KvArena::new(n_pages, 2, 4, 8, 8, KvDtype::F16)),
                held: Mutex::default(),
                fetched: Mutex::default(),
                copies: Mutex::default(),
                lost: Mutex::default(),
            })
        }

        /// A step on the device: rows `a..b` of `page` written there, left held by
        /// `host`.
        fn step(&self, host: &mut KvArena, page: u32, (a, b): (usize, usize), x: f32) {
            let mut dev = self.arena.lock().unwrap();
            for slot in a..b {
                for layer in 0..2 {
                    let k = [x + slot as f32 + layer as f32 * 0.25; 8];
                    dev.write(page, layer, slot, &k, &k.map(|v| -v));
                }
            }
            host.hold(page, a..b);
            self.held
                .lock()
                .unwrap()
                .insert(page, (host.generation(page), b));
        }

        fn slot(&self, page: u32, slot: usize) -> Vec<u8> {
            let mut out = Vec::new();
            self.arena.lock().unwrap().read_slot(page, slot, &mut out);
            out
        }
    }

    impl DevicePages for Fake {
        fn fetch(&self, pages: &[Fetch], _dtype: KvDtype) -> Result<Vec<Vec<u8>>, String> {
            if *self.lost.lock().unwrap() {
                return Err("lost".into());
            }
            self.fetched.lock().unwrap().extend_from_slice(pages);
            let held = self.held.lock().unwrap();
            let dev = self.arena.lock().unwrap();
            pages
                .iter()
                .map(|f| match held.get(&f.page) {
                    Some(&(g, n)) if g == f.generation => {
                        let mut out = Vec::new();
                        let slots = f.slots.start..f.slots.end.min(n);
                        slots.for_each(|s| dev.read_slot(f.page, s, &mut out));
                        Ok(out)
                    }
                    _ => Err(format!("page {} is not held", f.page)),
                })
                .collect()
        }

        fn copy(&self, src: (u32, u64), dst: (u32, u64), n: usize) -> Result<bool, String> {
            if *self.lost.lock().unwrap() {
                return Err("lost".into());
            }
            let mut held = self.held.lock().unwrap();
            if held.get(&src.0).is_none_or(|&(g, k)| g != src.1 || k < n) {
                return Ok(false);
            }
            self.arena.lock().unwrap().copy_slots(src.0, dst.0, n);
            held.insert(dst.0, (dst.1, n));
            *self.copies.lock().unwrap() += 1;
            Ok(true)
        }
    }

    fn host_slot(a: &KvArena, page: u32, slot: usize) -> Vec<u8> {
        let mut out = Vec::new();
        a.read_slot(page, slot, &mut out);
        out
    }

    /// Rows left on the device come back only when asked (a sync, a host write into
    /// their page), bit for bit; a copy of a held page is made on the device.
    #[test]
    fn held_rows_come_back_only_when_the_host_needs_them() {
        let mut host = KvArena::new(6, 2, 4, 8, 8, KvDtype::F16);
        let fake = Fake::new(6);
        let device: Arc<dyn DevicePages> = fake.clone();
        host.attach(&device).unwrap();
        // Two steps into page 1 (slots 0..2, then 2..3), one into page 2.
        fake.step(&mut host, 1, (0, 2), 10.0);
        fake.step(&mut host, 1, (2, 3), 20.0);
        fake.step(&mut host, 2, (0, 4), 30.0);
        assert_eq!((host.held_slots(1), host.held_slots(2)), (0..3, 0..4));
        assert_eq!(host.held_pages(), 2);
        assert!(
            fake.fetched.lock().unwrap().is_empty(),
            "nothing read back yet"
        );
        // A fork's copy of page 1's three slots: made on the device, held there.
        host.copy_slots(1, 3, 3);
        assert_eq!(*fake.copies.lock().unwrap(), 1);
        assert_eq!(host.held_slots(3), 0..3);
        assert!(fake.fetched.lock().unwrap().is_empty());
        // A sync of pages 1 and 3 is one read-back; the bytes are the device's and the
        // generations stay.
        let g1 = host.generation(1);
        host.sync(&[3, 1, 3]).unwrap();
        assert_eq!(fake.fetched.lock().unwrap().len(), 2);
        assert!(host.held_slots(1).is_empty() && host.held_slots(3).is_empty());
        assert_eq!(host.generation(1), g1);
        for s in 0..3 {
            assert_eq!(host_slot(&host, 1, s), fake.slot(1, s), "page 1 slot {s}");
            assert_eq!(host_slot(&host, 3, s), fake.slot(1, s), "page 3 slot {s}");
        }
        // A host write into held page 2 reads its other slots back first.
        let row = [7.0f32; 8];
        host.write(2, 0, 3, &row, &row);
        assert!(host.held_slots(2).is_empty());
        for s in 0..3 {
            assert_eq!(host_slot(&host, 2, s), fake.slot(2, s), "page 2 slot {s}");
        }
        assert_ne!(
            host_slot(&host, 2, 3),
            fake.slot(2, 3),
            "the host's write stays"
        );
    }

    /// A copy the device cannot make (it holds fewer slots than asked) is made on the
    /// host, from the source read back; attaching another device reads back what the
    /// first held; a device that no longer holds a page's generation is an error and
    /// the page stays held.
    #[test]
    fn host_copies_a_new_device_and_a_lost_page() {
        let mut host = KvArena::new(6, 2, 4, 8, 8, KvDtype::F16);
        let fake = Fake::new(6);
        let device: Arc<dyn DevicePages> = fake.clone();
        host.attach(&device).unwrap();
        fake.step(&mut host, 0, (0, 2), 1.0);
        // The host holds slot 2 too (written through it), the device does not.
        let row = [5.0f32; 8];
        host.write(0, 0, 2, &row, &row);
        host.write(0, 1, 2, &row, &row);
        fake.step(&mut host, 0, (3, 4), 2.0);
        fake.held.lock().unwrap().insert(0, (host.generation(0), 2));
        host.copy_slots(0, 4, 3);
        assert_eq!(*fake.copies.lock().unwrap(), 0, "the device holds 2 of 3");
        assert!(host.held_slots(4).is_empty());
        for s in 0..2 {
            assert_eq!(host_slot(&host, 4, s), fake.slot(0, s));
        }
        // Page 5 held on the first device; a second device takes over.
        fake.step(&mut host, 5, (0, 1), 3.0);
        let other: Arc<dyn DevicePages> = Fake::new(6);
        host.attach(&other).unwrap();
        assert_eq!(host.held_pages(), 0);
        assert_eq!(host_slot(&host, 5, 0), fake.slot(5, 0));
        // A page the device lost (another generation there): an error, still held.
        let again = Fake::new(6);
        let again_dyn: Arc<dyn DevicePages> = again.clone();
        host.attach(&again_dyn).unwrap();
        again.step(&mut host, 1, (0, 1), 4.0);
        again.held.lock().unwrap().insert(1, (0, 1));
        let err = host.sync(&[1]).unwrap_err();
        assert!(matches!(err, crate::kv::KvError::Device(_)), "{err}");
        assert_eq!(host.held_slots(1), 0..1);
    }

    /// A device that cannot be read leaves what it held held: a copy of such a page
    /// is held too (never the host's stale bytes), a host write into one keeps it
    /// held, and every later read-back fails; a page reserved afresh drops its marks
    /// without a read-back; a read-back that gives fewer slots than needed is an error
    /// and writes nothing.
    #[test]
    fn a_lost_device_never_passes_stale_bytes_for_kv() {
        let mut host = KvArena::new(6, 2, 4, 8, 8, KvDtype::F16);
        let fake = Fake::new(6);
        let device: Arc<dyn DevicePages> = fake.clone();
        host.attach(&device).unwrap();
        fake.step(&mut host, 0, (0, 3), 1.0);
        fake.step(&mut host, 1, (0, 2), 2.0);
        fake.step(&mut host, 2, (0, 4), 3.0);
        // Fewer slots back than needed: an error, nothing read back.
        fake.held.lock().unwrap().insert(2, (host.generation(2), 2));
        assert!(host.sync_needing(&[(2, 4)]).is_err());
        assert_eq!(host.held_slots(2), 0..4);
        // Fewer than held but all that is needed: read back.
        host.sync_needing(&[(2, 2)]).unwrap();
        assert!(host.held_slots(2).is_empty());
        *fake.lost.lock().unwrap() = true;
        host.copy_slots(0, 3, 3);
        assert_eq!(host.held_slots(0), 0..3);
        assert_eq!(host.held_slots(3), 0..3, "the copy is held, not the host's");
        assert!(host.sync(&[3]).is_err());
        let row = [9.0f32; 8];
        host.write(1, 0, 3, &row, &row);
        assert_eq!(
            host.held_slots(1),
            0..2,
            "a host write keeps a lost page held"
        );
        *fake.lost.lock().unwrap() = false;
        let err = host.sync(&[1]).unwrap_err();
        assert!(err.to_string().contains("not held"), "{err}");
        // A page reserved afresh: no read-back, no marks.
        let before = fake.fetched.lock().unwrap().len();
        host.fresh(0);
        assert!(host.held_slots(0).is_empty());
        assert_eq!(fake.fetched.lock().unwrap().len(), before);
    }
}
