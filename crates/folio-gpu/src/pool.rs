//! The device's K/V pool: per layer a K and a V buffer of every page's slots,
//! addressed by the same page ids as the host pool (`page × page_size + slot`), in the
//! host storage's element type: two f16 per word, or (`--kv-dtype q8_0`) a slot's
//! 8-bit values four per word, then its scales, one f32 word per K/V head (the host's
//! f16 scales widened). It is made at the first step, sized from the host storage.
//!
//! # Which pages are uploaded
//!
//! The host storage is the truth (the backend contract): the kv layer changes pages
//! between steps without the backend seeing it (copy-on-write copies, snapshot
//! restores, disk read-back, a freed page given to another sequence). Each page of the
//! host's storage carries a generation ([`KvStorage::generation`]) that changes with
//! every write, to a number never used before. The pool keeps, per page, the
//! generation its copy was taken at and how many of the page's slots (from the first)
//! the copy holds. A step uploads a page's slots only where that record does not match
//! the host's page (another generation, or fewer slots than the step reads); after the
//! step, whose new rows the device wrote itself and the host stored bit for bit the
//! same (the step reads back the device's f16 rounding), the pages it wrote are
//! recorded at their new generations. Over 8-bit K/V the device quantizes its new rows
//! itself (for the step's own attention) and the host quantizes them again from the
//! f32 rows: the two may differ in a last bit (a division's rounding), so the pages a
//! step wrote are forgotten and go up again from the host when next read. A step that
//! fails forgets every page it was to write. Storage without generations is uploaded
//! every step.

use crate::device::Gpu;
use folio::kv::{KvRows, KvStorage};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What the device holds of one page: the host generation it was copied at (0: none)
/// and how many slots, from the first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Held {
    generation: u64,
    slots: usize,
}

/// Pages and bytes the pool uploaded, and the pages it found already held, since
/// the backend was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Pages uploaded (each step's pages counted once per step).
    pub pages: u64,
    /// Bytes uploaded, every layer's K and V.
    pub bytes: u64,
    /// Pages a step read that the device already held.
    pub skipped: u64,
}

/// The device's K/V pages.
pub(crate) struct Pool {
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    pub n_pages: usize,
    pub page_size: usize,
    /// 8-bit K/V (the host storage's type).
    pub q8: bool,
    kv_dim: usize,
    head_dim: usize,
    held: Vec<Held>,
    stats: Uploads,
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

    fn add(&self, f: impl FnOnce(&mut UploadStats)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

impl Pool {
    /// A pool of `n_pages` pages of `page_size` slots for `n_layers` layers of
    /// `kv_dim` wide K and V rows of `head_dim` heads, 8-bit or f16; `Err` if a layer's
    /// buffer is larger than the device binds.
    pub fn new(
        gpu: &Gpu,
        n_layers: usize,
        (n_pages, page_size): (usize, usize),
        (kv_dim, head_dim): (usize, usize),
        q8: bool,
        stats: Uploads,
    ) -> Result<Self, String> {
        let slot_words = slot_words(q8, kv_dim, head_dim);
        let bytes = (n_pages * page_size * slot_words * 4) as u64;
        if bytes > gpu.max_binding() {
            return Err(format!(
                "a layer's K/V pool takes {bytes} bytes ({n_pages} pages of {page_size}), \
                 more than the device binds ({}): use fewer pages",
                gpu.max_binding()
            ));
        }
        let make = |what: &str| -> Vec<_> {
            (0..n_layers)
                .map(|l| gpu.scratch(&format!("{what} pool {l}"), bytes))
                .collect()
        };
        Ok(Pool {
            k: make("k"),
            v: make("v"),
            n_pages,
            page_size,
            q8,
            kv_dim,
            head_dim,
            held: vec![Held::default(); n_pages],
            stats,
        })
    }

    /// Slots `0..n` of each page of `reads`, every layer, from `kv` to the device,
    /// unless the device holds them at the host's generation (module doc).
    pub fn upload(
        &mut self,
        gpu: &Gpu,
        kv: &dyn KvStorage,
        reads: &BTreeMap<u32, usize>,
    ) -> Result<(), String> {
        let d = self.kv_dim;
        let slot_words = slot_words(self.q8, d, self.head_dim);
        let mut bits = Vec::new();
        let mut words: Vec<u32> = Vec::new();
        for (&page, &n) in reads {
            let generation = kv.generation(page);
            let held = self.held[page as usize];
            if generation.is_some_and(|g| g == held.generation && n <= held.slots) {
                self.stats.add(|s| s.skipped += 1);
                continue;
            }
            // Until the copy below is queued the record says nothing is held (an
            // error on the way leaves it so).
            self.held[page as usize] = Held::default();
            let at = (page as usize * self.page_size * slot_words * 4) as u64;
            let mut sent = 0;
            for layer in 0..self.k.len() {
                let (k, v) = kv.run(page, layer, 0);
                for (rows, buf) in [(k, &self.k[layer]), (v, &self.v[layer])] {
                    if matches!(rows, KvRows::Q8 { .. }) != self.q8 {
                        return Err("the K/V storage changed its element type".into());
                    }
                    let bytes: &[u8] = match rows {
                        KvRows::F16(x) => bytemuck::cast_slice(&x[..n * d]),
                        KvRows::F32(x) => {
                            bits.clear();
                            bits.extend(
                                x[..n * d].iter().map(|&f| half::f16::from_f32(f).to_bits()),
                            );
                            bytemuck::cast_slice(&bits)
                        }
                        KvRows::Q8 { q, d: scales, hd } => {
                            // Per slot: its values four to a word, then its heads'
                            // scales as f32.
                            words.clear();
                            for s in 0..n {
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
                    gpu.queue.write_buffer(buf, at, bytes);
                    sent += bytes.len() as u64;
                }
            }
            self.stats.add(|s| {
                s.pages += 1;
                s.bytes += sent;
            });
            self.held[page as usize] = Held {
                generation: generation.unwrap_or(0),
                slots: n,
            };
        }
        Ok(())
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

    /// After a step stored its rows in `kv` (`before`: [`Pool::before_writes`]): each
    /// written page is held at its new generation, with the slots the device held
    /// before (if its record matched the page then) and those the step wrote, where
    /// the two are contiguous.
    pub fn wrote(
        &mut self,
        kv: &dyn KvStorage,
        writes: &BTreeMap<u32, (usize, usize)>,
        before: &[Option<u64>],
    ) {
        for ((&page, &(a, b)), was) in writes.iter().zip(before) {
            let held = self.held[page as usize];
            let valid = match was {
                Some(g) if *g == held.generation => held.slots,
                _ => 0,
            };
            self.held[page as usize] = match kv.generation(page) {
                Some(generation) => Held {
                    generation,
                    slots: if a <= valid { valid.max(b) } else { valid },
                },
                None => Held::default(),
            };
        }
    }

    /// Forgets what the device holds of `pages` (a step that failed may have written
    /// some of their slots on the device and none on the host).
    pub fn forget<'a>(&mut self, pages: impl IntoIterator<Item = &'a u32>) {
        for &p in pages {
            self.held[p as usize] = Held::default();
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
