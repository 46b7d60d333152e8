//! The pool's side of the disk tier: turning it on, copying newly indexed pages into the
//! write-behind queue, and continuing a prefix lookup from disk into free pages.

use super::{DiskConfig, DiskError, DiskOpened, DiskStats, DiskTier, Expect};
use crate::kv::hash::{Hasher128, PageHash};
use crate::kv::store::{PageEvent, PageId};
use crate::kv::{PageTable, PagedKv};
use std::time::Instant;

impl PagedKv {
    /// Keeps committed pages on disk under `cfg.dir` too (see `kv::disk`): written
    /// behind as they are indexed, read back when a prefix lookup runs out of pages in
    /// memory. Pages already there (a previous run's) are indexed now.
    pub fn attach_disk(&mut self, cfg: &DiskConfig) -> Result<DiskOpened, DiskError> {
        let expect = Expect {
            root: self.root,
            page_size: self.page_size(),
            dtype: self.dtype(),
            page_bytes: self.page_bytes(),
            row_shape: self.arena.row_shape(),
        };
        let (tier, opened) = DiskTier::open(cfg, expect)?;
        self.disk = Some(tier);
        self.store.recording = true;
        Ok(opened)
    }

    /// The disk tier's figures, when it is on.
    pub fn disk_stats(&self) -> Option<DiskStats> {
        self.disk.as_ref().map(DiskTier::stats)
    }

    /// Whether page `id`'s content is on disk too.
    pub fn page_on_disk(&self, id: PageId) -> bool {
        match (&self.disk, self.store.hash(id)) {
            (Some(d), Ok(Some(h))) => d.has(h),
            _ => false,
        }
    }

    /// Waits until every page indexed so far is on disk (or its write failed or was
    /// dropped): tests, and a save point before a planned restart.
    pub fn flush_disk(&mut self) {
        self.spill();
        if let Some(d) = &self.disk {
            d.flush();
        }
    }

    /// Copies the pages indexed since the last call into the write-behind queue (those
    /// the disk lacks and the pool still holds), then drops the events nobody else
    /// listens to. Run before anything that may reserve a page (and so evict one).
    pub(crate) fn spill(&mut self) {
        let Some(disk) = &self.disk else { return };
        let ps = self.store.page_size();
        let mut spill = Vec::new();
        for e in &self.store.events[self.disk_seen..] {
            let PageEvent::Stored {
                id,
                hash,
                parent,
                tokens,
            } = e
            else {
                continue;
            };
            // Evicted and reused since (its hash is another's now), or already there.
            if self.store.hash(*id).ok().flatten() != Some(*hash) || disk.has(*hash) {
                continue;
            }
            spill.push((*id, *hash, *parent, tokens.clone()));
        }
        // K/V held on the device comes back first, in one read-back; where it cannot,
        // nothing is spilled now.
        let need: Vec<(u32, usize)> = spill.iter().map(|s| (s.0 .0, ps)).collect();
        if let Err(e) = self.arena.sync_needing(&need) {
            tracing::error!("kv disk: not spilling {} pages: {e}", spill.len());
            spill.clear();
        }
        for (id, hash, parent, tokens) in spill {
            let mut bytes = Vec::with_capacity(self.arena.slot_bytes() * ps);
            for slot in 0..ps {
                self.arena.read_slot(id.0, slot, &mut bytes);
            }
            disk.submit(super::PageFile {
                hash,
                parent,
                tokens,
                bytes,
            });
        }
        if self.events_wanted {
            self.disk_seen = self.store.events.len();
        } else {
            self.store.events.clear();
            self.disk_seen = 0;
        }
    }

    /// After the prefix index ran out: continues `t` along `tokens` (the prompt short of
    /// its last token; the sequence holds `full` tokens once prefilled) with pages from
    /// disk, alternating with pages the index holds, while there is room for the rest
    /// of the sequence.
    pub(crate) fn attach_from_disk(&mut self, t: &mut PageTable, tokens: &[u32], full: usize) {
        let Some(disk) = &self.disk else { return };
        // The pages found in memory are used again on disk too.
        disk.touch(t.hashes.clone());
        self.spill();
        let ps = self.page_size();
        let mut loaded = 0;
        loop {
            let n = self.load_run(t, tokens, full);
            if n == 0 {
                break;
            }
            loaded += n;
            let _ = self.store.attach_indexed(t, tokens);
        }
        let looked = t.len.is_multiple_of(ps) && t.len + ps <= tokens.len();
        if loaded == 0 && looked {
            if let Some(d) = &self.disk {
                d.count_miss();
            }
        }
    }

    /// One run of consecutive pages the disk holds after `t`'s end: read ahead in page
    /// order, each checked and copied into a fresh page, committed, and attached.
    /// Returns the pages attached.
    fn load_run(&mut self, t: &mut PageTable, tokens: &[u32], full: usize) -> usize {
        let ps = self.store.page_size();
        if !t.len.is_multiple_of(ps) {
            return 0;
        }
        let run = self.disk_run(t.tail_hash(), t.len, tokens, usize::MAX);
        if run.is_empty() {
            return 0;
        }
        let Some(disk) = &mut self.disk else {
            return 0;
        };
        let started = Instant::now();
        let slot_bytes = self.arena.slot_bytes();
        let (store, arena) = (&mut self.store, &mut self.arena);
        let mut loaded = 0;
        let hashes: Vec<PageHash> = run.iter().map(|r| r.1).collect();
        let shared = disk.shared.clone();
        disk.read_run(&hashes, |data| {
            let (parent, h, at) = run[loaded];
            // Room for this page, the rest of the prompt and a token after it.
            let rest = full.saturating_sub(at + ps).div_ceil(ps) + 1;
            if store.num_available() < 1 + rest {
                return false;
            }
            let Some(page) = shared.check(h, parent, &tokens[at..at + ps], data) else {
                return false;
            };
            let Ok(id) = store.reserve() else {
                return false;
            };
            for &tok in &page.tokens {
                let _ = store.push_token(id, tok);
            }
            // A page just reserved: what it held before is no sequence's.
            arena.fresh(id.0);
            for (slot, bytes) in page.bytes().chunks_exact(slot_bytes).enumerate() {
                arena.write_slot(id.0, slot, bytes);
            }
            match store.commit(id, parent) {
                Ok((kept, h2)) => {
                    t.own.push(kept);
                    t.hashes.push(h2);
                    t.len += ps;
                    loaded += 1;
                    loaded < run.len()
                }
                Err(e) => {
                    tracing::error!("kv disk: committing a page read back: {e}");
                    let _ = store.release(id);
                    false
                }
            }
        });
        disk.count_read(started, loaded as u64);
        disk.touch(hashes[..loaded].to_vec());
        loaded
    }

    /// Whether a prompt (for a table of `salt`) waits for its prefix to be read ahead
    /// from disk: the pages after those in memory that the disk holds, read on a
    /// thread of their own while steps go on (see `kv::disk`). `false` when there is
    /// nothing to read, or once it is read: admit it then.
    pub fn disk_prefetching(&mut self, salt: Option<&[u8]>, prompt: &[u32]) -> bool {
        if self.disk.is_none() {
            return false;
        }
        let ps = self.page_size();
        let head = &prompt[..prompt.len().saturating_sub(1)];
        let (mut parent, mut len) = (self.new_table(salt).tail_hash(), 0);
        while len + ps <= head.len() {
            let next = self
                .store
                .lookup(parent, &head[len..len + ps])
                .and_then(|p| self.store.hash(p).ok().flatten());
            let Some(h) = next else { break };
            (parent, len) = (h, len + ps);
        }
        // No more than the pool could take in (the rest is read when admitted).
        let room = self.store.num_available().saturating_sub(1);
        let run: Vec<PageHash> = self
            .disk_run(parent, len, head, room)
            .into_iter()
            .map(|r| r.1)
            .collect();
        match &mut self.disk {
            Some(d) if !run.is_empty() => d.prefetching(&run),
            _ => false,
        }
    }

    /// The run of at most `most` pages of `tokens` from `at` (after the page hashed
    /// `parent`) that the disk holds and the prefix index does not: each page's
    /// parent, hash and start, up to the first page it lacks or memory has.
    fn disk_run(
        &self,
        mut parent: PageHash,
        mut at: usize,
        tokens: &[u32],
        most: usize,
    ) -> Vec<(PageHash, PageHash, usize)> {
        let ps = self.store.page_size();
        let mut run = Vec::new();
        while at + ps <= tokens.len() && run.len() < most {
            let chunk = &tokens[at..at + ps];
            if self.store.lookup(parent, chunk).is_some() {
                break;
            }
            let Some(h) = self.disk_has(parent, chunk) else {
                break;
            };
            run.push((parent, h, at));
            (parent, at) = (h, at + ps);
        }
        run
    }

    /// The hash of the page of `chunk` after `parent`, when the disk holds it.
    pub(crate) fn disk_has(&self, parent: PageHash, chunk: &[u32]) -> Option<PageHash> {
        let h = Hasher128::page(parent, chunk);
        self.disk.as_ref()?.has(h).then_some(h)
    }
}
