//! [`PageMap`]: the pool page by page — state, references, fill, whether the prefix
//! index finds it, its eviction rank, and who holds it (requests, contexts,
//! snapshots) — for a live view of the cache. Built on the engine thread between
//! steps in one pass over the pages and the tables: O(pages + table entries).

use super::core::Core;
use crate::kv::{PageState, PageTable};

/// Who holds a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Sample `sample` of a request.
    Request { id: u64, sample: usize },
    /// A context (also while it generates).
    Context(u64),
    /// A named snapshot.
    Snapshot(String),
}

/// One page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageEntry {
    pub state: PageState,
    pub refs: u32,
    pub fill: usize,
    pub indexed: bool,
    pub lru_rank: Option<usize>,
    /// Its content is in the disk tier too (`--kv-disk`).
    pub on_disk: bool,
    pub holders: Vec<Holder>,
}

/// Every page of the pool; `pages[i]` is page `i`.
#[derive(Debug, Clone, Default)]
pub struct PageMap {
    pub page_size: usize,
    /// The K/V element type, and the bytes of K/V one page holds in it.
    pub kv_dtype: crate::kv::KvDtype,
    pub page_bytes: usize,
    pub pages: Vec<PageEntry>,
}

impl Core {
    pub fn page_map(&self) -> PageMap {
        let mut pages: Vec<PageEntry> = self
            .kv
            .page_views()
            .into_iter()
            .enumerate()
            .map(|(i, v)| PageEntry {
                state: v.state,
                refs: v.refs,
                fill: v.fill,
                indexed: v.indexed,
                lru_rank: v.lru_rank,
                on_disk: v.indexed && self.kv.page_on_disk(crate::kv::PageId(i as u32)),
                holders: Vec::new(),
            })
            .collect();
        let mut hold = |t: &PageTable, h: Holder| {
            for i in (0..t.num_pages()).filter(|&i| t.holds(i)) {
                if let Some(p) = pages.get_mut(t.page(i).0 as usize) {
                    if !p.holders.contains(&h) {
                        p.holders.push(h.clone());
                    }
                }
            }
        };
        for s in self.sched.seqs() {
            if let Some(t) = &s.table {
                let h = match &s.ctx {
                    Some(link) => Holder::Context(link.ctx),
                    None => Holder::Request {
                        id: s.req,
                        sample: s.index,
                    },
                };
                hold(t, h);
            }
        }
        for (id, t) in self.contexts.tables_by_id() {
            hold(t, Holder::Context(id));
        }
        for (name, t) in self.kv.pinned() {
            hold(t, Holder::Snapshot(name.to_string()));
        }
        PageMap {
            kv_dtype: self.kv.dtype(),
            page_bytes: self.kv.page_bytes(),
            page_size: self.kv.page_size(),
            pages,
        }
    }
}
