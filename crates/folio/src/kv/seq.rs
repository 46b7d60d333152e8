//! Sequence-level operations on page tables: append a token (committing each page as it
//! fills), attach an indexed prefix, fork, truncate with copy-on-write, release.
//! Every operation either succeeds or leaves the table and the store as they were.

use super::store::{KvError, PageId, PageState, PageStore};
use super::table::PageTable;

impl PageStore {
    /// Appends one token: a new working page when the last is full (or there is none);
    /// a page that becomes full is committed (and deduplicated against the index).
    pub fn append(&mut self, t: &mut PageTable, token: u32) -> Result<(), KvError> {
        self.push(t, token)?;
        self.commit_full(t)
    }

    /// Appends one token's slot without committing: the forward pass writes the K/V of
    /// new tokens first, then calls [`PageStore::commit_full`].
    pub fn push(&mut self, t: &mut PageTable, token: u32) -> Result<(), KvError> {
        if t.len.is_multiple_of(self.page_size()) {
            let p = self.reserve()?;
            t.pages.push(p);
        }
        let last = *t.pages.last().expect("a page for the token");
        self.push_token(last, token)?;
        t.len += 1;
        Ok(())
    }

    /// Commits every full working page of the table, in order (deduplicating against the
    /// index: an identical page already there replaces ours).
    pub fn commit_full(&mut self, t: &mut PageTable) -> Result<(), KvError> {
        let ps = self.page_size();
        while t.hashes.len() < t.len / ps {
            let i = t.hashes.len();
            let (kept, h) = self.commit(t.pages[i], t.tail_hash())?;
            t.pages[i] = kept;
            t.hashes.push(h);
        }
        Ok(())
    }

    /// Attaches the longest chain of indexed full pages that `tokens` starts with to an
    /// empty table; returns how many tokens it covers (a multiple of the page size).
    pub fn attach_prefix(&mut self, t: &mut PageTable, tokens: &[u32]) -> Result<usize, KvError> {
        assert!(t.is_empty(), "attach_prefix starts a table");
        let ps = self.page_size();
        for chunk in tokens.chunks_exact(ps) {
            let Some(p) = self.lookup(t.tail_hash(), chunk) else {
                break;
            };
            self.retain(p)?;
            let h = self.hash(p)?.expect("indexed pages have a hash");
            t.pages.push(p);
            t.hashes.push(h);
            t.len += ps;
            self.stats.prefix_hit_pages += 1;
        }
        Ok(t.len)
    }

    /// A new table with the same tokens: committed pages are shared by reference, the
    /// partial working page (if any) is copied. O(1) in the number of committed pages'
    /// contents (it takes references, copying nothing but the partial page).
    pub fn fork(&mut self, t: &PageTable) -> Result<PageTable, KvError> {
        let mut f = t.clone();
        let partial = t.pages.len() > t.hashes.len();
        if partial {
            let src = *t.pages.last().expect("a partial page");
            let dst = self.reserve()?;
            let n = self.tokens(src)?.len();
            for i in 0..n {
                let tok = self.tokens(src)?[i];
                self.push_token(dst, tok)?;
            }
            self.copies.push((src, dst, n));
            *f.pages.last_mut().expect("a partial page") = dst;
        }
        for &p in &t.pages[..t.hashes.len()] {
            self.retain(p)?;
        }
        Ok(f)
    }

    /// Drops the last `n` tokens. Whole pages past the new end are released; a working
    /// last page is shortened in place; a committed last page is never mutated: its kept
    /// prefix is copied into a fresh working page.
    pub fn truncate(&mut self, t: &mut PageTable, n: usize) -> Result<(), KvError> {
        let ps = self.page_size();
        let new_len = t.len.saturating_sub(n);
        let keep_pages = new_len.div_ceil(ps);
        let keep_in_last = new_len - (keep_pages.saturating_sub(1)) * ps;
        // The only step that can fail (a fresh page for the copy) goes first.
        let cow = if keep_pages > 0 && keep_in_last < ps {
            let last = t.pages[keep_pages - 1];
            if self.state(last)? == PageState::Committed {
                let dst = self.reserve()?;
                for i in 0..keep_in_last {
                    let tok = self.tokens(last)?[i];
                    self.push_token(dst, tok)?;
                }
                self.copies.push((last, dst, keep_in_last));
                Some(dst)
            } else {
                None
            }
        } else {
            None
        };
        for p in t.pages.drain(keep_pages..).collect::<Vec<PageId>>() {
            self.release(p)?;
        }
        t.hashes.truncate(new_len / ps);
        if keep_pages > 0 && keep_in_last < ps {
            let last = t.pages[keep_pages - 1];
            match cow {
                Some(dst) => {
                    self.release(last)?;
                    t.pages[keep_pages - 1] = dst;
                }
                None => {
                    let fill = self.tokens(last)?.len();
                    self.truncate_working(last, fill - keep_in_last)?;
                }
            }
        }
        t.len = new_len;
        Ok(())
    }

    /// Releases every page of a table.
    pub fn release_table(&mut self, t: PageTable) -> Result<(), KvError> {
        for p in t.pages {
            self.release(p)?;
        }
        Ok(())
    }

    /// The tokens a table holds, read back through its pages.
    pub fn read_tokens(&self, t: &PageTable) -> Result<Vec<u32>, KvError> {
        let mut out = Vec::with_capacity(t.len);
        for &p in &t.pages {
            out.extend_from_slice(self.tokens(p)?);
        }
        out.truncate(t.len);
        Ok(out)
    }
}
