//! A sequence's page table: the ordered pages that hold its tokens. Token `t` lives in
//! page `pages[t / page_size]`, slot `t % page_size`; only the last page may be partial.
//!
//! How a table holds its pages: the first `shared_end()` pages through a chain of
//! [`ForkGroup`]s (one reference per page per group, however many tables share the
//! group), the rest (`own`) each by its own reference. `fork` moves the table's own
//! committed pages into a new group and hands the child the same group: no per-page
//! reference is taken and no page id is copied, so a fork's cost does not grow with the
//! committed pages. A group keeps the ids of all pages it covers (its parents' too), so
//! any page is found in O(1); building that list is the one proportional cost, paid
//! once per group, when a fork finds committed pages no group holds yet.
//!
//! NOTE: forgotten pages (sliding-window models). A table may give up its references
//! to leading committed pages that no later query will read (`PageStore::forget`).
//! `held_from` is the first page from which on every page is held; pages before it may
//! not be (their ids stay in the table, stale: another sequence may own them now, so
//! they are never released, retained or read again). Only a table's own pages are ever
//! forgotten, so they are a prefix of `own` (`held_from - shared_end()` of them); a
//! fork moves them into the new group's gap: the group's `start` is past them, and the
//! pages between its parent's end and `start` are held by nobody.

use super::hash::PageHash;
use super::store::PageId;
use std::collections::HashSet;
use std::sync::Arc;

/// Committed pages held once on behalf of every table that shares them (after a fork).
/// A group covers pages `start..start + pages.len()` of its tables; `parent` covers
/// the pages before `start`.
#[derive(Debug)]
pub struct ForkGroup {
    pub(crate) parent: Option<Arc<ForkGroup>>,
    /// The group holds pages `start..ids.len()`; its parents hold the ones before their
    /// own end, and pages between the parent's end and `start` were forgotten before
    /// the fork (nobody holds them).
    pub(crate) start: usize,
    /// Ids of every page the group covers, from page 0 (lookups).
    pub(crate) ids: Vec<PageId>,
    /// The hash of the group's last page (what the next committed page chains from).
    pub(crate) tail: PageHash,
}

impl ForkGroup {
    pub(crate) fn end(&self) -> usize {
        self.ids.len()
    }

    /// The pages this group itself holds a reference to.
    pub(crate) fn held(&self) -> &[PageId] {
        &self.ids[self.start..]
    }
}

/// Ordered pages and the number of tokens they hold. Not `Clone`: a copy would hold the
/// same pages without references of its own (use `fork`).
#[derive(Debug)]
pub struct PageTable {
    /// Pages `shared_end()..`, held by this table alone.
    pub(crate) own: Vec<PageId>,
    pub(crate) len: usize,
    /// Chain root: model fingerprint, page size and tenant salt.
    pub(crate) root: PageHash,
    /// The tenant salt the root was made with ([`super::PagedKv::new_table`]), kept so
    /// that a snapshot names its chain again after a restart.
    pub(crate) salt: Option<Arc<[u8]>>,
    /// Hashes of the committed pages after `shared_end()`, in order (the committed
    /// pages are a prefix of `pages`).
    pub(crate) hashes: Vec<PageHash>,
    /// The fork group holding `pages[..shared_end()]`.
    pub(crate) shared: Option<Arc<ForkGroup>>,
    /// Every page from this one on is held; the ones before may have been forgotten
    /// (see the module doc). 0 for a table that never forgot a page.
    pub(crate) held_from: usize,
}

/// Two tables are equal when they hold the same pages for the same tokens (however
/// they hold them).
impl PartialEq for PageTable {
    fn eq(&self, o: &Self) -> bool {
        self.pages() == o.pages()
            && self.len == o.len
            && self.root == o.root
            && self.num_committed() == o.num_committed()
            && self.tail_hash() == o.tail_hash()
            && self.held_from == o.held_from
    }
}

impl Eq for PageTable {}

impl PageTable {
    /// An empty table whose pages chain from `root`.
    pub fn new(root: PageHash) -> Self {
        Self {
            own: Vec::new(),
            len: 0,
            root,
            salt: None,
            hashes: Vec::new(),
            shared: None,
            held_from: 0,
        }
    }

    /// The same empty table, its root made with tenant salt `salt`.
    pub(crate) fn with_salt(mut self, salt: Option<Arc<[u8]>>) -> Self {
        self.salt = salt;
        self
    }

    /// The tenant salt of the table's chain, if it has one.
    pub fn salt(&self) -> Option<&[u8]> {
        self.salt.as_deref()
    }

    /// A copy sharing the same fork group; the caller owns the references of the copy's
    /// own pages (see `PageStore::fork`).
    pub(crate) fn copy_sharing(&self) -> Self {
        Self {
            own: self.own.clone(),
            len: self.len,
            root: self.root,
            salt: self.salt.clone(),
            hashes: self.hashes.clone(),
            shared: self.shared.clone(),
            held_from: self.held_from,
        }
    }

    /// What the table holds, for comparisons: (pages, tokens, committed pages).
    pub fn content(&self) -> (Vec<PageId>, usize, usize) {
        (self.pages(), self.len, self.num_committed())
    }

    /// The hash the next committed page chains from.
    pub fn tail_hash(&self) -> PageHash {
        match (self.hashes.last(), &self.shared) {
            (Some(h), _) => *h,
            (None, Some(g)) => g.tail,
            (None, None) => self.root,
        }
    }

    /// Committed pages at the front of the table.
    pub fn num_committed(&self) -> usize {
        self.shared_end() + self.hashes.len()
    }

    /// Pages held through fork groups (the rest are held one reference each).
    pub fn shared_end(&self) -> usize {
        self.shared.as_ref().map_or(0, |g| g.end())
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first page from which on the table holds every page; the pages before it may
    /// have been forgotten (0 when none was).
    pub fn held_from(&self) -> usize {
        self.held_from
    }

    /// Own pages forgotten: `own[..n]` are stale ids.
    pub(crate) fn forgotten_own(&self) -> usize {
        self.held_from
            .saturating_sub(self.shared_end())
            .min(self.own.len())
    }

    /// Whether the table (or one of its fork groups) holds page `i`: false for a
    /// forgotten page, whose id in [`PageTable::pages`] is stale.
    pub fn holds(&self, i: usize) -> bool {
        if i >= self.num_pages() {
            return false;
        }
        if i >= self.held_from {
            return true;
        }
        if i >= self.shared_end() {
            return false; // an own page before `held_from`: forgotten
        }
        // The group covering `i` holds it unless `i` is in its gap.
        let mut g = self.shared.as_ref();
        while let Some(group) = g {
            let parent_end = group.parent.as_ref().map_or(0, |p| p.end());
            if i >= parent_end {
                return i >= group.start;
            }
            g = group.parent.as_ref();
        }
        false
    }

    /// Pages in the table.
    pub fn num_pages(&self) -> usize {
        self.shared_end() + self.own.len()
    }

    /// Page `i` (`i < num_pages()`).
    pub fn page(&self, i: usize) -> PageId {
        match &self.shared {
            Some(g) if i < g.end() => g.ids[i],
            _ => self.own[i - self.shared_end()],
        }
    }

    /// The pages in order (a copy, for inspection; ids of forgotten pages are stale, see
    /// [`PageTable::holds`]).
    pub fn pages(&self) -> Vec<PageId> {
        let mut v = self
            .shared
            .as_ref()
            .map_or_else(Vec::new, |g| g.ids.clone());
        v.extend_from_slice(&self.own);
        v
    }

    /// (page, slot) of token position `pos`, if the table holds it.
    pub fn slot_of(&self, pos: usize, page_size: usize) -> Option<(PageId, usize)> {
        (pos < self.len).then(|| (self.page(pos / page_size), pos % page_size))
    }
}

/// How many references each of `n_pages` pages should have, given every live table
/// (and pin): one per table for its own pages, one per distinct fork group for the
/// group's pages. What `PageStore::check` compares refcounts against.
pub fn holders<'a>(tables: impl IntoIterator<Item = &'a PageTable>, n_pages: usize) -> Vec<u32> {
    let mut h = vec![0u32; n_pages];
    let mut seen: HashSet<*const ForkGroup> = HashSet::new();
    for t in tables {
        for p in &t.own[t.forgotten_own()..] {
            h[p.0 as usize] += 1;
        }
        let mut g = t.shared.as_ref();
        while let Some(group) = g {
            if !seen.insert(Arc::as_ptr(group)) {
                break;
            }
            for p in group.held() {
                h[p.0 as usize] += 1;
            }
            g = group.parent.as_ref();
        }
    }
    h
}

/// How many of the tables' pages are held by more than one table (a fork group counts
/// once for each table that shares it).
pub fn shared_pages<'a>(tables: impl IntoIterator<Item = &'a PageTable>, n_pages: usize) -> usize {
    let mut users = vec![0u32; n_pages];
    for t in tables {
        for i in (0..t.num_pages()).filter(|&i| t.holds(i)) {
            users[t.page(i).0 as usize] += 1;
        }
    }
    users.iter().filter(|&&u| u > 1).count()
}
