//! The contexts' share of the pool. Contexts and snapshots outlive requests and hold
//! their pages while idle, so together they may hold at most
//! `EngineConfig::context_pages` pages (`folio serve`: half the pool by default; no
//! limit for a program's own contexts): a few idle contexts can never take the pages
//! stateless requests need. Pages are counted once
//! however many contexts, forks and snapshots share them (an O(1) fork costs its
//! one copied page, not the whole context again), and a context's pending tokens
//! count for the pages they will take, and so does a running generation for what
//! it may still sample (reserved when it starts). Every operation that makes a context grow
//! (append, message, fork) is checked here first, on the engine thread, before
//! anything moves; over the share it is refused ([`EngineError::ContextPages`]) and
//! changes nothing. A generation into a context may add what is left of the share
//! (its `max_tokens` is capped there, as at the window), and reserved pages are
//! taken first and given back when they pass the share.

use super::core::Core;
use super::error::EngineError;
use super::seq::Purpose;
use crate::kv::holders;

impl Core {
    /// Pages contexts (idle, or running a job) and snapshots hold, each counted once.
    fn context_pages_held(&self) -> usize {
        let running = self
            .sched
            .seqs()
            .iter()
            .filter(|s| s.ctx.is_some())
            .filter_map(|s| s.table.as_ref());
        let tables = self
            .contexts
            .tables()
            .chain(self.kv.pinned_tables())
            .chain(running);
        let held = holders(tables, self.kv.num_pages());
        held.iter().filter(|&&n| n > 0).count()
            + self.contexts.spare_pages().count()
            + self.context_jobs_to_come()
    }

    /// Pages the running (or queued) context jobs will still take: each may grow to
    /// its tokens plus what it may still sample. Counted as held from the job's start,
    /// so generations that start together cannot each take the same room.
    fn context_jobs_to_come(&self) -> usize {
        self.sched
            .seqs()
            .iter()
            .filter(|s| s.ctx.is_some())
            .map(|s| {
                let more = match &s.purpose {
                    Purpose::Generate(g) => g.max_tokens.saturating_sub(g.generated),
                    Purpose::Flush | Purpose::Embed(_) => 0,
                };
                self.kv
                    .extra_pages_for(s.table.as_ref(), s.tokens.len() + more)
            })
            .sum()
    }

    /// Pages still free in the contexts' share: what the contexts and snapshots do not
    /// hold and their pending tokens will not take.
    fn context_pages_free(&self) -> usize {
        let coming = self.contexts.pages_to_come(&self.kv, 0, 0);
        self.contexts
            .page_limit
            .saturating_sub(self.context_pages_held() + coming)
    }

    /// Tokens a generation into context `id` may sample after its `prompt` tokens,
    /// within the contexts' share of the pool: a generation stops there as at the
    /// window (finish `length`), so it never takes the context past it. An error when
    /// the prompt and one token do not fit.
    pub(crate) fn context_room_tokens(&self, id: u64, prompt: usize) -> Result<usize, EngineError> {
        // The free slots of the context's last page are its own already.
        let room = (self.kv.tokens_in(self.context_pages_free()))
            .saturating_add(self.contexts.slack(&self.kv, id));
        if prompt >= room {
            return Err(EngineError::ContextPages {
                held: self.context_pages_held(),
                need: self.kv.pages_for(prompt + 1 - room),
                limit: self.contexts.page_limit,
            });
        }
        Ok(room - prompt)
    }

    /// Refuses when contexts and snapshots hold more than their share: checked after
    /// an operation that takes its pages first (the caller then undoes it).
    pub(crate) fn check_context_share(&self) -> Result<(), EngineError> {
        let (held, limit) = (self.context_pages_held(), self.contexts.page_limit);
        if held > limit {
            return Err(EngineError::ContextPages {
                held,
                need: 0,
                limit,
            });
        }
        Ok(())
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
        let need = self.contexts.pages_to_come(&self.kv, id, grow) + pages;
        if need > 0 && held + need > limit {
            return Err(EngineError::ContextPages { held, need, limit });
        }
        Ok(())
    }
}
