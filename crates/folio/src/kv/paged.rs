//! [`PagedKv`]: the paged pool's facade. It owns the page store (states, refcounts,
//! prefix index) and the K/V arena, and is the only way in: callers plan steps
//! ([`PagedKv::plan`] reserves the slots, [`PagedKv::commit`] hashes and dedups the
//! full pages after the model ran), fork, truncate, release and count. Copies the
//! store makes in token space (fork, copy-on-write truncate) are repeated in the arena
//! inside the same call, so callers never see half an operation. [`PagedSeq`] is one
//! sequence's view, for owners that drive a single sequence without an engine.

use super::arena::KvArena;
use super::batch::{Batch, Logits, SeqStep};
use super::buf::KvDtype;
use super::error::KvError;
use super::hash::{Hasher128, PageHash};
use super::single::KvSeq;
use super::store::{PageEvent, PageId, PageState, PageStore, Stats};
use super::table::PageTable;

/// One pool of pages for all sequences of a model.
pub struct PagedKv {
    pub(super) store: PageStore,
    pub(super) arena: KvArena,
    pub(super) root: PageHash,
    /// The most tokens one sequence may hold.
    max_tokens: usize,
    pub(super) fingerprint: Vec<u8>,
    pub(super) snapshots: std::collections::HashMap<String, PageTable>,
    pub(super) snapshot_dir: Option<std::path::PathBuf>,
    /// Snapshots on disk and the saves in flight (see `snapshot.rs`).
    pub(super) snap: super::snapshot::SnapState,
    /// The disk tier, when on (`kv::disk`).
    pub(super) disk: Option<super::disk::DiskTier>,
    /// Whether the owner takes the index's changes ([`PagedKv::take_page_events`]),
    /// and how many of them the disk tier has seen.
    pub(super) events_wanted: bool,
    pub(super) disk_seen: usize,
    /// Tenant salts by the chain root each makes, remembered while events are wanted
    /// (a KV-event publisher keys a salted chain's first page with its salt, as vLLM
    /// does). Behind a lock because [`PagedKv::new_table`] only reads the pool.
    salts: std::sync::Mutex<SaltRoots>,
}

/// The most tenant salts remembered for KV events (the oldest are forgotten first).
const SALTS_KEPT: usize = 1 << 14;

/// Salts by chain root, oldest first.
#[derive(Default)]
struct SaltRoots {
    by_root: std::collections::HashMap<u128, std::sync::Arc<[u8]>>,
    order: std::collections::VecDeque<u128>,
}

/// The shape of a pool: how many pages, and what one page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolShape {
    pub n_pages: usize,
    pub page_size: usize,
    pub n_layers: usize,
    pub kv_dim: usize,
    /// The head size (`kv_dim` is a multiple): 8-bit K/V keeps a scale per head row.
    pub head_dim: usize,
    pub dtype: KvDtype,
}

impl PoolShape {
    /// Bytes of K/V one page holds.
    pub fn page_bytes(&self) -> usize {
        let PoolShape {
            n_layers,
            page_size,
            kv_dim,
            head_dim,
            dtype,
            ..
        } = *self;
        KvArena::page_bytes(n_layers, page_size, kv_dim, head_dim, dtype)
    }

    /// Pages that fit in `bytes` of K/V memory (`--kv-memory`).
    pub fn pages_in(&self, bytes: u64) -> usize {
        usize::try_from(bytes / self.page_bytes().max(1) as u64).unwrap_or(usize::MAX)
    }
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
        let shape = PoolShape {
            n_pages,
            page_size,
            n_layers,
            kv_dim,
            head_dim: kv_dim,
            dtype: KvDtype::F16,
        };
        Self::with_shape(shape, max_tokens, fingerprint)
    }

    /// A pool of `shape`; no sequence grows past `max_tokens`.
    pub fn with_shape(shape: PoolShape, max_tokens: usize, fingerprint: &[u8]) -> Self {
        let PoolShape {
            n_pages,
            page_size,
            n_layers,
            kv_dim,
            head_dim,
            dtype,
        } = shape;
        // The dtype is part of the chain root: pages of different dtypes never match.
        let mut salted = fingerprint.to_vec();
        match dtype {
            KvDtype::F16 => {}
            KvDtype::F32 => salted.extend_from_slice(b":f32"),
            KvDtype::Q8 => salted.extend_from_slice(b":q8_0"),
        }
        Self {
            store: PageStore::new(n_pages, page_size),
            arena: KvArena::new(n_pages, n_layers, page_size, kv_dim, head_dim, dtype),
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
            snap: Default::default(),
            disk: None,
            events_wanted: false,
            disk_seen: 0,
            salts: Default::default(),
        }
    }

    /// An empty page table in this pool's chain (optionally salted per tenant).
    pub fn new_table(&self, salt: Option<&[u8]>) -> PageTable {
        match salt {
            None => PageTable::new(self.root),
            Some(s) => {
                let root = Hasher128::root(&self.root.0.to_le_bytes(), 0, s);
                if self.events_wanted {
                    self.remember_salt(root.0, s);
                }
                PageTable::new(root).with_salt(Some(s.into()))
            }
        }
    }

    /// Notes that `root` is the chain root of `salt` (for [`PagedKv::salt_of_root`]).
    fn remember_salt(&self, root: u128, salt: &[u8]) {
        let mut m = self.salts.lock().unwrap_or_else(|p| p.into_inner());
        if m.by_root.contains_key(&root) {
            return;
        }
        m.by_root.insert(root, salt.into());
        m.order.push_back(root);
        while m.order.len() > SALTS_KEPT {
            if let Some(old) = m.order.pop_front() {
                m.by_root.remove(&old);
            }
        }
    }

    /// The tenant salt whose chain starts at `root`, if a table of it was made while
    /// page events were wanted (and it is among the last [`SALTS_KEPT`] salts).
    pub fn salt_of_root(&self, root: u128) -> Option<std::sync::Arc<[u8]>> {
        let m = self.salts.lock().unwrap_or_else(|p| p.into_inner());
        m.by_root.get(&root).cloned()
    }

    /// How many leading tokens of `prompt` the pool holds in `salt`'s chain, read only:
    /// the whole pages the prefix index or the disk tier holds, then the slots of a
    /// cached page that continue the chain (what [`PagedKv::reuse_prefix`] would attach
    /// and copy for a new table, there short of the prompt's last token, whose logits
    /// are computed).
    pub fn cached_prefix(&self, salt: Option<&[u8]>, prompt: &[u32]) -> usize {
        let (memory, disk) = self.cached_prefix_tiers(salt, prompt);
        memory + disk
    }

    /// [`PagedKv::cached_prefix`] by tier: the tokens before the first page only the
    /// disk tier holds, and those from there on.
    pub fn cached_prefix_tiers(&self, salt: Option<&[u8]>, prompt: &[u32]) -> (usize, usize) {
        let ps = self.page_size();
        let (mut parent, mut len) = (self.new_table(salt).tail_hash(), 0);
        let mut memory = None;
        while len + ps <= prompt.len() {
            let chunk = &prompt[len..len + ps];
            let in_memory = self
                .store
                .lookup(parent, chunk)
                .and_then(|p| self.store.hash(p).ok().flatten());
            let next = match in_memory {
                Some(h) => Some(h),
                None => {
                    memory.get_or_insert(len);
                    self.disk_has(parent, chunk)
                }
            };
            let Some(h) = next else { break };
            (parent, len) = (h, len + ps);
        }
        let rest = &prompt[len..(len + ps).min(prompt.len())];
        let total = len + self.store.best_partial(parent, rest).map_or(0, |(_, k)| k);
        let memory = memory.map_or(total, |m| m.min(total));
        (memory, total - memory)
    }

    /// A single-sequence view of `table` (see [`KvSeq`]).
    pub fn seq<'a>(&'a mut self, table: &'a mut PageTable) -> PagedSeq<'a> {
        PagedSeq { kv: self, table }
    }

    /// The K/V storage a planned step runs on.
    pub fn storage(&mut self) -> &mut KvArena {
        &mut self.arena
    }

    /// The element type of the pool's K/V.
    pub fn dtype(&self) -> KvDtype {
        self.arena.dtype()
    }

    /// Bytes of K/V one page holds (the pool's real size per page: 8-bit K/V's scales
    /// included).
    pub fn page_bytes(&self) -> usize {
        self.arena.slot_bytes() * self.page_size()
    }

    /// Token slots per page.
    pub fn page_size(&self) -> usize {
        self.store.page_size()
    }

    /// The most tokens one sequence may hold.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Pages in the pool.
    pub fn num_pages(&self) -> usize {
        self.store.num_pages()
    }

    /// Free pages (no cached page evicted to get them).
    pub fn num_free(&self) -> usize {
        self.store.num_free()
    }

    /// Pages a reservation can get now: free, or cached and reclaimable.
    pub fn num_available(&self) -> usize {
        self.store.num_available()
    }

    /// Pages in `state`.
    pub fn count(&self, state: PageState) -> usize {
        self.store.count(state)
    }

    /// Pages held by more than one table or group.
    pub fn num_shared(&self) -> usize {
        self.store.num_shared()
    }

    /// The cache's work counters (evictions, prefix hits, deduplicated commits).
    pub fn stats(&self) -> &Stats {
        &self.store.stats
    }

    /// Every page as a page map shows it (index = page id).
    pub fn page_views(&self) -> Vec<super::store::PageView> {
        self.store.views()
    }

    /// A page's state (an error for an id outside the pool).
    pub fn page_state(&self, id: PageId) -> Result<PageState, KvError> {
        self.store.state(id)
    }

    /// Starts (or stops) recording the prefix index's changes for
    /// [`PagedKv::take_page_events`]: pages stored and evicted. The owner takes them
    /// after every step; nothing is recorded while off.
    pub fn set_page_events(&mut self, on: bool) {
        self.spill();
        self.events_wanted = on;
        self.store.recording = on || self.disk.is_some();
        if !on {
            self.store.events.clear();
            self.disk_seen = 0;
        }
    }

    /// The prefix index's changes since the last call, in order (see
    /// [`PagedKv::set_page_events`]).
    pub fn take_page_events(&mut self) -> Vec<PageEvent> {
        self.spill();
        self.disk_seen = 0;
        std::mem::take(&mut self.store.events)
    }

    /// Checks the store's invariants against the references `holders` should hold
    /// (see [`super::holders`]); for tests.
    pub fn check(&self, holders: &[u32]) -> Result<(), String> {
        self.store.check(holders)
    }

    /// Reserves slots for `tokens` at the next positions of `t` (all or nothing: on
    /// error `t` is unchanged) and returns the step that computes them.
    pub fn plan(
        &mut self,
        t: &mut PageTable,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<SeqStep, KvError> {
        self.spill();
        let start = t.len();
        if start + tokens.len() > self.max_tokens {
            return Err(KvError::SequenceFull {
                len: start + tokens.len(),
                max: self.max_tokens,
            });
        }
        for (i, &tok) in tokens.iter().enumerate() {
            if let Err(e) = self.store.push(t, tok) {
                // All or nothing: give back what this call took.
                self.store.truncate(t, i)?;
                return Err(e);
            }
        }
        Ok(SeqStep {
            tokens: tokens.to_vec(),
            start,
            pages: t.pages(),
            page_size: self.page_size(),
            logits,
        })
    }

    /// After the model ran a planned step: commits the full pages of `t` (an identical
    /// indexed page replaces ours).
    pub fn commit(&mut self, t: &mut PageTable) -> Result<(), KvError> {
        let r = self.store.commit_full(t);
        self.spill();
        r
    }

    /// Gives back the last `n` planned tokens of `t` after a failed step.
    pub fn abort(&mut self, t: &mut PageTable, n: usize) {
        let _ = self.store.truncate(t, n);
        self.apply_copies();
    }

    /// Forks a table (committed pages shared, the partial page and its K/V copied).
    pub fn fork(&mut self, t: &mut PageTable) -> Result<PageTable, KvError> {
        self.spill();
        let f = self.store.fork(t)?;
        self.apply_copies();
        Ok(f)
    }

    /// Releases a table's pages.
    pub fn release(&mut self, t: PageTable) -> Result<(), KvError> {
        self.store.release_table(t)
    }

    /// Gives up `t`'s references to its own committed pages wholly before token position
    /// `pos`, which no later query reads (a model whose every layer slides: see
    /// `Model::kv_needed_from`). They become cached like any released committed page.
    /// Afterwards `t`'s tokens cannot be read back, saved, or truncated into those
    /// pages ([`KvError::Forgotten`]). Returns the pages released.
    pub fn forget(&mut self, t: &mut PageTable, pos: usize) -> Result<usize, KvError> {
        self.store.forget(t, pos)
    }

    /// Drops the last `n` tokens of `t`; crossing into a committed page copies its kept
    /// slots into a fresh working page (the committed page is never written).
    pub fn truncate(&mut self, t: &mut PageTable, n: usize) -> Result<(), KvError> {
        self.spill();
        let r = self.store.truncate(t, n);
        self.apply_copies();
        r
    }

    /// Keeps at most `len` tokens of `t`. Without a page for the copy-on-write of a
    /// committed last page, that whole page goes too, and a table that forgot the
    /// pages before `len` is emptied (the caller recomputes from there): returns the
    /// length kept.
    pub fn truncate_to(&mut self, t: &mut PageTable, len: usize) -> usize {
        let n = t.len().saturating_sub(len);
        if let Err(KvError::Forgotten { .. }) = self.truncate(t, n) {
            // Its first pages are gone: nothing before them can be kept.
            self.clear(t);
        } else if t.len() > len {
            let n = t.len() - len / self.page_size() * self.page_size();
            let _ = self.truncate(t, n);
        }
        t.len()
    }

    /// The tokens `t` holds.
    pub fn read_tokens(&self, t: &PageTable) -> Result<Vec<u32>, KvError> {
        self.store.read_tokens(t)
    }

    /// Keeps the longest prefix of `prompt` that `t` holds (short of its last token),
    /// then attaches further full pages of the prompt that the index holds (another
    /// sequence's) by reference, and below page granularity copies the matching slots
    /// of a cached page that continues the chain. Returns the length `t` now holds. A
    /// table that forgot pages is emptied first.
    pub fn reuse_prefix(&mut self, t: &mut PageTable, prompt: &[u32]) -> usize {
        if t.held_from() > 0 {
            // Its tokens cannot be compared any more: start it afresh.
            self.clear(t);
        }
        let have = self.read_tokens(t).unwrap_or_default();
        let common = have.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        self.truncate_to(t, common.min(prompt.len().saturating_sub(1)));
        let ps = self.page_size();
        // Whole pages, short of the last token (it must be computed for its logits).
        // An error stops the attach where it was: the copy below and the caller go on
        // from what `t` holds then.
        let head = &prompt[..prompt.len().saturating_sub(1)];
        let _ = self.store.attach_indexed(t, head);
        // Past the pages in memory: those the disk tier holds, read back.
        self.attach_from_disk(t, head, prompt.len());
        // Below page granularity: a cached page whose first k tokens continue the prompt
        // gives those k slots by copy (the shared page itself is never written).
        let len = t.len();
        if len.is_multiple_of(ps) && len + 1 < prompt.len() {
            let want = &prompt[len..(len + ps).min(prompt.len() - 1)];
            if let Some((src, k)) = self.store.best_partial(t.tail_hash(), want) {
                // Hold the source so reserving the copy cannot evict it.
                if self.store.retain(src).is_ok() {
                    if let Ok(dst) = self.store.reserve() {
                        for &tok in &want[..k] {
                            let _ = self.store.push_token(dst, tok);
                        }
                        self.arena.copy_slots(src.0, dst.0, k);
                        t.own.push(dst);
                        t.len += k;
                        self.store.stats.prefix_hit_slots += k as u64;
                    }
                    let _ = self.store.release(src);
                }
            }
        }
        t.len()
    }

    /// Releases every page of `t`, leaving it empty (same chain root).
    fn clear(&mut self, t: &mut PageTable) {
        let fresh = PageTable::new(t.root).with_salt(t.salt.clone());
        if let Err(e) = self.store.release_table(std::mem::replace(t, fresh)) {
            tracing::error!("releasing a table's pages: {e}");
        }
    }

    pub(super) fn apply_copies(&mut self) {
        for (src, dst, n) in self.store.copies.drain(..) {
            self.arena.copy_slots(src.0, dst.0, n);
        }
    }
}

/// One sequence of a [`PagedKv`], driven by its owner one step at a time.
pub struct PagedSeq<'a> {
    kv: &'a mut PagedKv,
    table: &'a mut PageTable,
}

impl KvSeq for PagedSeq<'_> {
    type Storage = KvArena;

    fn len(&self) -> usize {
        self.table.len()
    }

    fn capacity(&self) -> usize {
        self.kv.max_tokens
    }

    fn tokens(&self) -> Vec<u32> {
        self.kv.read_tokens(self.table).unwrap_or_default()
    }

    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        self.kv.reuse_prefix(self.table, prompt)
    }

    fn truncate(&mut self, len: usize) {
        self.kv.truncate_to(self.table, len);
    }

    fn reserve(&mut self, tokens: &[u32], logits: Logits) -> Result<Batch, KvError> {
        Ok(Batch::one(self.kv.plan(self.table, tokens, logits)?))
    }

    fn storage(&mut self) -> &mut KvArena {
        &mut self.kv.arena
    }

    fn commit(&mut self) -> Result<(), KvError> {
        self.kv.commit(self.table)
    }

    fn abort(&mut self, n: usize) {
        self.kv.abort(self.table, n)
    }
}
