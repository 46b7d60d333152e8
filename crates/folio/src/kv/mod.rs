//! The paged KV cache's bookkeeping: pages, their states and refcounts, page tables,
//! and the content-addressed prefix index. It knows nothing of the model, HTTP or
//! files. The K/V bytes live in one arena indexed by [`PageId`] ([`KvArena`]); a
//! [`PagedKv`] owns both and hands the model [`PagedSeq`] views.
//!
//! # Page states
//!
//! ```text
//!            reserve                commit (full)             last holder releases
//!   Free ───────────────▶ Working ───────────────▶ Committed ─────────────────────▶ Cached
//!    ▲                     │ release                 ▲  refcount ≥ 1                 │
//!    └─────────────────────┘                         └──── prefix hit (ref) ◀────────┤
//!    ▲                                                                                │
//!    └──────────────────────────── evicted (LRU, when no page is free) ──────────────┘
//! ```
//!
//! NOTE: invariants (checked by `PageStore::check` in the property tests):
//! - a working page has exactly one owner and is never in the prefix index;
//! - a committed page is full, immutable, indexed, and its refcount equals the number
//!   of page tables (and pins) that hold it;
//! - a cached page is committed with refcount 0: still indexed, reclaimable in LRU order;
//! - a free page is in no table and not indexed.

mod arena;
mod buf;
mod hash;
mod paged;
mod seq;
mod snapshot;
mod store;
mod table;

#[cfg(test)]
mod tests;

pub use arena::KvArena;
pub use buf::{KvBuf, KvDtype, KvRows};
pub use hash::{Hasher128, PageHash};
pub use paged::{PagedBatch, PagedKv, PagedSeq};
pub use snapshot::SnapshotError;
pub use store::{KvError, PageId, PageState, PageStore, Stats};
pub use table::{holders, shared_pages, ForkGroup, PageTable};
