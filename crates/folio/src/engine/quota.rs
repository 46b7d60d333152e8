//! The contexts' share of the pool. Contexts and snapshots outlive requests and hold
//! their pages while idle, so together they may hold at most
//! `EngineConfig::context_pages` pages (half the pool by default): a few idle
//! contexts can never take the pages stateless requests need. Pages are counted once
//! however many contexts, forks and snapshots share them (an O(1) fork costs its
//! one copied page, not the whole context again), and a context's pending tokens
//! count for the pages they will take. Every operation that makes a context grow
//! (append, message, generate, fork, reserve) is checked here first, on the engine
//! thread, before anything moves; over the share it is refused
//! ([`EngineError::ContextPages`]) and changes nothing.

use super::core::Core;
use super::error::EngineError;
use crate::kv::holders;

impl Core {
    /// Pages contexts (idle, or running a job) and snapshots hold, each counted once.
    fn context_pages_held(&self) -> usize {
        let running = self
            .sched
            .seqs
            .iter()
            .filter(|s| s.ctx.is_some())
            .filter_map(|s| s.table.as_ref());
        let tables = self
            .contexts
            .tables()
            .chain(self.kv.pinned_tables())
            .chain(running);
        let held = holders(tables, self.kv.num_pages());
        held.iter().filter(|&&n| n > 0).count() + self.contexts.spare_pages().count()
    }

    /// Refuses an operation that would take context `id` `grow` tokens further (and
    /// `pages` more pages besides, a fork's copy or reserved pages) past the
    /// contexts' share of the pool.
    pub(crate) fn check_context_room(
        &self,
        id: u64,
        grow: usize,
        pages: usize,
    ) -> Result<(), EngineError> {
        let limit = self.contexts.page_limit;
        let held = self.context_pages_held();
        let need = self.contexts.pages_to_come(self.kv.page_size(), id, grow) + pages;
        if need > 0 && held + need > limit {
            return Err(EngineError::ContextPages { held, need, limit });
        }
        Ok(())
    }
}
