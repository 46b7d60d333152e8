//! A sequence's page table: the ordered pages that hold its tokens. Token `t` lives in
//! page `pages[t / page_size]`, slot `t % page_size`; only the last page may be partial.

use super::hash::PageHash;
use super::store::PageId;

/// Ordered pages and the number of tokens they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTable {
    pub(crate) pages: Vec<PageId>,
    pub(crate) len: usize,
    /// Chain root: model fingerprint, page size and tenant salt.
    pub(crate) root: PageHash,
    /// Hashes of the committed pages, in order (a prefix of `pages`).
    pub(crate) hashes: Vec<PageHash>,
}

impl PageTable {
    /// An empty table whose pages chain from `root`.
    pub fn new(root: PageHash) -> Self {
        Self {
            pages: Vec::new(),
            len: 0,
            root,
            hashes: Vec::new(),
        }
    }

    /// The hash the next committed page chains from.
    pub fn tail_hash(&self) -> PageHash {
        self.hashes.last().copied().unwrap_or(self.root)
    }

    /// Committed pages at the front of the table.
    pub fn num_committed(&self) -> usize {
        self.hashes.len()
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pages in order.
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// (page, slot) of token position `pos`, if the table holds it.
    pub fn slot_of(&self, pos: usize, page_size: usize) -> Option<(PageId, usize)> {
        (pos < self.len).then(|| (self.pages[pos / page_size], pos % page_size))
    }
}
