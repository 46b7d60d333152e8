//! The KV layer's errors: misuse of pages and tables, running out of pages, and
//! snapshots (their files, and their quota). Each says what went wrong; [`KvError::kind`] and
//! [`SnapshotError::kind`] say whose fault it is, so a server can answer with the right
//! status without reading the text.

use super::store::PageState;
use crate::error::ErrorKind;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;

/// Misuse of pages, and running out of them.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum KvError {
    #[error("out of KV pages: {wanted} needed, {available} free or reclaimable")]
    OutOfPages { wanted: usize, available: usize },
    #[error("a sequence of {len} tokens does not fit: a sequence holds at most {max}")]
    SequenceFull { len: usize, max: usize },
    #[error("page {0} does not exist")]
    InvalidPage(u32),
    #[error("page {id} is {state:?}; the operation needs {needed}")]
    WrongState {
        id: u32,
        state: PageState,
        needed: &'static str,
    },
    #[error("page {id} holds {fill} of {page_size} tokens; only a full page can be committed")]
    CommitPartial {
        id: u32,
        fill: usize,
        page_size: usize,
    },
    /// More working pages to commit than the table has full ones, and no partial one
    /// after them to blame.
    #[error("cannot commit {wanted} working pages: the table has {full} full ones")]
    CommitTooMany { wanted: usize, full: usize },
    #[error("cannot release {wanted} working pages: the table has {have}")]
    ReleaseTooMany { wanted: usize, have: usize },
    #[error("page {0} is full")]
    PageFull(u32),
    #[error("cannot drop {wanted} tokens from a page holding {fill}")]
    TruncateTooFar { wanted: usize, fill: usize },
    /// The table gave up its first pages (they left every layer's sliding window): what
    /// needs them (reading its tokens back, a snapshot, truncating into them) cannot be.
    #[error("the sequence no longer holds its first {pages} pages (they left the sliding window): {needed} needs them")]
    Forgotten { pages: usize, needed: &'static str },
    /// K/V a backend left on its device could not be read back from it.
    #[error("K/V held on the device could not be read back: {0}")]
    Device(String),
}

impl KvError {
    /// Running out of pages is the pool's state (retry later, or a bigger pool); every
    /// other error is a misuse by the caller.
    pub fn kind(&self) -> ErrorKind {
        match self {
            KvError::OutOfPages { .. } => ErrorKind::Unavailable,
            KvError::Device(_) => ErrorKind::Internal,
            _ => ErrorKind::Invalid,
        }
    }
}

/// What can go wrong with a snapshot.
#[derive(Debug, Clone, Error)]
pub enum SnapshotError {
    #[error("no snapshot named {0:?}")]
    NotFound(String),
    #[error("snapshot name {0:?}: use letters, digits, '-', '_' and '.' (1 to 128 of them)")]
    BadName(String),
    #[error("{0}")]
    Kv(#[from] KvError),
    /// The OS error is part of the message (not a `source`), so it is printed once.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: Arc<std::io::Error>,
    },
    /// The disk (or the process's file-size limit) is full: nothing of the new save
    /// stays, and the previous file of that name is untouched.
    #[error("{path}: {error}: the disk is full or the file-size limit was reached; the snapshot was not saved and the previous save of this name, if any, is kept")]
    NoSpace {
        path: PathBuf,
        error: Arc<std::io::Error>,
    },
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The file holds K/V of another element type than the pool's (`--kv-dtype`): it
    /// is not restored (K/V of one dtype is never read as another).
    #[error("{path}: saved with {file} K/V; this pool stores {pool} (--kv-dtype): not restored")]
    WrongDtype {
        path: PathBuf,
        file: super::buf::KvDtype,
        pool: super::buf::KvDtype,
    },
    /// A save that never completed (the process was killed while writing it): its
    /// temporary file is removed at start and the last complete save stays.
    #[error("{path}: an interrupted save of snapshot {name:?} ({bytes} bytes written) was removed; the last complete save of {name:?}, if any, is the one restored")]
    Interrupted {
        path: PathBuf,
        name: String,
        bytes: u64,
    },
    #[error("{0} is not a directory: the snapshot directory must be one (or not exist yet)")]
    NotADirectory(PathBuf),
    /// The snapshot files would outgrow their quota: nothing was written.
    #[error("snapshot {name:?} needs {bytes} bytes on disk; snapshot files use {used} of the {limit} bytes allowed (--snapshot-max-bytes): delete snapshots to make room. Nothing was saved; the previous save of this name, if any, is kept")]
    OverBytes {
        name: String,
        bytes: u64,
        used: u64,
        limit: u64,
    },
    /// Saving a new name would keep more snapshots than allowed: nothing was written.
    #[error("snapshot {name:?} would be one more than the {limit} snapshots allowed (--max-snapshots): delete one first, or save under an existing name. Nothing was saved")]
    TooMany { name: String, limit: usize },
    /// The table's tenant salt is longer than a snapshot file keeps (with a snapshot
    /// directory): nothing was saved.
    #[error("a tenant salt of {bytes} bytes is longer than a snapshot keeps ({limit}): nothing was saved")]
    SaltTooLong { bytes: usize, limit: usize },
    /// The name's file in the snapshot directory is a snapshot of another pool (another
    /// model, K/V type or page size, sharing the directory), which this one neither
    /// lists nor loads: a save would destroy it unseen.
    #[error("{path}: snapshot {name:?} there was saved by a server of another model, K/V type or page size sharing the directory; this one does not replace it: save under another name, or delete the file there. Nothing was saved")]
    TakenByAnother { name: String, path: PathBuf },
    /// A save's pin is gone (it was ended, or its pages did not hold what it
    /// pinned): a bug of whoever drives the save.
    #[error("save {0} is not in progress, or its pinned pages came back short")]
    SaveGone(u64),
}

impl SnapshotError {
    /// A missing or misnamed snapshot is the caller's; a full disk is a resource
    /// running out (like pages); files that cannot be read or written are the server's.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SnapshotError::NotFound(_) => ErrorKind::NotFound,
            SnapshotError::BadName(_)
            | SnapshotError::NotADirectory(_)
            | SnapshotError::SaltTooLong { .. }
            | SnapshotError::TakenByAnother { .. } => ErrorKind::Invalid,
            SnapshotError::Kv(e) => e.kind(),
            // Full disk or quota: the server cannot store now; freeing space fixes it.
            SnapshotError::NoSpace { .. }
            | SnapshotError::OverBytes { .. }
            | SnapshotError::TooMany { .. } => ErrorKind::Unavailable,
            SnapshotError::Io { .. }
            | SnapshotError::Corrupt { .. }
            | SnapshotError::WrongDtype { .. }
            | SnapshotError::Interrupted { .. }
            | SnapshotError::SaveGone(_) => ErrorKind::Internal,
        }
    }
}
