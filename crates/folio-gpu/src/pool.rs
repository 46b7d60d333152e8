//! The device's K/V pool: per layer a K and a V buffer of every page's slots,
//! addressed by the same page ids as the host pool (`page × page_size + slot`), in the
//! host storage's element type: two f16 per word, or (`--kv-dtype q8_0`) a slot's
//! 8-bit values four per word, then its scales, one f32 word per K/V head (the host's
//! f16 scales widened). It is made at a host storage's first step, sized from it, and
//! belongs to that storage ([`KvStorage::identity`]): another storage gets a pool of
//! its own.
//!
//! # Where K/V lives
//!
//! The rows a step computes stay on the device: the host storage records them as held
//! there ([`KvStorage::hold`]) and reads them back through this pool only when the
//! host needs their bytes (a snapshot's file, the disk tier, a host write into the
//! page: `folio::kv`'s `held.rs`, and `held.rs` here); a copy-on-write copy of a held
//! page is made on the device. A storage that cannot hold rows (no identity) gets
//! every new row written back through [`KvStorage::write`] after each step.
//!
//! # Which pages are uploaded
//!
//! The kv layer changes pages between steps without the backend seeing it (host
//! copies, snapshot restores, disk read-back, a freed page given to another sequence).
//! Each page of the host's storage carries a generation ([`KvStorage::generation`])
//! that changes with every write, to a number never used before. The pool keeps, per
//! page, the generation its copy was taken at and how many of the page's slots (from
//! the first) it holds. A step uploads a page's slots only where that record does not
//! cover what the step reads: the whole page read where the generation differs, only
//! the slots past those held where it matches. After the step, the pages it wrote are
//! recorded at their new generations, with the slots held before and those written.
//! A step that fails keeps, of each page it was to write, the slots before its first
//! row there; an upload that fails keeps, of each page it was sending, the slots held
//! before. Storage without generations is uploaded every step.

use crate::device::Gpu;
use folio::kv::{KvRows, KvStorage};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the device holds of one page: the host generation it was copied at (0: none)
/// and how many slots, from the first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub generation: u64,
    pub slots: usize,
}

/// What moved between host and device since the backend was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Pages uploaded (each step's pages counted once per step).
    pub pages: u64,
    /// Bytes uploaded, every layer's K and V.
    pub bytes: u64,
    /// Pages a step read that the device already held.
    pub skipped: u64,
    /// Pages read back to the host (snapshots, the disk tier, host writes).
    pub fetched_pages: u64,
    /// Bytes of those read-backs.
    pub fetched_bytes: u64,
    /// Copy-on-write copies made on the device.
    pub device_copies: u64,
    /// Bytes of new rows' K and V sent back after steps (storage that holds none).
    pub written_back: u64,
}

/// The device's K/V pages.
pub(crate) struct Pool {
    pub gpu: Gpu,
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    pub n_pages: usize,
    pub page_size: usize,
    /// 8-bit K/V (the host storage's type).
    pub q8: bool,
    pub kv_dim: usize,
    pub head_dim: usize,
    /// The host storage it belongs to ([`KvStorage::identity`]): `None` for storage
    /// that holds no rows on the device.
    pub owner: Option<u64>,
    held: Mutex<Vec<Held>>,
    /// The pages the last upload was sending, each with the slots held before.
    sending: Mutex<Vec<(u32, usize)>>,
    pub stats: Uploads,
}

/// A handle on a backend's [`UploadStats`] (its pools, one after another, count into
/// it).
#[derive(Debug, Clone, Default)]
pub struct Uploads(Arc<Mutex<UploadStats>>);

impl Uploads {
    /// The counts so far.
    pub fn get(&self) -> UploadStats {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, f: impl FnOnce(&mut UploadStats)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

impl Pool {
    /// A pool of `n_pages` pages of `page_size` slots for `n_layers` layers of
    /// `kv_dim` wide K and V rows of `head_dim` heads, 8-bit or f16, for the storage
    /// `owner`; `Err` if a layer's buffer is larger than the device binds.
    pub fn new(
        gpu: &Gpu,
        n_layers: usize,
        (n_pages, page_size): (usize, usize),
        (kv_dim, head_dim): (usize, usize),
        (q8, owner): (bool, Option<u64>),
        stats: Uploads,
    ) -> Result<Self, String> {
        let page_bytes = (page_size * slot_words(q8, kv_dim, head_dim) * 4) as u64;
        let bytes = n_pages as u64 * page_bytes;
        if bytes > gpu.max_binding() {
            return Err(format!(
                "a layer's K/V pool takes {bytes} bytes ({n_pages} pages of {page_size}), \
                 more than the device binds ({}): at most {} pages fit",
                gpu.max_binding(),
                gpu.max_binding() / page_bytes
            ));
        }
        let make = |what: &str| -> Vec<_> {
            (0..n_layers)
                .map(|l| gpu.scratch(&format!("{what} pool {l}"), bytes))
                .collect()
        };
        Ok(Pool {
            gpu: gpu.clone(),
            k: make("k"),
            v: make("v"),
            n_pages,
            page_size,
            q8,
            kv_dim,
            head_dim,
            owner,
            held: Mutex::new(vec![Held::default(); n_pages]),
            sending: Mutex::default(),
            stats,
        })
    }

    pub(crate) fn held(&self) -> MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of one slot of one layer's K (or V) on the device.
    pub fn slot_bytes(&self) -> usize {
        slot_words(self.q8, self.kv_dim, self.head_dim) * 4
    }

    /// Where slot `slot` of `page` starts in a layer's buffer.
    pub fn at(&self, page: u32, slot: usize) -> u64 {
        ((page as usize * self.page_size + slot) * self.slot_bytes()) as u64
    }

    /// Slots `0..n` of each page of `reads`, every layer, from `kv` to the device,
    /// but those the device holds at the host's generation (module doc).
    pub fn upload(&self, kv: &dyn KvStorage, reads: &BTreeMap<u32, usize>) -> Result<(), String> {
        let d = self.kv_dim;
        let mut held = self.held();
        let mut sending = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        sending.clear();
        let mut bits = Vec::new();
        let mut words: Vec<u32> = Vec::new();
        for (&page, &n) in reads {
            let generation = kv.generation(page);
            let had = held[page as usize];
            let from = match generation {
                Some(g) if g == had.generation => had.slots,
                _ => 0,
            };
            if n <= from {
                self.stats.add(|s| s.skipped += 1);
                continue;
            }
            if from == 0 && !kv.held_slots(page).is_empty() {
                return Err(format!(
                    "page {page}: K/V the host left on the device is not there \
                     (the device holds generation {}, the host has {generation:?})",
                    had.generation
                ));
            }
            // Until the copy below is queued the record says only the slots before it
            // are held (an error on the way leaves it so).
            held[page as usize].slots = from;
            sending.push((page, from));
            let at = self.at(page, from);
            let mut sent = 0;
            for layer in 0..self.k.len() {
                let (k, v) = kv.run(page, layer, from);
                for (rows, buf) in [(k, &self.k[layer]), (v, &self.v[layer])] {
                    if matches!(rows, KvRows::Q8 { .. }) != self.q8 {
                        return Err("the K/V storage changed its element type".into());
                    }
                    let m = n - from;
                    let bytes: &[u8] = match rows {
                        KvRows::F16(x) => bytemuck::cast_slice(&x[..m * d]),
                        KvRows::F32(x) => {
                            bits.clear();
                            bits.extend(
                                x[..m * d].iter().map(|&f| half::f16::from_f32(f).to_bits()),
                            );
                            bytemuck::cast_slice(&bits)
                        }
                        KvRows::Q8 { q, d: scales, hd } => {
                            // Per slot: its values four to a word, then its heads'
                            // scales as f32.
                            words.clear();
                            for s in 0..m {
                                let qs = &q[s * d..(s + 1) * d];
                                words.extend(qs.chunks_exact(4).map(|b| {
                                    u32::from_le_bytes([
                                        b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8,
                                    ])
                                }));
                                let ds = &scales[s * d / hd..(s + 1) * d / hd];
                                words.extend(
                                    ds.iter()
                                        .map(|&h| half::f16::from_bits(h).to_f32().to_bits()),
                                );
                            }
                            bytemuck::cast_slice(&words)
                        }
                    };
                    self.gpu.queue.write_buffer(buf, at, bytes);
                    sent += bytes.len() as u64;
                }
            }
            self.stats.add(|s| {
                s.pages += 1;
                s.bytes += sent;
            });
            held[page as usize] = Held {
                generation: generation.unwrap_or(0),
                slots: n,
            };
        }
        Ok(())
    }

    /// After a failed upload: of the pages it was sending, only the slots held before
    /// stay held (a refused write may have reached some of the rest, or none).
    pub fn forget_sent(&self) {
        let sending = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        let mut held = self.held();
        for &(p, from) in sending.iter() {
            let h = &mut held[p as usize];
            h.slots = h.slots.min(from);
        }
    }

    /// The generation each page of `writes` (page → the slots `a..b` a step writes in
    /// it) has now, before the step's rows are stored: what [`Pool::wrote`] checks.
    pub fn before_writes(
        &self,
        kv: &dyn KvStorage,
        writes: &BTreeMap<u32, (usize, usize)>,
    ) -> Vec<Option<u64>> {
        writes.keys().map(|&p| kv.generation(p)).collect()
    }

    /// After a step's rows were stored in `kv` or held there (`before`:
    /// [`Pool::before_writes`]): each written page is held at its new generation, with
    /// the slots the device held before (if its record matched the page then) and
    /// those the step wrote, where the two are contiguous.
    pub fn wrote(
        &self,
        kv: &dyn KvStorage,
        writes: &BTreeMap<u32, (usize, usize)>,
        before: &[Option<u64>],
    ) {
        let mut held = self.held();
        for ((&page, &(a, b)), was) in writes.iter().zip(before) {
            let had = held[page as usize];
            let valid = match was {
                Some(g) if *g == had.generation => had.slots,
                _ => 0,
            };
            held[page as usize] = match kv.generation(page) {
                Some(generation) => Held {
                    generation,
                    slots: if a <= valid { valid.max(b) } else { valid },
                },
                None => Held::default(),
            };
        }
    }

    /// After a failed step: of each page it was to write (slots `a..b`), the device
    /// holds only the slots before `a` (it may have written some of the others, which
    /// the host never got).
    pub fn failed(&self, writes: &BTreeMap<u32, (usize, usize)>) {
        let mut held = self.held();
        for (&page, &(a, _)) in writes {
            let h = &mut held[page as usize];
            h.slots = h.slots.min(a);
        }
    }

    /// Forgets what the device holds of `pages` (8-bit rows written back to a storage
    /// that quantized them again: its bits may differ in a last place).
    pub fn forget<'a>(&self, pages: impl IntoIterator<Item = &'a u32>) {
        let mut held = self.held();
        for &p in pages {
            held[p as usize] = Held::default();
        }
    }
}

/// 32-bit words one slot of one layer's K (or V) takes on the device.
pub(crate) fn slot_words(q8: bool, kv_dim: usize, head_dim: usize) -> usize {
    match q8 {
        true => kv_dim / 4 + kv_dim / head_dim,
        false => kv_dim / 2,
    }
}
