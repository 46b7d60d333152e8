//! Which pages the disk holds, least recently used first, and the bytes they take.
//! Inserting past the limit evicts from the old end; the caller deletes the files.

use super::super::hash::PageHash;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
pub(super) struct DiskIndex {
    /// Page hash → (use tick, bytes).
    entries: HashMap<PageHash, (u64, u64)>,
    /// Use tick → page hash: the LRU order.
    order: BTreeMap<u64, PageHash>,
    tick: u64,
    bytes: u64,
    max_bytes: u64,
}

impl DiskIndex {
    pub fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            ..Default::default()
        }
    }

    pub fn contains(&self, h: &PageHash) -> bool {
        self.entries.contains_key(h)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Whether a file of `bytes` can be held at all.
    pub fn fits(&self, bytes: u64) -> bool {
        bytes <= self.max_bytes
    }

    /// Adds (or refreshes) a page as the most recently used; returns the pages evicted
    /// to stay within the limit, oldest first.
    pub fn insert(&mut self, h: PageHash, bytes: u64) -> Vec<PageHash> {
        self.remove(&h);
        self.tick += 1;
        self.entries.insert(h, (self.tick, bytes));
        self.order.insert(self.tick, h);
        self.bytes += bytes;
        let mut out = Vec::new();
        while self.bytes > self.max_bytes {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((_, b)) = self.entries.remove(&old) {
                self.bytes -= b;
            }
            out.push(old);
        }
        out
    }

    /// Marks a page most recently used.
    pub fn touch(&mut self, h: &PageHash) {
        if let Some(&(_, bytes)) = self.entries.get(h) {
            self.insert(*h, bytes);
        }
    }

    pub fn remove(&mut self, h: &PageHash) -> bool {
        match self.entries.remove(h) {
            Some((tick, bytes)) => {
                self.order.remove(&tick);
                self.bytes -= bytes;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_is_least_recently_used_by_bytes() {
        let mut ix = DiskIndex::new(30);
        assert!(ix.insert(PageHash(1), 10).is_empty());
        assert!(ix.insert(PageHash(2), 10).is_empty());
        assert!(ix.insert(PageHash(3), 10).is_empty());
        ix.touch(&PageHash(1));
        assert_eq!(ix.insert(PageHash(4), 10), vec![PageHash(2)]);
        assert_eq!(ix.insert(PageHash(5), 20), vec![PageHash(3), PageHash(1)]);
        assert_eq!((ix.len(), ix.bytes()), (2, 30));
        assert!(ix.remove(&PageHash(4)));
        assert!(!ix.remove(&PageHash(4)));
        assert_eq!((ix.len(), ix.bytes()), (1, 20));
        assert!(!ix.fits(31));
    }
}
