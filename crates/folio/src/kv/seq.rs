//! Sequence-level operations on page tables: append a token (committing each page as it
//! fills), attach an indexed prefix, fork, truncate with copy-on-write, release, and
//! forget the leading pages a sliding window has left.
//! Every operation either succeeds or leaves the table and the store as they were.

use super::store::{KvError, PageId, PageState, PageStore};
use super::table::{ForkGroup, PageTable};
use std::sync::Arc;

impl PageStore {
    #[cfg(test)]
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
            t.own.push(p);
        }
        // A partial page is never in a fork group: the last page is the table's own.
        let last = *t.own.last().expect("a page for the token");
        self.push_token(last, token)?;
        t.len += 1;
        Ok(())
    }

    /// Commits every full working page of the table, in order (deduplicating against the
    /// index: an identical page already there replaces ours).
    pub fn commit_full(&mut self, t: &mut PageTable) -> Result<(), KvError> {
        let ps = self.page_size();
        while t.num_committed() < t.len / ps {
            let i = t.num_committed() - t.shared_end();
            let (kept, h) = self.commit(t.own[i], t.tail_hash())?;
            t.own[i] = kept;
            t.hashes.push(h);
        }
        Ok(())
    }

    /// Attaches by reference the indexed full pages that continue `t` along `tokens`
    /// (what `t` holds is `tokens`' start): page after page from `t`'s end, while it
    /// ends on a page boundary and a whole page of `tokens` is left, up to the first
    /// page the index lacks. The one prefix attach: [`super::PagedKv::reuse_prefix`]
    /// runs it (short of a prompt's last token), and so do the property tests. Returns
    /// the tokens `t` holds; an error (only for a store out of step with its index)
    /// leaves `t` holding the pages attached so far.
    pub fn attach_indexed(&mut self, t: &mut PageTable, tokens: &[u32]) -> Result<usize, KvError> {
        let ps = self.page_size();
        while t.len.is_multiple_of(ps) && t.len + ps <= tokens.len() {
            let chunk = &tokens[t.len..t.len + ps];
            let Some(p) = self.lookup(t.tail_hash(), chunk) else {
                break;
            };
            let h = self.hash(p)?.expect("indexed pages have a hash");
            self.retain(p)?;
            t.own.push(p);
            t.hashes.push(h);
            t.len += ps;
            self.stats.prefix_hit_pages += 1;
        }
        Ok(t.len)
    }

    /// A new table with the same tokens: committed pages are shared, the partial working
    /// page (if any) is copied. O(1) in committed pages: `t`'s own committed pages move
    /// into a fork group (no reference is taken per page) that both tables then hold.
    pub fn fork(&mut self, t: &mut PageTable) -> Result<PageTable, KvError> {
        // The only step that can fail (a page for the copy) goes first.
        let copy = if t.num_pages() > t.num_committed() {
            let src = *t.own.last().expect("a partial page");
            let dst = self.reserve()?;
            let n = self.tokens(src)?.len();
            for i in 0..n {
                let tok = self.tokens(src)?[i];
                self.push_token(dst, tok)?;
            }
            self.copies.push((src, dst, n));
            Some(dst)
        } else {
            None
        };
        let (start, end) = (t.shared_end(), t.num_committed());
        if end > start {
            // Forgotten own pages (committed, at the front) become the group's gap: it
            // takes no reference on them.
            let gap = t.forgotten_own();
            let mut ids = t.shared.as_ref().map_or_else(Vec::new, |g| g.ids.clone());
            ids.extend(t.own.drain(..end - start));
            let group = ForkGroup {
                tail: t.tail_hash(),
                parent: t.shared.take(),
                start: start + gap,
                ids,
            };
            t.hashes.clear();
            t.shared = Some(Arc::new(group));
        }
        let mut f = t.copy_sharing();
        if let Some(dst) = copy {
            *f.own.last_mut().expect("a partial page") = dst;
        }
        Ok(f)
    }

    /// Makes pages `keep..` of `t` held one reference each (leaving fork groups that
    /// reach past `keep`), so they can be dropped or replaced. Fails (changing nothing)
    /// only when that would move forgotten pages.
    fn unshare_from(&mut self, t: &mut PageTable, keep: usize) -> Result<(), KvError> {
        let old_end = t.shared_end();
        if keep >= old_end {
            return Ok(());
        }
        // The deepest group chain that ends at or before `keep`.
        let mut g = t.shared.clone();
        while let Some(group) = g.clone() {
            if group.end() <= keep {
                break;
            }
            g = group.parent.clone();
        }
        let new_end = g.as_ref().map_or(0, |x| x.end());
        // Below `held_from` the groups may have gaps (forgotten pages): never moved.
        if new_end < t.held_from {
            return Err(KvError::Forgotten {
                pages: t.held_from,
                needed: "truncating behind the fork point",
            });
        }
        let moved: Vec<PageId> = (new_end..old_end).map(|i| t.page(i)).collect();
        let mut hashes = Vec::with_capacity(moved.len() + t.hashes.len());
        for &p in &moved {
            self.retain(p)?;
            hashes.push(self.hash(p)?.expect("pages in fork groups are committed"));
        }
        hashes.append(&mut t.hashes);
        t.hashes = hashes;
        let mut own = moved;
        own.append(&mut t.own);
        t.own = own;
        let old = std::mem::replace(&mut t.shared, g);
        self.release_group(old)
    }

    /// Drops a reference to a fork group; a group no table holds any more releases its
    /// pages, and so on up its parents.
    pub(crate) fn release_group(&mut self, g: Option<Arc<ForkGroup>>) -> Result<(), KvError> {
        let mut g = g;
        while let Some(group) = g {
            match Arc::try_unwrap(group) {
                Ok(owned) => {
                    for &p in owned.held() {
                        self.release(p)?;
                    }
                    g = owned.parent;
                }
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// Drops the last `n` tokens. Whole pages past the new end are released; a working
    /// last page is shortened in place; a committed last page is never mutated: its kept
    /// prefix is copied into a fresh working page.
    pub fn truncate(&mut self, t: &mut PageTable, n: usize) -> Result<(), KvError> {
        let ps = self.page_size();
        let new_len = t.len.saturating_sub(n);
        let keep_pages = new_len.div_ceil(ps);
        let keep_in_last = new_len - (keep_pages.saturating_sub(1)) * ps;
        let full = new_len / ps;
        // Pages from `full` on are dropped or copied: forgotten ones cannot be.
        if full < t.held_from {
            return Err(KvError::Forgotten {
                pages: t.held_from,
                needed: "truncating into them",
            });
        }
        // Pages to drop or copy must be held by this table alone.
        if full < t.shared_end() {
            self.unshare_from(t, full)?;
        }
        // From here on every page touched is the table's own (index `i - se` in `own`).
        let se = t.shared_end();
        // The only step that can fail (a fresh page for the copy) goes first.
        let cow = if keep_pages > 0 && keep_in_last < ps {
            let last = t.own[keep_pages - 1 - se];
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
        for p in t
            .own
            .drain(keep_pages.max(se) - se..)
            .collect::<Vec<PageId>>()
        {
            self.release(p)?;
        }
        t.hashes.truncate((new_len / ps).saturating_sub(se));
        if keep_pages > 0 && keep_in_last < ps {
            let last = t.own[keep_pages - 1 - se];
            match cow {
                Some(dst) => {
                    self.release(last)?;
                    t.own[keep_pages - 1 - se] = dst;
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
        for &p in &t.own[t.forgotten_own()..] {
            self.release(p)?;
        }
        self.release_group(t.shared)
    }

    /// Gives up the table's references to its own committed pages that lie wholly
    /// before token position `pos` (no later query reads them: they left every layer's
    /// sliding window). Released committed pages become cached, as any released page;
    /// pages held by fork groups stay until the group goes. Returns the pages released.
    pub fn forget(&mut self, t: &mut PageTable, pos: usize) -> Result<usize, KvError> {
        let target = (pos / self.page_size()).min(t.num_committed());
        let se = t.shared_end();
        let from = t.held_from.max(se);
        if target <= from {
            return Ok(0);
        }
        // Committed pages: releasing cannot fail for a consistent table.
        for i in from..target {
            self.release(t.own[i - se])?;
        }
        t.held_from = target;
        Ok(target - from)
    }

    /// The tokens a table holds, read back through its pages (an error once it forgot
    /// some: their tokens may be gone).
    pub fn read_tokens(&self, t: &PageTable) -> Result<Vec<u32>, KvError> {
        if t.held_from > 0 {
            return Err(KvError::Forgotten {
                pages: t.held_from,
                needed: "reading its tokens back",
            });
        }
        let mut out = Vec::with_capacity(t.len);
        for i in 0..t.num_pages() {
            out.extend_from_slice(self.tokens(t.page(i))?);
        }
        out.truncate(t.len);
        Ok(out)
    }
}
