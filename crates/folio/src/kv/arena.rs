//! The K/V bytes of every page: one f16 allocation for the whole pool.
//!
//! Layout: `[page][layer][K | V][slot][kv_dim]`. A page's K rows for one layer are
//! contiguous (`page_size × kv_dim` halves), so attention walks a page's keys as one
//! slice; copying a page (fork, copy-on-write) is one contiguous copy per page.

use crate::kernels::quant::f32_to_f16;

/// f16 K/V storage for `n_pages` pages.
pub struct KvArena {
    data: Vec<u16>,
    n_layers: usize,
    page_size: usize,
    kv_dim: usize,
}

impl KvArena {
    pub fn new(n_pages: usize, n_layers: usize, page_size: usize, kv_dim: usize) -> Self {
        Self {
            data: vec![0; n_pages * n_layers * 2 * page_size * kv_dim],
            n_layers,
            page_size,
            kv_dim,
        }
    }

    /// Bytes of K/V one page holds.
    pub fn page_bytes(n_layers: usize, page_size: usize, kv_dim: usize) -> usize {
        n_layers * 2 * page_size * kv_dim * 2
    }

    fn at(&self, page: u32, layer: usize, v: bool, slot: usize) -> usize {
        let ps = self.page_size * self.kv_dim;
        ((page as usize * self.n_layers + layer) * 2 + usize::from(v)) * ps + slot * self.kv_dim
    }

    pub fn k_row(&self, page: u32, layer: usize, slot: usize) -> &[u16] {
        let at = self.at(page, layer, false, slot);
        &self.data[at..at + self.kv_dim]
    }

    pub fn v_row(&self, page: u32, layer: usize, slot: usize) -> &[u16] {
        let at = self.at(page, layer, true, slot);
        &self.data[at..at + self.kv_dim]
    }

    /// K and V rows of `layer` in `page` from `slot` to the end of the page.
    pub fn run(&self, page: u32, layer: usize, slot: usize) -> (&[u16], &[u16]) {
        let end = self.page_size * self.kv_dim;
        let (k, v) = (
            self.at(page, layer, false, 0),
            self.at(page, layer, true, 0),
        );
        let off = slot * self.kv_dim;
        (&self.data[k + off..k + end], &self.data[v + off..v + end])
    }

    pub fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        for (row, src) in [(false, k), (true, v)] {
            let at = self.at(page, layer, row, slot);
            for (d, s) in self.data[at..at + self.kv_dim].iter_mut().zip(src) {
                *d = f32_to_f16(*s);
            }
        }
    }

    /// All layers' K then V rows of `slot` in `page`, appended to `out` (snapshots).
    pub fn read_slot(&self, page: u32, slot: usize, out: &mut Vec<u16>) {
        for layer in 0..self.n_layers {
            out.extend_from_slice(self.k_row(page, layer, slot));
            out.extend_from_slice(self.v_row(page, layer, slot));
        }
    }

    /// The inverse of [`KvArena::read_slot`]; `data` is `n_layers · 2 · kv_dim` halves.
    pub fn write_slot(&mut self, page: u32, slot: usize, data: &[u16]) {
        let d = self.kv_dim;
        for layer in 0..self.n_layers {
            for (j, v) in [false, true].into_iter().enumerate() {
                let at = self.at(page, layer, v, slot);
                let src = &data[(layer * 2 + j) * d..(layer * 2 + j + 1) * d];
                self.data[at..at + d].copy_from_slice(src);
            }
        }
    }

    /// Halves per slot across all layers, K and V.
    pub fn slot_halves(&self) -> usize {
        self.n_layers * 2 * self.kv_dim
    }

    /// Copies the first `n` slots of every layer's K and V from page `src` to `dst`.
    pub fn copy_slots(&mut self, src: u32, dst: u32, n: usize) {
        for layer in 0..self.n_layers {
            for v in [false, true] {
                let (s, d) = (self.at(src, layer, v, 0), self.at(dst, layer, v, 0));
                self.data.copy_within(s..s + n * self.kv_dim, d);
            }
        }
    }
}
