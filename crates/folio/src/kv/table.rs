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
    /// The group holds pages `start..ids.len()`; its parents hold the ones before.
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
    /// Hashes of the committed pages after `shared_end()`, in order (the committed
    /// pages are a prefix of `pages`).
    pub(crate) hashes: Vec<PageHash>,
    /// The fork group holding `pages[..shared_end()]`.
    pub(crate) shared: Option<Arc<ForkGroup>>,
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
            hashes: Vec::new(),
            shared: None,
        }
    }

    /// A copy sharing the same fork group; the caller owns the references of the copy's
    /// own pages (see `PageStore::fork`).
    pub(crate) fn copy_sharing(&self) -> Self {
        Self {
            own: self.own.clone(),
            len: self.len,
            root: self.root,
            hashes: self.hashes.clone(),
            shared: self.shared.clone(),
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

    /// The pages in order (a copy, for inspection).
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
        for p in &t.own {
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
        for i in 0..t.num_pages() {
            users[t.page(i).0 as usize] += 1;
        }
    }
    users.iter().filter(|&&u| u > 1).count()
}
