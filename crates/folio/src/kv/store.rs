//! Pages, their states and refcounts, the LRU list of cached pages and the prefix
//! index. All page mutations go through here; misuse is a typed [`KvError`].

pub use super::error::KvError;
use super::hash::{Hasher128, PageHash};
use std::collections::HashMap;

/// Index of a page in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

/// Where a page is in its life (see the module doc's diagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    Free,
    Working,
    Committed,
    Cached,
}

#[derive(Debug, Clone)]
struct Page {
    state: PageState,
    refs: u32,
    /// Tokens written (working) or held (committed/cached), in slot order.
    tokens: Vec<u32>,
    hash: Option<PageHash>,
    /// The hash this page's chain continues (committed and cached pages).
    parent: Option<PageHash>,
    /// LRU links among cached pages (NO_LINK when not cached).
    prev: u32,
    next: u32,
}

const NO_LINK: u32 = u32::MAX;

/// The most pages one pool may have: page ids are `u32`, and `u32::MAX` is no page.
pub const MAX_PAGES: usize = NO_LINK as usize - 1;

/// One page as a page map shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageView {
    pub state: PageState,
    /// Tables, groups and pins holding it.
    pub refs: u32,
    /// Token slots filled.
    pub fill: usize,
    /// Whether the prefix index finds it (committed or cached pages).
    pub indexed: bool,
    /// Cached pages: 0 is the next to be evicted.
    pub lru_rank: Option<usize>,
}

/// A change to the prefix index, for observers outside the pool (the disk tier's
/// write-behind, a KV-event publisher). Recorded only while one listens
/// ([`super::PagedKv::set_page_events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageEvent {
    /// A page entered the index (a commit that was not deduplicated, or a page read
    /// back from disk): its chained hash, the hash it continues, and its tokens.
    Stored {
        id: PageId,
        hash: PageHash,
        parent: PageHash,
        tokens: Vec<u32>,
    },
    /// A page left the index: evicted to make room.
    Removed { hash: PageHash },
}

/// Counters by page state and of the cache's work.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub evictions: u64,
    pub prefix_hit_pages: u64,
    /// Slots copied from partly matching cached pages (token-granular reuse).
    pub prefix_hit_slots: u64,
    pub commits_deduplicated: u64,
}

/// Every page of one pool.
pub struct PageStore {
    page_size: usize,
    pages: Vec<Page>,
    free: Vec<u32>,
    /// Least recently used cached page first.
    lru_head: u32,
    lru_tail: u32,
    index: HashMap<PageHash, u32>,
    /// Indexed pages by the hash they continue: where a partly matching page is found.
    children: HashMap<PageHash, Vec<u32>>,
    pub stats: Stats,
    /// Slot copies (src, dst, n) that sequence operations made in token space and the
    /// owner of the K/V arena must repeat there (fork, copy-on-write truncate).
    pub(crate) copies: Vec<(PageId, PageId, usize)>,
    /// Index changes since the owner last took them, while `recording`.
    pub(crate) events: Vec<PageEvent>,
    pub(crate) recording: bool,
}

impl PageStore {
    /// `n_pages` free pages of `page_size` token slots.
    pub fn new(n_pages: usize, page_size: usize) -> Self {
        assert!(page_size > 0 && n_pages <= MAX_PAGES);
        let pages = (0..n_pages)
            .map(|_| Page {
                state: PageState::Free,
                refs: 0,
                tokens: Vec::with_capacity(page_size),
                hash: None,
                parent: None,
                prev: NO_LINK,
                next: NO_LINK,
            })
            .collect();
        Self {
            page_size,
            pages,
            // Pop from the end: page 0 first.
            free: (0..n_pages as u32).rev().collect(),
            lru_head: NO_LINK,
            lru_tail: NO_LINK,
            index: HashMap::new(),
            children: HashMap::new(),
            stats: Stats::default(),
            copies: Vec::new(),
            events: Vec::new(),
            recording: false,
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn num_pages(&self) -> usize {
        self.pages.len()
    }
    /// Free pages.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }
    /// Pages a reservation can get: free ones plus reclaimable cached ones.
    pub fn num_available(&self) -> usize {
        self.free.len() + self.count(PageState::Cached)
    }
    /// Pages in `state`.
    pub fn count(&self, state: PageState) -> usize {
        self.pages.iter().filter(|p| p.state == state).count()
    }
    /// Pages with more than one reference (a fork group holds one reference for all the
    /// tables that share it: `kv::shared_pages` counts per table).
    pub fn num_shared(&self) -> usize {
        self.pages.iter().filter(|p| p.refs > 1).count()
    }

    fn page(&self, id: PageId) -> Result<&Page, KvError> {
        self.pages
            .get(id.0 as usize)
            .ok_or(KvError::InvalidPage(id.0))
    }

    pub fn state(&self, id: PageId) -> Result<PageState, KvError> {
        Ok(self.page(id)?.state)
    }
    #[cfg(test)]
    pub fn refcount(&self, id: PageId) -> Result<u32, KvError> {
        Ok(self.page(id)?.refs)
    }
    /// The tokens a page holds.
    pub fn tokens(&self, id: PageId) -> Result<&[u32], KvError> {
        Ok(&self.page(id)?.tokens)
    }
    /// The chained hash of a committed or cached page.
    pub fn hash(&self, id: PageId) -> Result<Option<PageHash>, KvError> {
        Ok(self.page(id)?.hash)
    }

    fn need(&self, id: PageId, ok: &[PageState], needed: &'static str) -> Result<(), KvError> {
        let state = self.page(id)?.state;
        if ok.contains(&state) {
            Ok(())
        } else {
            Err(KvError::WrongState {
                id: id.0,
                state,
                needed,
            })
        }
    }

    /// A fresh working page: a free one, else the least recently used cached one
    /// (evicted from the index).
    pub fn reserve(&mut self) -> Result<PageId, KvError> {
        Ok(self.reserve_n(1)?[0])
    }

    /// `n` working pages, all or none.
    pub fn reserve_n(&mut self, n: usize) -> Result<Vec<PageId>, KvError> {
        let available = self.num_available();
        if n > available {
            return Err(KvError::OutOfPages {
                wanted: n,
                available,
            });
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let i = match self.free.pop() {
                Some(i) => i,
                None => {
                    let i = self.lru_head;
                    self.lru_remove(i);
                    if let Some(h) = self.pages[i as usize].hash.take() {
                        self.index.remove(&h);
                        if self.recording {
                            self.events.push(PageEvent::Removed { hash: h });
                        }
                    }
                    if let Some(p) = self.pages[i as usize].parent.take() {
                        if let Some(kids) = self.children.get_mut(&p) {
                            kids.retain(|&k| k != i);
                            if kids.is_empty() {
                                self.children.remove(&p);
                            }
                        }
                    }
                    self.stats.evictions += 1;
                    i
                }
            };
            let p = &mut self.pages[i as usize];
            p.state = PageState::Working;
            p.refs = 1;
            p.tokens.clear();
            p.hash = None;
            out.push(PageId(i));
        }
        Ok(out)
    }

    /// Writes the next token slot of a working page.
    pub fn push_token(&mut self, id: PageId, token: u32) -> Result<(), KvError> {
        self.need(id, &[PageState::Working], "a working page")?;
        let ps = self.page_size;
        let p = &mut self.pages[id.0 as usize];
        if p.tokens.len() >= ps {
            return Err(KvError::PageFull(id.0));
        }
        p.tokens.push(token);
        Ok(())
    }

    /// Drops the last `n` tokens of a working page.
    pub fn truncate_working(&mut self, id: PageId, n: usize) -> Result<(), KvError> {
        self.need(id, &[PageState::Working], "a working page")?;
        let p = &mut self.pages[id.0 as usize];
        let fill = p.tokens.len();
        if n > fill {
            return Err(KvError::TruncateTooFar { wanted: n, fill });
        }
        p.tokens.truncate(fill - n);
        Ok(())
    }

    /// Commits a full working page after `parent` in the chain. If an identical page
    /// (same hash, same tokens) is indexed, the working page is freed and the indexed one
    /// is referenced instead; the returned id is the page to keep in the table.
    pub fn commit(&mut self, id: PageId, parent: PageHash) -> Result<(PageId, PageHash), KvError> {
        self.need(id, &[PageState::Working], "a working page")?;
        let fill = self.pages[id.0 as usize].tokens.len();
        if fill != self.page_size {
            return Err(KvError::CommitPartial {
                id: id.0,
                fill,
                page_size: self.page_size,
            });
        }
        let h = Hasher128::page(parent, &self.pages[id.0 as usize].tokens);
        if let Some(existing) = self.lookup_hash(h, &self.pages[id.0 as usize].tokens) {
            self.release(id)?;
            self.retain(existing)?;
            self.stats.commits_deduplicated += 1;
            return Ok((existing, h));
        }
        let p = &mut self.pages[id.0 as usize];
        p.state = PageState::Committed;
        p.hash = Some(h);
        p.parent = Some(parent);
        self.index.insert(h, id.0);
        self.children.entry(parent).or_default().push(id.0);
        if self.recording {
            self.events.push(PageEvent::Stored {
                id,
                hash: h,
                parent,
                tokens: self.pages[id.0 as usize].tokens.clone(),
            });
        }
        Ok((id, h))
    }

    fn lookup_hash(&self, h: PageHash, tokens: &[u32]) -> Option<PageId> {
        let &i = self.index.get(&h)?;
        // Verify: a hash collision must never hand out another sequence's K/V.
        (self.pages[i as usize].tokens == tokens).then_some(PageId(i))
    }

    /// The indexed page that follows `parent` with exactly `tokens`, if any.
    pub fn lookup(&self, parent: PageHash, tokens: &[u32]) -> Option<PageId> {
        if tokens.len() != self.page_size {
            return None;
        }
        self.lookup_hash(Hasher128::page(parent, tokens), tokens)
    }

    /// The indexed page after `parent` whose first tokens match `tokens` longest, and
    /// how many match (at least 1, at most `tokens.len()`), for token-granular reuse.
    pub fn best_partial(&self, parent: PageHash, tokens: &[u32]) -> Option<(PageId, usize)> {
        self.children
            .get(&parent)?
            .iter()
            .map(|&i| {
                let k = self.pages[i as usize]
                    .tokens
                    .iter()
                    .zip(tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                (k, std::cmp::Reverse(i))
            })
            .max()
            .filter(|&(k, _)| k > 0)
            .map(|(k, std::cmp::Reverse(i))| (PageId(i), k))
    }

    /// Takes a reference to a committed or cached page.
    pub fn retain(&mut self, id: PageId) -> Result<(), KvError> {
        self.need(
            id,
            &[PageState::Committed, PageState::Cached],
            "a committed page",
        )?;
        if self.pages[id.0 as usize].state == PageState::Cached {
            self.lru_remove(id.0);
            self.pages[id.0 as usize].state = PageState::Committed;
        }
        self.pages[id.0 as usize].refs += 1;
        Ok(())
    }

    /// Drops a reference: a working page becomes free; a committed page whose last
    /// reference goes becomes cached (most recently used).
    pub fn release(&mut self, id: PageId) -> Result<(), KvError> {
        self.need(
            id,
            &[PageState::Working, PageState::Committed],
            "a held page",
        )?;
        let p = &mut self.pages[id.0 as usize];
        p.refs -= 1;
        if p.refs > 0 {
            return Ok(());
        }
        if p.state == PageState::Working {
            p.state = PageState::Free;
            p.tokens.clear();
            self.free.push(id.0);
        } else {
            p.state = PageState::Cached;
            self.lru_push_back(id.0);
        }
        Ok(())
    }

    fn lru_push_back(&mut self, i: u32) {
        self.pages[i as usize].prev = self.lru_tail;
        self.pages[i as usize].next = NO_LINK;
        if self.lru_tail == NO_LINK {
            self.lru_head = i;
        } else {
            self.pages[self.lru_tail as usize].next = i;
        }
        self.lru_tail = i;
    }

    fn lru_remove(&mut self, i: u32) {
        let (prev, next) = (self.pages[i as usize].prev, self.pages[i as usize].next);
        if prev == NO_LINK {
            self.lru_head = next;
        } else {
            self.pages[prev as usize].next = next;
        }
        if next == NO_LINK {
            self.lru_tail = prev;
        } else {
            self.pages[next as usize].prev = prev;
        }
        self.pages[i as usize].prev = NO_LINK;
        self.pages[i as usize].next = NO_LINK;
    }

    /// Every page's state, refcount, fill, index membership and eviction rank: O(pages).
    pub fn views(&self) -> Vec<PageView> {
        let mut out: Vec<PageView> = self
            .pages
            .iter()
            .enumerate()
            .map(|(i, p)| PageView {
                state: p.state,
                refs: p.refs,
                fill: p.tokens.len(),
                indexed: p
                    .hash
                    .is_some_and(|h| self.index.get(&h) == Some(&(i as u32))),
                lru_rank: None,
            })
            .collect();
        for (rank, id) in self.lru_order().into_iter().enumerate() {
            out[id.0 as usize].lru_rank = Some(rank);
        }
        out
    }

    /// Cached pages from least to most recently used.
    pub fn lru_order(&self) -> Vec<PageId> {
        let mut out = Vec::new();
        let mut i = self.lru_head;
        while i != NO_LINK {
            out.push(PageId(i));
            i = self.pages[i as usize].next;
        }
        out
    }

    /// Checks every invariant of the module doc against `holders[i]`, the number of
    /// tables and pins holding page i. Returns a description of the first violation.
    /// O(pages): membership of the free list and the LRU list is counted once (a page
    /// listed twice, or an LRU list that loops, is a violation too).
    pub fn check(&self, holders: &[u32]) -> Result<(), String> {
        let n = self.pages.len();
        let mut free_count = vec![0u32; n];
        for &f in &self.free {
            match free_count.get_mut(f as usize) {
                Some(c) => *c += 1,
                None => return Err(format!("the free list names page {f}, outside the pool")),
            }
        }
        let mut lru_count = vec![0u32; n];
        let mut at = self.lru_head;
        let mut steps = 0;
        while at != NO_LINK {
            steps += 1;
            match lru_count.get_mut(at as usize) {
                Some(c) if steps <= n => *c += 1,
                _ => return Err("the LRU list loops or leaves the pool".into()),
            }
            at = self.pages[at as usize].next;
        }
        for (i, p) in self.pages.iter().enumerate() {
            let h = holders.get(i).copied().unwrap_or(0);
            let indexed = p
                .hash
                .is_some_and(|x| self.index.get(&x) == Some(&(i as u32)));
            if free_count[i] > 1 || lru_count[i] > 1 {
                return Err(format!("page {i} is listed twice (free list or LRU)"));
            }
            let in_free = free_count[i] == 1;
            let in_lru = lru_count[i] == 1;
            let ok = match p.state {
                PageState::Free => h == 0 && p.refs == 0 && !indexed && in_free && !in_lru,
                PageState::Working => h == 1 && p.refs == 1 && !indexed && !in_free && !in_lru,
                PageState::Committed => {
                    p.refs == h
                        && h > 0
                        && indexed
                        && p.tokens.len() == self.page_size
                        && !in_free
                        && !in_lru
                }
                PageState::Cached => h == 0 && p.refs == 0 && indexed && in_lru && !in_free,
            };
            if !ok {
                return Err(format!(
                    "page {i}: {:?} refs {} holders {h} indexed {indexed} free-list {in_free} lru {in_lru}",
                    p.state, p.refs
                ));
            }
        }
        if self.index.len() != self.count(PageState::Committed) + self.count(PageState::Cached) {
            return Err("index holds pages that are neither committed nor cached".into());
        }
        let kids: usize = self.children.values().map(Vec::len).sum();
        for (parent, ids) in &self.children {
            for &i in ids {
                let p = &self.pages[i as usize];
                if p.parent != Some(*parent)
                    || !matches!(p.state, PageState::Committed | PageState::Cached)
                {
                    return Err(format!(
                        "children index lists page {i} under the wrong parent or state"
                    ));
                }
            }
        }
        if kids != self.index.len() {
            return Err("children index and prefix index disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(store: &mut PageStore, base: u32) -> PageId {
        let p = store.reserve().unwrap();
        for t in 0..store.page_size() as u32 {
            store.push_token(p, base + t).unwrap();
        }
        p
    }

    #[test]
    fn pages_are_handed_out_in_order_and_misuse_is_typed() {
        let mut s = PageStore::new(3, 2);
        let root = Hasher128::root(b"m", 2, b"");
        assert_eq!(s.reserve_n(2).unwrap(), vec![PageId(0), PageId(1)]);
        assert_eq!(
            s.reserve_n(2),
            Err(KvError::OutOfPages {
                wanted: 2,
                available: 1
            })
        );
        assert_eq!(s.num_free(), 1, "a failed reservation takes nothing");
        s.push_token(PageId(0), 7).unwrap();
        assert!(matches!(
            s.commit(PageId(0), root),
            Err(KvError::CommitPartial { fill: 1, .. })
        ));
        assert_eq!(
            s.truncate_working(PageId(0), 2),
            Err(KvError::TruncateTooFar { wanted: 2, fill: 1 })
        );
        assert_eq!(s.push_token(PageId(9), 1), Err(KvError::InvalidPage(9)));
        s.push_token(PageId(0), 8).unwrap();
        assert_eq!(s.push_token(PageId(0), 9), Err(KvError::PageFull(0)));
        s.commit(PageId(0), root).unwrap();
        assert!(matches!(
            s.push_token(PageId(0), 1),
            Err(KvError::WrongState { .. })
        ));
        s.release(PageId(0)).unwrap();
        assert!(matches!(
            s.release(PageId(0)),
            Err(KvError::WrongState {
                state: PageState::Cached,
                ..
            })
        ));
        s.release(PageId(1)).unwrap();
        assert!(matches!(
            s.release(PageId(1)),
            Err(KvError::WrongState {
                state: PageState::Free,
                ..
            })
        ));
    }

    #[test]
    fn identical_commits_share_one_page_and_eviction_is_lru() {
        let mut s = PageStore::new(4, 2);
        let root = Hasher128::root(b"m", 2, b"");
        let a = full(&mut s, 10);
        let (a, ha) = s.commit(a, root).unwrap();
        let b = full(&mut s, 10);
        let (b2, hb) = s.commit(b, root).unwrap();
        assert_eq!((b2, hb), (a, ha), "the second copy is deduplicated");
        assert_eq!(s.refcount(a).unwrap(), 2);
        assert_eq!(s.state(b).unwrap(), PageState::Free);
        let c = full(&mut s, 20);
        let (c, _) = s.commit(c, ha).unwrap();
        s.release(a).unwrap();
        s.release(a).unwrap();
        s.release(c).unwrap();
        assert_eq!(s.lru_order(), vec![a, c]);
        assert_eq!(s.lookup(root, &[10, 11]), Some(a));
        s.retain(a).unwrap(); // a prefix hit revives the cached page
        s.release(a).unwrap();
        assert_eq!(s.lru_order(), vec![c, a]);
        // Two free pages, then the least recently used cached page (c) goes.
        let got = s.reserve_n(3).unwrap();
        assert_eq!(got[2], c);
        assert_eq!(s.stats.evictions, 1);
        assert_eq!(
            s.lookup(ha, &[20, 21]),
            None,
            "evicted pages leave the index"
        );
        assert_eq!(s.lookup(root, &[10, 11]), Some(a));
    }

    #[test]
    fn index_changes_are_recorded_only_while_listened_to() {
        let mut s = PageStore::new(3, 2);
        let root = Hasher128::root(b"m", 2, b"");
        let a = full(&mut s, 10);
        s.commit(a, root).unwrap();
        assert!(s.events.is_empty(), "nothing is recorded while off");
        s.recording = true;
        let b = full(&mut s, 20);
        let (b, hb) = s.commit(b, root).unwrap();
        let again = full(&mut s, 20);
        s.commit(again, root).unwrap();
        assert_eq!(
            s.events,
            vec![PageEvent::Stored {
                id: b,
                hash: hb,
                parent: root,
                tokens: vec![20, 21]
            }],
            "a deduplicated commit stores nothing new"
        );
        s.events.clear();
        s.release(a).unwrap();
        let ha = Hasher128::page(root, &[10, 11]);
        let got = s.reserve_n(2).unwrap();
        assert_eq!(got[1], a, "the cached page is evicted");
        assert_eq!(s.events, vec![PageEvent::Removed { hash: ha }]);
    }
}
