//! The K/V bytes of every page: one allocation for the whole pool, f16 (default), f32
//! or 8-bit elements (these with one scale per head row, kept in a second array of the
//! same layout: see `kernels::kv_rows`).
//!
//! Layout: pages in chunks of [`CHUNK_TOKENS`] tokens' worth, each chunk
//! `[layer][K | V][page][slot][kv_dim]`. A page's K rows for one layer are contiguous
//! (`page_size × kv_dim` elements), so attention walks a page's keys as one run;
//! copying a page (fork, copy-on-write) is one contiguous copy per layer and K/V.
//! Within a chunk a layer's K (and V) of consecutive pages lie side by side, so a
//! sequence whose pages were taken in order (a fresh pool hands them out ascending)
//! reads each layer in runs of a chunk: streams the hardware prefetcher follows, where
//! `[page][layer]…` made every page of 6 KB a stream of its own.
//!
//! Why chunks, not the layer outermost for the whole pool: a prompt's first touch of
//! its pages faults in huge pages, and with one chunk a short prompt touched a piece
//! of every layer's K and V region of the pool (60 regions for the default model).
//! Chunks of 2048 tokens measured best of the four layouts for decode and first-token
//! time alike (docs/BENCHMARKS.md, "Design measurements").
//!
//! Each page carries a *generation*: a number taken afresh from one process-wide
//! counter whenever any slot of the page is written ([`KvArena::write`],
//! [`KvArena::write_slot`], the destination of [`KvArena::copy_slots`]). Two reads
//! that see the same generation for a page saw the same bytes, in this arena or any
//! other (held slots aside: below): a backend that keeps its own copy of pages (the
//! GPU's device pool) skips those whose generation it already holds.
//!
//! A backend that keeps its own copy may also leave the rows it computes there
//! ([`KvArena::hold`], `held.rs`): the arena then reads those slots back from the
//! device ([`KvArena::sync`]) before anything on the host reads or overwrites them.
//! The paged pool reads back a snapshot's pages when it writes the file and a page it
//! spills to the disk tier; a copy-on-write copy of a held page is made on the device.

use super::buf::{KvBuf, KvDtype, KvPair};
use super::error::KvError;
use super::held::{DevicePages, Fetch, HeldPages};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The next page generation, shared by every arena of the process (so a copy made from
/// one arena never passes for another's page of the same id). 0 is never handed out.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, Ordering::Relaxed)
}

/// Tokens' worth of pages a chunk of the arena holds (at least one page).
pub const CHUNK_TOKENS: usize = 2048;

/// K/V storage for `n_pages` pages.
pub struct KvArena {
    data: KvBuf,
    n_pages: usize,
    /// Pages per chunk (the last chunk may hold fewer).
    chunk: usize,
    n_layers: usize,
    page_size: usize,
    kv_dim: usize,
    head_dim: usize,
    /// Per page: its generation (module doc).
    generations: Vec<u64>,
    /// The slots only a backend's device holds (`held.rs`).
    held: HeldPages,
    /// A number no other arena of the process has (what a device copy belongs to).
    identity: u64,
}

impl KvArena {
    /// `head_dim` is the head size (`kv_dim` a multiple of it), which 8-bit K/V keeps a
    /// scale per.
    pub fn new(
        n_pages: usize,
        n_layers: usize,
        page_size: usize,
        kv_dim: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Self {
        Self {
            data: KvBuf::new(dtype, n_pages * n_layers * 2 * page_size * kv_dim, head_dim),
            n_pages,
            chunk: (CHUNK_TOKENS / page_size).max(1),
            n_layers,
            page_size,
            kv_dim,
            head_dim,
            generations: (0..n_pages).map(|_| next_generation()).collect(),
            held: HeldPages::new(n_pages),
            identity: next_generation(),
        }
    }

    /// A number no other arena of the process has had: a device copy of pages belongs
    /// to one arena.
    pub fn identity(&self) -> u64 {
        self.identity
    }

    /// Takes `device` as where held slots are left ([`KvArena::hold`]); where another
    /// device holds slots of this arena, they are read back from it first.
    pub fn attach(&mut self, device: &Arc<dyn DevicePages>) -> Result<(), KvError> {
        if self.held.is_on(device) {
            return Ok(());
        }
        self.sync(&self.held.pages())?;
        self.held.set_device(device);
        Ok(())
    }

    /// Slots `slots` of `page`, every layer, were written on the attached device and
    /// not here: the page takes a new generation (the device records it as the one it
    /// holds) and the slots are read back from the device when the host needs them.
    pub fn hold(&mut self, page: u32, slots: Range<usize>) {
        debug_assert!(self.held.device().is_some(), "hold without a device");
        self.touch(page);
        self.held.hold(page, slots);
    }

    /// The slots of `page` whose host bytes may be stale (held on the device).
    pub fn held_slots(&self, page: u32) -> Range<usize> {
        self.held.range(page)
    }

    /// Pages with slots held on the device.
    pub fn held_pages(&self) -> usize {
        self.held.count()
    }

    /// Reads the held slots of `pages` back from the device, in one read-back; their
    /// generations stay (the bytes are the ones the device held at them). `Err`: the
    /// device could not be read; the pages stay held.
    pub fn sync(&mut self, pages: &[u32]) -> Result<(), KvError> {
        let need: Vec<(u32, usize)> = pages.iter().map(|&p| (p, 0)).collect();
        self.sync_needing(&need)
    }

    /// [`KvArena::sync`] of pages each of whose first `n` slots must come back (or be
    /// the host's own): `Err` where the device gives back fewer of its held ones (it
    /// no longer has them), rather than stale bytes passing for K/V. Nothing is
    /// written then.
    pub fn sync_needing(&mut self, pages: &[(u32, usize)]) -> Result<(), KvError> {
        let mut want: Vec<(Fetch, usize)> = pages
            .iter()
            .filter(|&&(p, _)| !self.held.range(p).is_empty())
            .map(|&(p, n)| {
                let f = Fetch {
                    page: p,
                    generation: self.generation(p),
                    slots: self.held.range(p),
                };
                (f, n)
            })
            .collect();
        // One entry a page, the one needing most.
        want.sort_unstable_by_key(|(f, n)| (f.page, usize::MAX - n));
        want.dedup_by_key(|(f, _)| f.page);
        let Some(device) = self.held.device().filter(|_| !want.is_empty()).cloned() else {
            return Ok(());
        };
        let fetches: Vec<Fetch> = want.iter().map(|(f, _)| f.clone()).collect();
        let got = device
            .fetch(&fetches, self.dtype())
            .map_err(KvError::Device)?;
        let slot_bytes = self.slot_bytes();
        for ((f, n), bytes) in want.iter().zip(&got) {
            let end = f.slots.start + bytes.len() / slot_bytes;
            if end < f.slots.end.min(*n) {
                return Err(KvError::Device(format!(
                    "page {}: the device gave back slots {}..{end} of {:?}; {n} are needed",
                    f.page, f.slots.start, f.slots
                )));
            }
        }
        for ((f, _), bytes) in want.iter().zip(got) {
            for (i, data) in bytes.chunks_exact(slot_bytes).enumerate() {
                self.put_slot(f.page, f.slots.start + i, data);
            }
            self.held.clear(f.page);
        }
        Ok(())
    }

    /// Before a host write into `page`: its held slots read back (a write takes a new
    /// generation, which the device does not hold). Where the device cannot be read
    /// they stay held, so every later read-back of the page fails (`held.rs`): the
    /// K/V is lost, and said so, never passed off as the host's.
    fn own(&mut self, page: u32) -> Result<(), KvError> {
        // Every row a CPU step writes comes here: nothing to do, nothing allocated.
        if self.held.range(page).is_empty() {
            return Ok(());
        }
        self.sync(&[page]).inspect_err(|e| {
            tracing::error!("kv: page {page}'s K/V held on the device is lost: {e}");
        })
    }

    /// `page` was reserved afresh and the host is about to write it from its first
    /// slot: what it held (on the device or here) is no sequence's, and is not read
    /// back.
    pub fn fresh(&mut self, page: u32) {
        self.held.clear(page);
        self.touch(page);
    }

    /// `page`'s generation: it changes whenever any slot of the page is written, to a
    /// number no page of any arena has had before (module doc).
    pub fn generation(&self, page: u32) -> u64 {
        self.generations[page as usize]
    }

    fn touch(&mut self, page: u32) {
        self.generations[page as usize] = next_generation();
    }

    /// The same arena with `chunk` pages per chunk (tests).
    #[cfg(test)]
    fn with_chunk(mut self, chunk: usize) -> Self {
        self.chunk = chunk.max(1);
        self
    }

    /// `page`'s chunk: its first page and how many pages it holds.
    fn chunk_of(&self, page: usize) -> (usize, usize) {
        let first = page - page % self.chunk;
        (first, self.chunk.min(self.n_pages - first))
    }

    /// Bytes of K/V one page holds (8-bit K/V: the scales too).
    pub fn page_bytes(
        n_layers: usize,
        page_size: usize,
        kv_dim: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> usize {
        n_layers * 2 * page_size * dtype.row_bytes(kv_dim, head_dim)
    }

    pub fn num_pages(&self) -> usize {
        self.n_pages
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn dtype(&self) -> KvDtype {
        self.data.dtype()
    }

    fn at(&self, page: u32, layer: usize, v: bool, slot: usize) -> usize {
        // A page past the pool would alias another page's region, not fail a bound.
        assert!(
            (page as usize) < self.n_pages && layer < self.n_layers && slot < self.page_size,
            "slot {slot} of page {page}, layer {layer}: outside the arena"
        );
        let ps = self.page_size * self.kv_dim;
        let (first, pages) = self.chunk_of(page as usize);
        let base = first * self.n_layers * 2 * ps;
        let run = (layer * 2 + usize::from(v)) * pages + (page as usize - first);
        base + run * ps + slot * self.kv_dim
    }

    /// K of one slot as raw 16-bit units (two per f32 element; f16 and f32 only).
    pub fn k_row(&self, page: u32, layer: usize, slot: usize) -> &[u16] {
        let at = self.at(page, layer, false, slot);
        self.data.raw(at, at + self.kv_dim)
    }

    /// V of one slot as raw 16-bit units.
    pub fn v_row(&self, page: u32, layer: usize, slot: usize) -> &[u16] {
        let at = self.at(page, layer, true, slot);
        self.data.raw(at, at + self.kv_dim)
    }

    /// K and V rows of `layer` in `page` from `slot` to the end of the page.
    pub fn run(&self, page: u32, layer: usize, slot: usize) -> KvPair<'_> {
        self.run_pages(page, 1, layer, slot)
    }

    /// K and V rows of `layer` from `slot` of `page` to the end of page
    /// `page + count - 1`, or of its chunk's last page if that comes first: one run,
    /// as a layer's consecutive pages of a chunk lie side by side.
    pub fn run_pages(&self, page: u32, count: usize, layer: usize, slot: usize) -> KvPair<'_> {
        assert!(
            count >= 1 && page as usize + count <= self.n_pages,
            "pages {page}..+{count} of {}",
            self.n_pages
        );
        let (first, pages) = self.chunk_of(page as usize);
        let count = count.min(first + pages - page as usize);
        let end = count * self.page_size * self.kv_dim;
        let (k, v) = (
            self.at(page, layer, false, 0),
            self.at(page, layer, true, 0),
        );
        let off = slot * self.kv_dim;
        (
            self.data.rows(k + off, k + end),
            self.data.rows(v + off, v + end),
        )
    }

    pub fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let _ = self.own(page);
        self.touch(page);
        for (row, src) in [(false, k), (true, v)] {
            let at = self.at(page, layer, row, slot);
            self.data.write(at, &src[..self.kv_dim]);
        }
    }

    /// All layers' K then V rows of `slot` in `page`, as their stored bytes
    /// (little-endian; 8-bit rows: the values, then the scales), appended to `out`
    /// (snapshots). A held slot must have been read back first ([`KvArena::sync`]).
    pub fn read_slot(&self, page: u32, slot: usize, out: &mut Vec<u8>) {
        debug_assert!(
            !self.held.range(page).contains(&slot),
            "page {page} slot {slot} is held"
        );
        for layer in 0..self.n_layers {
            for v in [false, true] {
                let at = self.at(page, layer, v, slot);
                self.data.get_bytes(at, at + self.kv_dim, out);
            }
        }
    }

    /// The inverse of [`KvArena::read_slot`]; `data` is [`KvArena::slot_bytes`] long.
    pub fn write_slot(&mut self, page: u32, slot: usize, data: &[u8]) {
        let _ = self.own(page);
        self.touch(page);
        self.put_slot(page, slot, data);
    }

    /// [`KvArena::write_slot`]'s bytes, the generation unchanged.
    fn put_slot(&mut self, page: u32, slot: usize, data: &[u8]) {
        let w = self.data.bytes_of(0, self.kv_dim);
        assert_eq!(data.len(), self.slot_bytes());
        for layer in 0..self.n_layers {
            for (j, v) in [false, true].into_iter().enumerate() {
                let at = self.at(page, layer, v, slot);
                let src = &data[(layer * 2 + j) * w..(layer * 2 + j + 1) * w];
                self.data.put_bytes(at, at + self.kv_dim, src);
            }
        }
    }

    /// The width of a slot's K (and V) row in one layer, and its head size.
    pub fn row_shape(&self) -> (usize, usize) {
        (self.kv_dim, self.head_dim)
    }

    /// Bytes per slot across all layers, K and V.
    pub fn slot_bytes(&self) -> usize {
        self.n_layers * 2 * self.dtype().row_bytes(self.kv_dim, self.head_dim)
    }

    /// What [`KvArena::slot_bytes`] would be for `dtype`.
    pub fn slot_bytes_as(&self, dtype: KvDtype) -> usize {
        self.n_layers * 2 * dtype.row_bytes(self.kv_dim, self.head_dim)
    }

    /// Whether every element (and 8-bit scale) of one slot's bytes, as
    /// [`KvArena::read_slot`] gives them, is a finite number.
    pub fn slot_finite(&self, data: &[u8]) -> bool {
        rows_finite(self.dtype(), self.row_shape(), data)
    }

    /// [`KvArena::slot_bytes`] in 16-bit units (a whole number: K and V of a layer
    /// are the same size).
    pub fn slot_halves(&self) -> usize {
        self.slot_bytes() / 2
    }

    /// Copies the first `n` slots of every layer's K and V from page `src` to `dst`, a
    /// page just reserved (its other slots hold nothing). Where `src`'s slots are held
    /// on the device, the device copies them and holds `dst`'s.
    pub fn copy_slots(&mut self, src: u32, dst: u32, n: usize) {
        self.fresh(dst);
        if n > 0 && !self.held.range(src).is_empty() {
            let device = self
                .held
                .device()
                .cloned()
                .expect("held pages have a device");
            let ends = ((src, self.generation(src)), (dst, self.generation(dst)));
            match device.copy(ends.0, ends.1, n) {
                Ok(true) => return self.held.hold(dst, 0..n),
                Ok(false) => {}
                Err(e) => tracing::error!("kv: copying page {src} on the device: {e}"),
            }
            if self.own(src).is_err() {
                // Neither copy could be made: the destination is held too, at a
                // generation the device never had, so reading it back fails (a save, a
                // spill) and so does a step that reads it, rather than using the host's
                // stale bytes.
                return self.held.hold(dst, 0..n);
            }
        }
        for layer in 0..self.n_layers {
            for v in [false, true] {
                let (s, d) = (self.at(src, layer, v, 0), self.at(dst, layer, v, 0));
                self.data.copy_within(s, d, n * self.kv_dim);
            }
        }
    }
}

/// Whether every value in `data`, K/V rows of `dtype` as [`KvArena::read_slot`] gives
/// them (`row_shape`: a row's width and head size), is finite: every f16 or f32
/// element, or an 8-bit row's f16 scales (its values are bytes). Whatever reads K/V
/// back from a file checks it so: a checksum is no authentication, and one NaN in
/// a sequence's K/V fails every step it joins.
pub fn rows_finite(dtype: KvDtype, (kv_dim, head_dim): (usize, usize), data: &[u8]) -> bool {
    let f16 = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 != 0x7c00;
    let w = dtype.row_bytes(kv_dim, head_dim);
    data.chunks(w.max(1)).all(|seg| match dtype {
        KvDtype::F16 => seg.chunks_exact(2).all(f16),
        KvDtype::F32 => seg
            .chunks_exact(4)
            .all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        KvDtype::Q8 => seg
            .get(kv_dim..)
            .is_some_and(|d| d.chunks_exact(2).all(f16)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::f32_to_f16;

    #[test]
    fn a_run_over_consecutive_pages_is_their_runs_end_to_end() {
        let (pages, layers, ps, d) = (7, 3, 4, 6);
        for (dtype, chunk) in [(KvDtype::F16, 3), (KvDtype::F32, 3), (KvDtype::F16, 7)] {
            let mut a = KvArena::new(pages, layers, ps, d, d, dtype).with_chunk(chunk);
            for (p, l, s) in (0..pages)
                .flat_map(|p| (0..layers).flat_map(move |l| (0..ps).map(move |s| (p, l, s))))
            {
                let x = (p * 100 + l * 10 + s) as f32;
                let k: Vec<f32> = (0..d).map(|i| x + i as f32 / 8.0).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                a.write(p as u32, l, s, &k, &v);
            }
            // (page, pages asked for, layer, slot): within a chunk, across its end
            // (the run stops there), the last (short) chunk.
            for (page, count, layer, slot) in [(0u32, 3, 2, 1), (1, 5, 0, 0), (6, 1, 1, 3)] {
                let (k, v) = a.run_pages(page, count, layer, slot);
                let got = count.min(chunk - page as usize % chunk);
                let (mut want_k, mut want_v) = (Vec::new(), Vec::new());
                for p in page..page + got as u32 {
                    let (pk, pv) = a.run(p, layer, if p == page { slot } else { 0 });
                    want_k.extend_from_slice(pk.raw());
                    want_v.extend_from_slice(pv.raw());
                }
                let what = format!("{dtype:?}, chunks of {chunk}, pages {page}..+{count}");
                assert_eq!(k.raw(), &want_k[..], "K of {what}");
                assert_eq!(v.raw(), &want_v[..], "V of {what}");
                // Every slot still reads back what was written to it.
                for (p, s) in (0..pages as u32).flat_map(|p| (0..ps).map(move |s| (p, s))) {
                    let x = (p as usize * 100 + layer * 10 + s) as f32;
                    let first = a.k_row(p, layer, s)[0];
                    let want = match dtype {
                        KvDtype::F16 => f32_to_f16(x),
                        KvDtype::F32 => x.to_bits() as u16,
                        KvDtype::Q8 => unreachable!("not tested here"),
                    };
                    assert_eq!(first, want, "slot {s} of page {p}, layer {layer}");
                }
            }
        }
    }

    /// 8-bit pages: a slot's bytes (values, then scales) read back through
    /// `read_slot`/`write_slot` and `copy_slots` unchanged, runs hold `q · d` within half
    /// a step of what was written (rotated), and a page is the real size (one byte per value, two
    /// per head row's scale).
    #[test]
    fn q8_slots_round_trip_and_pages_are_their_real_size() {
        let (pages, layers, ps, hd, heads) = (5, 2, 4, 8, 3);
        let d = hd * heads;
        let mut a = KvArena::new(pages, layers, ps, d, hd, KvDtype::Q8).with_chunk(2);
        assert_eq!(
            KvArena::page_bytes(layers, ps, d, hd, KvDtype::Q8),
            layers * 2 * ps * (d + 2 * heads)
        );
        assert_eq!(a.slot_bytes(), layers * 2 * (d + 2 * heads));
        let val = |p: usize, l: usize, s: usize, i: usize| {
            ((p * 31 + l * 7 + s * 3 + i) % 23) as f32 - 11.0
        };
        for (p, l, s) in
            (0..pages).flat_map(|p| (0..layers).flat_map(move |l| (0..ps).map(move |s| (p, l, s))))
        {
            let k: Vec<f32> = (0..d).map(|i| val(p, l, s, i)).collect();
            let v: Vec<f32> = k.iter().map(|x| x / 4.0).collect();
            a.write(p as u32, l, s, &k, &v);
        }
        for (p, l, s) in
            (0..pages).flat_map(|p| (0..layers).flat_map(move |l| (0..ps).map(move |s| (p, l, s))))
        {
            let (k, v) = a.run(p as u32, l, s);
            // The rows are stored rotated (`kernels::kv_rows`).
            let mut want: Vec<f32> = (0..d).map(|i| val(p, l, s, i)).collect();
            crate::kernels::rotate_heads(&mut want, hd);
            for (h, head) in want.chunks(hd).enumerate() {
                let step = head.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                for (j, &w) in head.iter().enumerate() {
                    let i = h * hd + j;
                    assert!((k.get(i) - w).abs() <= step * 0.51, "K {p} {l} {s} {i}");
                    assert!(
                        (v.get(i) - w / 4.0).abs() <= step * 0.26,
                        "V {p} {l} {s} {i}"
                    );
                }
            }
        }
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.read_slot(3, 1, &mut x);
        assert_eq!(x.len(), a.slot_bytes());
        a.write_slot(0, 2, &x);
        a.read_slot(0, 2, &mut y);
        assert_eq!(x, y);
        a.copy_slots(3, 4, 2);
        y.clear();
        a.read_slot(4, 1, &mut y);
        assert_eq!(x, y);
        assert!(a.slot_finite(&x));
        // A non-finite scale (the second f16 after the first K row's values) is caught.
        x[d + 2..d + 4].copy_from_slice(&0x7c00u16.to_le_bytes());
        assert!(!a.slot_finite(&x));
    }

    /// Every write of a page gives it a generation no page of any arena had before;
    /// reads leave it as it is.
    #[test]
    fn a_page_written_any_way_gets_a_new_generation_and_reads_keep_it() {
        let mut a = KvArena::new(3, 2, 4, 8, 8, KvDtype::F16);
        let b = KvArena::new(3, 2, 4, 8, 8, KvDtype::F16);
        let mut seen: Vec<u64> = (0..3).map(|p| a.generation(p)).collect();
        seen.extend((0..3).map(|p| b.generation(p)));
        let row = [1.0f32; 8];
        let check = |a: &KvArena, page: u32, seen: &mut Vec<u64>| {
            let g = a.generation(page);
            assert!(
                !seen.contains(&g),
                "page {page}: generation {g} seen before"
            );
            seen.push(g);
        };
        a.write(1, 1, 2, &row, &row);
        check(&a, 1, &mut seen);
        let mut bytes = Vec::new();
        a.read_slot(1, 2, &mut bytes);
        let _ = a.run(1, 0, 0);
        assert_eq!(
            a.generation(1),
            *seen.last().unwrap(),
            "reads change nothing"
        );
        a.write_slot(0, 3, &bytes);
        check(&a, 0, &mut seen);
        let before = a.generation(1);
        a.copy_slots(1, 2, 3);
        check(&a, 2, &mut seen);
        assert_eq!(
            a.generation(1),
            before,
            "a copy's source keeps its generation"
        );
    }

    #[test]
    #[should_panic(expected = "outside the arena")]
    fn a_page_past_the_pool_is_refused_not_aliased() {
        let a = KvArena::new(2, 2, 4, 8, 8, KvDtype::F16);
        let _ = a.k_row(2, 0, 0);
    }
}
