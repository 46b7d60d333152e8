//! The device's K/V pool: per layer a K and a V buffer of every page's slots, two f16
//! per word, addressed by the same page ids as the host pool (`page × page_size +
//! slot`). It is made at the first step, sized from the host storage.
//!
//! # Which pages are uploaded
//!
//! The host storage is the truth (the backend contract): the kv layer changes pages
//! between steps without the backend seeing it (copy-on-write copies, snapshot
//! restores, disk read-back, a freed page given to another sequence). This first
//! version keeps no record of what the device holds: every step uploads, from the
//! host storage, every slot its rows read that the step does not write itself (each
//! sequence's positions before its first new token). The device pool is thus never
//! trusted across steps; what it saves is the host → device copy of the step's own
//! rows, which attention reads right after they are computed. A generation count per
//! page in the kv layer would let a step skip the pages the device already holds.

use crate::device::Gpu;
use folio::kv::{KvRows, KvStorage};
use std::collections::BTreeMap;

/// The device's K/V pages.
pub(crate) struct Pool {
    pub k: Vec<wgpu::Buffer>,
    pub v: Vec<wgpu::Buffer>,
    pub n_pages: usize,
    pub page_size: usize,
    kv_dim: usize,
}

impl Pool {
    /// A pool of `n_pages` pages of `page_size` slots for `n_layers` layers of
    /// `kv_dim` wide K and V rows; `Err` if a layer's buffer is larger than the device
    /// binds.
    pub fn new(
        gpu: &Gpu,
        n_layers: usize,
        n_pages: usize,
        page_size: usize,
        kv_dim: usize,
    ) -> Result<Self, String> {
        let bytes = (n_pages * page_size * kv_dim * 2) as u64;
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
            kv_dim,
        })
    }

    /// Slots `0..n` of each page of `reads`, every layer, from `kv` to the device.
    pub fn upload(
        &self,
        gpu: &Gpu,
        kv: &dyn KvStorage,
        reads: &BTreeMap<u32, usize>,
    ) -> Result<(), String> {
        let d = self.kv_dim;
        let mut bits = Vec::new();
        for (&page, &n) in reads {
            let at = (page as usize * self.page_size * d * 2) as u64;
            for layer in 0..self.k.len() {
                let (k, v) = kv.run(page, layer, 0);
                for (rows, buf) in [(k, &self.k[layer]), (v, &self.v[layer])] {
                    let bytes: &[u8] = match rows {
                        KvRows::F16(x) => bytemuck::cast_slice(&x[..n * d]),
                        KvRows::F32(x) => {
                            bits.clear();
                            bits.extend(
                                x[..n * d].iter().map(|&f| half::f16::from_f32(f).to_bits()),
                            );
                            bytemuck::cast_slice(&bits)
                        }
                        KvRows::Q8 { .. } => {
                            return Err("an 8-bit K/V pool is not read by the gpu backend yet \
                                        (use --kv-dtype f16)"
                                .into())
                        }
                    };
                    gpu.queue.write_buffer(buf, at, bytes);
                }
            }
        }
        Ok(())
    }
}
