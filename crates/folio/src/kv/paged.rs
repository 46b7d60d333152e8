//! The paged cache as the model sees it: a [`PagedKv`] pool (page store + K/V arena)
//! shared by any number of sequences, and [`PagedSeq`], one sequence's view of it
//! (its page table), which implements the model's [`KvCache`].

use super::arena::KvArena;
use super::buf::{KvDtype, KvRows};
use super::hash::{Hasher128, PageHash};
use super::store::{KvError, PageStore};
use super::table::PageTable;
use crate::error::RunError;
use crate::model::{KvBatch, KvCache};

/// One pool of pages for all sequences of a model.
pub struct PagedKv {
    pub store: PageStore,
    pub(crate) arena: KvArena,
    root: PageHash,
    /// The model's context length: no sequence grows past it.
    max_tokens: usize,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) snapshots: std::collections::HashMap<String, PageTable>,
    pub(crate) snapshot_dir: Option<std::path::PathBuf>,
}

impl PagedKv {
    /// `n_pages` pages of `page_size` tokens for a model with `n_layers` layers of
    /// `kv_dim`-wide K/V, stored as f16; `fingerprint` identifies the model in the
    /// prefix hashes.
    pub fn new(
        n_pages: usize,
        page_size: usize,
        n_layers: usize,
        kv_dim: usize,
        max_tokens: usize,
        fingerprint: &[u8],
    ) -> Self {
        let shape = (n_pages, page_size, n_layers, kv_dim);
        Self::with_dtype(shape, max_tokens, fingerprint, KvDtype::F16)
    }

    /// Like [`PagedKv::new`] with K/V stored as `dtype`; `shape` is
    /// `(n_pages, page_size, n_layers, kv_dim)`.
    pub fn with_dtype(
        shape: (usize, usize, usize, usize),
        max_tokens: usize,
        fingerprint: &[u8],
        dtype: KvDtype,
    ) -> Self {
        let (n_pages, page_size, n_layers, kv_dim) = shape;
        // The dtype is part of the chain root: pages of different dtypes never match.
        let mut salted = fingerprint.to_vec();
        if dtype != KvDtype::F16 {
            salted.extend_from_slice(b":f32");
        }
        Self {
            store: PageStore::new(n_pages, page_size),
            arena: KvArena::new(n_pages, n_layers, page_size, kv_dim, dtype),
            root: Hasher128::root(&salted, page_size, b""),
            max_tokens,
            fingerprint: fingerprint
                .iter()
                .copied()
                .chain(std::iter::repeat(0))
                .take(16)
                .collect(),
            snapshots: Default::default(),
            snapshot_dir: None,
        }
    }

    /// An empty page table in this pool's chain (optionally salted per tenant).
    pub fn new_table(&self, salt: Option<&[u8]>) -> PageTable {
        match salt {
            None => PageTable::new(self.root),
            Some(s) => PageTable::new(Hasher128::root(&self.root.0.to_le_bytes(), 0, s)),
        }
    }

    /// A sequence view of `table` for the forward pass.
    pub fn seq<'a>(&'a mut self, table: &'a mut PageTable) -> PagedSeq<'a> {
        PagedSeq { kv: self, table }
    }

    /// Forks a table (committed pages shared, the partial page and its K/V copied).
    pub fn fork(&mut self, t: &mut PageTable) -> Result<PageTable, KvError> {
        let f = self.store.fork(t)?;
        self.apply_copies();
        Ok(f)
    }

    /// Releases a table's pages.
    pub fn release(&mut self, t: PageTable) -> Result<(), KvError> {
        self.store.release_table(t)
    }

    pub(crate) fn apply_copies(&mut self) {
        for (src, dst, n) in self.store.copies.drain(..) {
            self.arena.copy_slots(src.0, dst.0, n);
        }
    }
}

/// One sequence of a [`PagedKv`].
pub struct PagedSeq<'a> {
    kv: &'a mut PagedKv,
    table: &'a mut PageTable,
}

fn out_of_pages(e: KvError) -> RunError {
    RunError::Kv(e.to_string())
}

impl PagedKv {
    fn page_slot(&self, t: &PageTable, pos: usize) -> (u32, usize) {
        let ps = self.store.page_size();
        (t.page(pos / ps).0, pos % ps)
    }

    /// Pushes slots for `tokens` onto `t`, all or nothing.
    pub fn seq_begin(&mut self, t: &mut PageTable, tokens: &[u32]) -> Result<(), RunError> {
        let len = t.len();
        if len + tokens.len() > self.max_tokens {
            return Err(RunError::ContextFull {
                pos: len + tokens.len() - 1,
                capacity: self.max_tokens,
            });
        }
        for (i, &tok) in tokens.iter().enumerate() {
            if let Err(e) = self.store.push(t, tok) {
                // All or nothing: give back what this call took.
                self.store.truncate(t, i).map_err(out_of_pages)?;
                return Err(out_of_pages(e));
            }
        }
        Ok(())
    }

    /// Writes K/V of position `pos` of `t` (which must hold it).
    pub fn seq_write(
        &mut self,
        t: &PageTable,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), RunError> {
        if pos >= t.len() {
            return Err(RunError::ContextFull {
                pos,
                capacity: t.len(),
            });
        }
        let (page, slot) = self.page_slot(t, pos);
        self.arena.write(page, layer, slot, k, v);
        Ok(())
    }

    /// K/V rows of `t` from `pos` to the end of its page.
    pub fn seq_kv_run(&self, t: &PageTable, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>) {
        let (page, slot) = self.page_slot(t, pos);
        self.arena.run(page, layer, slot)
    }

    /// Commits the full pages of `t` after a forward step.
    pub fn seq_finish(&mut self, t: &mut PageTable) -> Result<(), RunError> {
        self.store.commit_full(t).map_err(out_of_pages)
    }

    /// Gives back the last `n` begun tokens of `t`.
    pub fn seq_abort(&mut self, t: &mut PageTable, n: usize) {
        let _ = self.store.truncate(t, n);
        self.apply_copies();
    }

    /// A batch view of several tables for one forward step.
    pub fn batch<'a>(&'a mut self, tables: Vec<&'a mut PageTable>) -> PagedBatch<'a> {
        PagedBatch { kv: self, tables }
    }
}

/// Several sequences of one [`PagedKv`] in one forward step.
pub struct PagedBatch<'a> {
    kv: &'a mut PagedKv,
    tables: Vec<&'a mut PageTable>,
}

impl KvBatch for PagedBatch<'_> {
    fn seqs(&self) -> usize {
        self.tables.len()
    }
    fn seq_len(&self, s: usize) -> usize {
        self.tables[s].len()
    }
    fn begin(&mut self, s: usize, tokens: &[u32]) -> Result<(), RunError> {
        self.kv.seq_begin(self.tables[s], tokens)
    }
    fn write(
        &mut self,
        s: usize,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), RunError> {
        self.kv.seq_write(self.tables[s], layer, pos, k, v)
    }
    fn kv_run(&self, s: usize, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>) {
        self.kv.seq_kv_run(self.tables[s], layer, pos)
    }
    fn finish(&mut self, s: usize) -> Result<(), RunError> {
        self.kv.seq_finish(self.tables[s])
    }
    fn abort(&mut self, s: usize, n: usize) {
        self.kv.seq_abort(self.tables[s], n)
    }
}

impl KvCache for PagedSeq<'_> {
    fn len(&self) -> usize {
        self.table.len()
    }

    fn capacity(&self) -> usize {
        self.kv.max_tokens
    }

    fn tokens(&self) -> Vec<u32> {
        self.kv.store.read_tokens(self.table).unwrap_or_default()
    }

    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let have = self.tokens();
        let common = have.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let keep = common.min(prompt.len().saturating_sub(1));
        self.truncate(keep);
        // Past what this sequence held, the index may hold more full pages of the prompt
        // (another request's): attach them by reference instead of recomputing.
        let ps = self.kv.store.page_size();
        let store = &mut self.kv.store;
        while self.table.len().is_multiple_of(ps) && self.table.len() + ps < prompt.len() {
            let chunk = &prompt[self.table.len()..self.table.len() + ps];
            let Some(p) = store.lookup(self.table.tail_hash(), chunk) else {
                break;
            };
            if store.retain(p).is_err() {
                break;
            }
            let h = store
                .hash(p)
                .ok()
                .flatten()
                .expect("indexed pages have a hash");
            self.table.own.push(p);
            self.table.hashes.push(h);
            self.table.len += ps;
            store.stats.prefix_hit_pages += 1;
        }
        // Below page granularity: a cached page whose first k tokens continue the prompt
        // gives those k slots by copy (the shared page itself is never written).
        let len = self.table.len();
        if len.is_multiple_of(ps) && len + 1 < prompt.len() {
            let want = &prompt[len..(len + ps).min(prompt.len() - 1)];
            if let Some((src, k)) = self.kv.store.best_partial(self.table.tail_hash(), want) {
                // Hold the source so reserving the copy cannot evict it.
                if self.kv.store.retain(src).is_ok() {
                    if let Ok(dst) = self.kv.store.reserve() {
                        for &t in &want[..k] {
                            let _ = self.kv.store.push_token(dst, t);
                        }
                        self.kv.arena.copy_slots(src.0, dst.0, k);
                        self.table.own.push(dst);
                        self.table.len += k;
                        self.kv.store.stats.prefix_hit_slots += k as u64;
                    }
                    let _ = self.kv.store.release(src);
                }
            }
        }
        self.table.len()
    }

    fn begin(&mut self, tokens: &[u32]) -> Result<(), RunError> {
        self.kv.seq_begin(self.table, tokens)
    }

    fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), RunError> {
        self.kv.seq_write(self.table, layer, pos, k, v)
    }

    fn k_row(&self, layer: usize, pos: usize) -> &[u16] {
        let (page, slot) = self.kv.page_slot(self.table, pos);
        self.kv.arena.k_row(page, layer, slot)
    }

    fn v_row(&self, layer: usize, pos: usize) -> &[u16] {
        let (page, slot) = self.kv.page_slot(self.table, pos);
        self.kv.arena.v_row(page, layer, slot)
    }

    fn kv_run(&self, layer: usize, pos: usize) -> (KvRows<'_>, KvRows<'_>) {
        self.kv.seq_kv_run(self.table, layer, pos)
    }

    fn finish(&mut self) -> Result<(), RunError> {
        self.kv.seq_finish(self.table)
    }

    fn abort(&mut self, n: usize) {
        self.kv.seq_abort(self.table, n)
    }

    fn truncate(&mut self, len: usize) {
        let n = self.table.len().saturating_sub(len);
        if self.kv.store.truncate(self.table, n).is_err() {
            // No page for the copy-on-write of a committed last page: drop that whole
            // page instead (the caller recomputes from there).
            let ps = self.kv.store.page_size();
            let n = self.table.len() - len / ps * ps;
            let _ = self.kv.store.truncate(self.table, n);
        }
        self.kv.apply_copies();
    }
}
