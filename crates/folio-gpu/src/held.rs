//! The device pool as the host storage reaches it ([`DevicePages`]): the K/V a step
//! left on the device read back when the host needs the bytes (a snapshot's file, the
//! disk tier, a host write into the page), and copy-on-write copies of held pages made
//! on the device (`folio::kv`'s `held.rs` states when each happens).

use crate::pool::{Held, Pool};
use folio::kv::{DevicePages, Fetch, KvDtype};

/// The most bytes one read-back maps at a time (a long snapshot takes several).
const READ_BACK_BYTES: usize = 64 << 20;

impl DevicePages for Pool {
    fn fetch(&self, pages: &[Fetch], dtype: KvDtype) -> Result<Vec<Vec<u8>>, String> {
        if let Some(why) = self.gpu.lost() {
            return Err(why);
        }
        let layers = self.k.len();
        let per_slot = layers * 2 * self.slot_bytes();
        // How many of each page's asked slots the device holds at its generation.
        let counts = {
            let held = self.held();
            pages
                .iter()
                .map(|f| match held[f.page as usize] {
                    Held { generation, slots } if generation == f.generation => {
                        Ok(slots.min(f.slots.end).saturating_sub(f.slots.start))
                    }
                    Held { generation, .. } => Err(format!(
                        "page {} is generation {generation} on the device, {} on the host",
                        f.page, f.generation
                    )),
                })
                .collect::<Result<Vec<usize>, String>>()?
        };
        let mut out = Vec::with_capacity(pages.len());
        let mut i = 0;
        while i < pages.len() {
            // Pages from `i` while they fit one read-back (at least one).
            let mut end = i + 1;
            let mut bytes = counts[i] * per_slot;
            while end < pages.len() && bytes + counts[end] * per_slot <= READ_BACK_BYTES {
                bytes += counts[end] * per_slot;
                end += 1;
            }
            let words = self.read_back(&pages[i..end], &counts[i..end], bytes)?;
            let mut at = 0;
            for &n in &counts[i..end] {
                let len = n * per_slot / 4;
                out.push(self.host_bytes(&words[at..at + len], n, dtype));
                at += len;
            }
            self.stats.add(|s| {
                s.fetched_pages += (end - i) as u64;
                s.fetched_bytes += bytes as u64;
            });
            i = end;
        }
        Ok(out)
    }

    fn copy(&self, src: (u32, u64), dst: (u32, u64), n: usize) -> Result<bool, String> {
        let mut held = self.held();
        let h = held[src.0 as usize];
        if h.generation != src.1 || h.slots < n {
            return Ok(false);
        }
        // Through a buffer between: a copy may not read and write one buffer.
        let len = (n * self.slot_bytes()) as u64;
        let layers = self.k.len() as u64;
        let gpu = &self.gpu;
        gpu.scoped(|| {
            let between = gpu.scratch("page copy", len * 2 * layers);
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let bufs = self.k.iter().chain(&self.v).enumerate();
            for (i, buf) in bufs.clone() {
                enc.copy_buffer_to_buffer(buf, self.at(src.0, 0), &between, i as u64 * len, len);
            }
            for (i, buf) in bufs {
                enc.copy_buffer_to_buffer(&between, i as u64 * len, buf, self.at(dst.0, 0), len);
            }
            gpu.queue.submit([enc.finish()]);
            Ok(())
        })?;
        held[dst.0 as usize] = Held {
            generation: dst.1,
            slots: n,
        };
        self.stats.add(|s| s.device_copies += 1);
        Ok(true)
    }
}

impl Pool {
    /// `counts[j]` slots of each of `pages` from its first asked one, every layer's K
    /// then V, in one read-back of `bytes`: per page, per layer, K's slots then V's (as
    /// the device lays them).
    fn read_back(
        &self,
        pages: &[Fetch],
        counts: &[usize],
        bytes: usize,
    ) -> Result<Vec<u32>, String> {
        let gpu = &self.gpu;
        gpu.scoped(|| {
            let staging = gpu.staging(bytes as u64);
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let mut at = 0;
            for (f, &n) in pages.iter().zip(counts) {
                let len = (n * self.slot_bytes()) as u64;
                for (k, v) in self.k.iter().zip(&self.v) {
                    for buf in [k, v] {
                        if len > 0 {
                            let from = self.at(f.page, f.slots.start);
                            enc.copy_buffer_to_buffer(buf, from, &staging, at, len);
                        }
                        at += len;
                    }
                }
            }
            let floats = gpu.finish(enc, &staging, bytes as u64)?;
            let mut words: Vec<u32> = bytemuck::cast_slice(&floats).to_vec();
            words.truncate(bytes / 4);
            Ok(words)
        })
    }

    /// `n` slots of one page as the device lays them (`[layer][K | V][slot][word]`) in
    /// the host's layout for `dtype`: per slot, every layer's K row then V row, each
    /// as the host's [`folio::kv::KvArena::read_slot`] gives it.
    fn host_bytes(&self, words: &[u32], n: usize, dtype: KvDtype) -> Vec<u8> {
        let sw = self.slot_bytes() / 4;
        let layers = self.k.len();
        let (d, heads) = (self.kv_dim, self.kv_dim / self.head_dim);
        let mut out = Vec::with_capacity(n * layers * 2 * d * 4);
        for slot in 0..n {
            for layer in 0..layers {
                for kv in 0..2 {
                    let at = ((layer * 2 + kv) * n + slot) * sw;
                    let row = &words[at..at + sw];
                    match dtype {
                        KvDtype::F16 => row
                            .iter()
                            .for_each(|w| out.extend_from_slice(&w.to_le_bytes())),
                        KvDtype::F32 => row.iter().for_each(|&w| {
                            for h in [w as u16, (w >> 16) as u16] {
                                let x = half::f16::from_bits(h).to_f32();
                                out.extend_from_slice(&x.to_le_bytes());
                            }
                        }),
                        KvDtype::Q8 => {
                            let (q, scales) = row.split_at(d / 4);
                            q.iter()
                                .for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
                            for &s in &scales[..heads] {
                                let h = half::f16::from_f32(f32::from_bits(s)).to_bits();
                                out.extend_from_slice(&h.to_le_bytes());
                            }
                        }
                    }
                }
            }
        }
        out
    }
}
