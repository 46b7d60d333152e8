//! The KV layer: where K/V live and who may write them. It knows nothing of the model,
//! the engine, HTTP or (but for snapshots) files, and imports only `kernels` (element
//! types) below it.
//!
//! - The paged pool: pages, their states and refcounts, page tables, the
//!   content-addressed prefix index (`store.rs`, private), the K/V bytes of every
//!   page in one [`KvArena`], and the facade that owns both ([`PagedKv`]).
//! - [`Batch`]: the plain-data plan of one forward step (each sequence's new tokens,
//!   positions and page ids). Pages are reserved when a batch is planned and committed
//!   after the model ran it, never by the model.
//! - [`KvStorage`]: the page-addressed K/V the model writes and reads; a backend with a
//!   device copy of the pool may leave its rows there ([`DevicePages`], `held.rs`).
//! - [`KvSeq`]: one sequence driven by its owner without an engine, implemented by the
//!   pool's [`PagedSeq`] and by [`BasicCache`], the contiguous oracle.
//! - Page arithmetic on the pool (`pages.rs`: pages for tokens, what a table needs to
//!   grow, whether a sequence fits) and the raw working-page operations (`working.rs`),
//!   so callers speak in pages and tables, never in `div_ceil`s of the page size.
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
//!   of page tables (and pins) that hold it (a table no longer holds the pages it
//!   forgot: see `table.rs`);
//! - a cached page is committed with refcount 0: still indexed, reclaimable in LRU order;
//! - a free page is in no table and not indexed.

mod arena;
mod basic;
mod batch;
mod buf;
mod disk;
mod error;
mod hash;
mod held;
mod paged;
mod pages;
mod seq;
mod single;
mod snapshot;
mod storage;
mod store;
mod table;
mod working;

#[cfg(test)]
mod tests;

pub use arena::KvArena;
pub use basic::BasicCache;
pub use batch::{Batch, Logits, SeqStep};
pub use buf::{KvBuf, KvDtype, KvPair, KvRows};
pub use disk::{DiskConfig, DiskError, DiskOpened, DiskStats};
pub use error::{KvError, SnapshotError};
pub use hash::{Hasher128, PageHash};
pub use held::{DevicePages, Fetch};
pub use paged::{PagedKv, PagedSeq, PoolShape};
pub use single::KvSeq;
pub use snapshot::{check_name as check_snapshot_name, is_plain_name};
pub use snapshot::{
    list_snapshot_files, read_snapshot_file, read_snapshot_file_id, remove_snapshot_file,
    FileStamp, SaveTicket, SnapFileId, SnapshotLimits, SnapshotLock, Written, SAVE_CHUNK_BYTES,
};
pub use storage::KvStorage;
pub use store::{PageEvent, PageId, PageState, PageView, Stats, MAX_PAGES};
pub use table::{holders, shared_pages, ForkGroup, PageTable};
