//! Page arithmetic in the pool's terms: the pages a number of tokens fills, what a
//! table still needs to grow, the most pages a run of positions touches, and whether
//! a sequence could ever fit the pool. Callers (the scheduler, the contexts' quota)
//! ask these instead of dividing by the page size themselves.

use super::paged::PagedKv;
use super::table::PageTable;

impl PagedKv {
    /// Pages `tokens` tokens fill (the last one possibly in part).
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size())
    }

    /// Token slots in `pages` pages (saturating: an unlimited share is `usize::MAX` pages).
    pub fn tokens_in(&self, pages: usize) -> usize {
        pages.saturating_mul(self.page_size())
    }

    /// Free slots in the last page `tokens` tokens fill (0 when it is full).
    pub fn free_slots_after(&self, tokens: usize) -> usize {
        let ps = self.page_size();
        (ps - tokens % ps) % ps
    }

    /// The token count at the end of the page position `pos` falls in.
    pub fn page_end(&self, pos: usize) -> usize {
        let ps = self.page_size();
        pos / ps * ps + ps
    }

    /// The most pages `tokens` consecutive positions touch wherever they start: the
    /// first may begin mid-page, so one more than they fill.
    pub fn most_pages_spanned(&self, tokens: usize) -> usize {
        self.pages_for(tokens) + 1
    }

    /// Pages beyond those `t` holds that `tokens` tokens in all fill (`None`: a
    /// sequence that holds no pages yet).
    pub fn extra_pages_for(&self, t: Option<&PageTable>, tokens: usize) -> usize {
        let held = t.map_or(0, |t| t.num_pages());
        self.pages_for(tokens).saturating_sub(held)
    }

    /// Pages beyond those `t` holds that `more` further tokens fill.
    pub fn pages_to_grow(&self, t: &PageTable, more: usize) -> usize {
        self.extra_pages_for(Some(t), t.len() + more)
    }

    /// Tokens `t` can still grow by: the free slots of its pages and of every page
    /// a reservation can get now.
    pub fn room_to_grow(&self, t: &PageTable) -> usize {
        self.tokens_in(t.num_pages() + self.num_available())
            .saturating_sub(t.len())
    }

    /// Pages a sequence holds at once on its way to `tokens` tokens: the pages they
    /// fill, or at most `most_held` for one that never holds more at once (it frees
    /// the pages a sliding window left).
    pub fn pages_needed(&self, tokens: usize, most_held: Option<usize>) -> usize {
        let needed = self.pages_for(tokens);
        most_held.map_or(needed, |most| needed.min(most))
    }

    /// Whether a sequence that holds `pages` pages at once could ever run here: the
    /// whole pool has that many (with every other sequence preempted).
    pub fn fits(&self, pages: usize) -> bool {
        pages <= self.num_pages()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n_pages: usize, page_size: usize) -> PagedKv {
        PagedKv::new(n_pages, page_size, 1, 2, 1024, b"pages")
    }

    #[test]
    fn counts_follow_the_page_size() {
        let kv = pool(8, 4);
        assert_eq!(
            (0..=9).map(|n| kv.pages_for(n)).collect::<Vec<_>>(),
            [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
        );
        assert_eq!(kv.tokens_in(3), 12);
        // An unlimited share (usize::MAX pages) holds every token, it does not wrap.
        assert_eq!(kv.tokens_in(usize::MAX), usize::MAX);
        assert_eq!(
            (0..=5).map(|n| kv.free_slots_after(n)).collect::<Vec<_>>(),
            [0, 3, 2, 1, 0, 3]
        );
        assert_eq!((kv.page_end(0), kv.page_end(3), kv.page_end(4)), (4, 4, 8));
        assert_eq!((kv.most_pages_spanned(1), kv.most_pages_spanned(5)), (2, 3));
        assert_eq!(kv.pages_needed(9, None), 3);
        assert_eq!(kv.pages_needed(9, Some(2)), 2);
        assert_eq!(kv.pages_needed(9, Some(5)), 3);
        assert!(kv.fits(8) && !kv.fits(9));
    }

    #[test]
    fn a_table_grows_into_its_own_slots_first() {
        let mut kv = pool(8, 4);
        let mut t = kv.new_table(None);
        assert_eq!(kv.extra_pages_for(None, 5), 2);
        assert_eq!(kv.extra_pages_for(Some(&t), 5), 2);
        kv.plan(&mut t, &[1, 2, 3, 4, 5], crate::kv::Logits::None)
            .unwrap();
        // Two pages held, 3 slots free in the second.
        assert_eq!(kv.extra_pages_for(Some(&t), 8), 0);
        assert_eq!(kv.extra_pages_for(Some(&t), 9), 1);
        assert_eq!(kv.extra_pages_for(Some(&t), 3), 0);
        assert_eq!((kv.pages_to_grow(&t, 3), kv.pages_to_grow(&t, 4)), (0, 1));
        assert_eq!(kv.room_to_grow(&t), 3 + 6 * 4);
        kv.abort(&mut t, 5);
        kv.release(t).unwrap();
    }
}
