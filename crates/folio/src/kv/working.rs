//! The raw working-page operations (the engine's Context API exposes them): pages
//! reserved ahead of a table and given back, and a table's working pages (those
//! after its committed ones) committed, released from the tail, or cut by tokens.
//! Each checks its count against what the table holds and, past it, refuses with a
//! typed [`KvError`] and changes nothing.

use super::error::KvError;
use super::paged::PagedKv;
use super::store::PageId;
use super::table::PageTable;

impl PageTable {
    /// Pages after the committed ones: working pages (at most the partial last one,
    /// once the full ones are committed).
    pub fn num_working(&self) -> usize {
        self.num_pages() - self.num_committed()
    }
}

impl PagedKv {
    /// `n` working pages reserved ahead, in no table (all or none).
    pub fn reserve_pages(&mut self, n: usize) -> Result<Vec<PageId>, KvError> {
        self.store.reserve_n(n)
    }

    /// Gives back one reference to a page (a reserved working page is freed).
    pub fn release_page(&mut self, p: PageId) -> Result<(), KvError> {
        self.store.release(p)
    }

    /// Tokens in `t`'s working pages.
    pub fn working_tokens(&self, t: &PageTable) -> usize {
        t.len() - self.tokens_in(t.num_committed())
    }

    /// Commits the first `k` full working pages of `t`. Full pages are committed as
    /// soon as they are computed, so no more than the full ones there are can be:
    /// past them, the first working page that is not full is
    /// [`KvError::CommitPartial`], and a table with none [`KvError::CommitTooMany`].
    pub fn commit_working_pages(&mut self, t: &mut PageTable, k: usize) -> Result<(), KvError> {
        let ps = self.page_size();
        let full = t.len() / ps - t.num_committed();
        if k > full {
            let i = t.num_committed() + full;
            return Err(if i < t.num_pages() {
                KvError::CommitPartial {
                    id: t.page(i).0,
                    fill: t.len() - self.tokens_in(i),
                    page_size: ps,
                }
            } else {
                KvError::CommitTooMany { wanted: k, full }
            });
        }
        self.commit(t)
    }

    /// Releases the last `n` working pages of `t`, and the tokens in them.
    pub fn release_working_pages(&mut self, t: &mut PageTable, n: usize) -> Result<(), KvError> {
        if n > t.num_working() {
            return Err(KvError::ReleaseTooMany {
                wanted: n,
                have: t.num_working(),
            });
        }
        if n == 0 {
            return Ok(());
        }
        let keep = self.tokens_in(t.num_pages() - n);
        let drop = t.len() - keep.min(t.len());
        self.truncate(t, drop)
    }

    /// Drops the last `n` tokens of `t` within its working pages (never a committed
    /// page's).
    pub fn truncate_working_tokens(&mut self, t: &mut PageTable, n: usize) -> Result<(), KvError> {
        let in_working = self.working_tokens(t);
        if n > in_working {
            return Err(KvError::TruncateTooFar {
                wanted: n,
                fill: in_working,
            });
        }
        self.truncate(t, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::Logits;

    #[test]
    fn working_pages_are_committed_released_and_cut_within_their_bounds() {
        let mut kv = PagedKv::new(8, 4, 1, 2, 1024, b"working");
        let mut t = kv.new_table(None);
        // Nothing to commit in an empty table.
        assert_eq!(
            kv.commit_working_pages(&mut t, 1),
            Err(KvError::CommitTooMany { wanted: 1, full: 0 })
        );
        kv.plan(&mut t, &[1, 2, 3, 4, 5, 6], Logits::None).unwrap();
        // Planned, not committed yet: one full working page and a partial one.
        assert_eq!((t.num_working(), kv.working_tokens(&t)), (2, 6));
        let partial = t.page(1).0;
        assert_eq!(
            kv.commit_working_pages(&mut t, 2),
            Err(KvError::CommitPartial {
                id: partial,
                fill: 2,
                page_size: 4
            })
        );
        kv.commit_working_pages(&mut t, 1).unwrap();
        assert_eq!((t.num_committed(), t.num_working()), (1, 1));
        assert_eq!(kv.working_tokens(&t), 2);
        assert_eq!(
            kv.truncate_working_tokens(&mut t, 3),
            Err(KvError::TruncateTooFar { wanted: 3, fill: 2 })
        );
        kv.truncate_working_tokens(&mut t, 1).unwrap();
        assert_eq!(kv.read_tokens(&t).unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(
            kv.release_working_pages(&mut t, 2),
            Err(KvError::ReleaseTooMany { wanted: 2, have: 1 })
        );
        kv.release_working_pages(&mut t, 0).unwrap();
        kv.release_working_pages(&mut t, 1).unwrap();
        assert_eq!(kv.read_tokens(&t).unwrap(), [1, 2, 3, 4]);
        // Spares: reserved in no table, given back one by one.
        let spare = kv.reserve_pages(2).unwrap();
        for p in spare {
            kv.release_page(p).unwrap();
        }
        kv.release(t).unwrap();
    }
}
