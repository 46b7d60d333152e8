//! The KV layer's errors: misuse of pages and tables, running out of pages, and
//! snapshots. Each says what went wrong; [`KvError::kind`] and
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
    #[error("page {0} is full")]
    PageFull(u32),
    #[error("cannot drop {wanted} tokens from a page holding {fill}")]
    TruncateTooFar { wanted: usize, fill: usize },
}

impl KvError {
    /// Running out of pages is the pool's state (retry later, or a bigger pool); every
    /// other error is a misuse by the caller.
    pub fn kind(&self) -> ErrorKind {
        match self {
            KvError::OutOfPages { .. } => ErrorKind::Unavailable,
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
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0} is not a directory: the snapshot directory must be one (or not exist yet)")]
    NotADirectory(PathBuf),
}

impl SnapshotError {
    /// A missing or misnamed snapshot is the caller's; files that cannot be read or
    /// written are the server's.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SnapshotError::NotFound(_) => ErrorKind::NotFound,
            SnapshotError::BadName(_) | SnapshotError::NotADirectory(_) => ErrorKind::Invalid,
            SnapshotError::Kv(e) => e.kind(),
            SnapshotError::Io { .. } | SnapshotError::Corrupt { .. } => ErrorKind::Internal,
        }
    }
}
