//! KV events: the prefix index's changes (a page stored, a page evicted), handed to
//! one subscriber off the engine thread, for a publisher that tells a prefix-aware
//! router what this replica holds (`folio serve --kv-events`).
//!
//! [`kv_event_channel`] makes the two ends: the [`KvEventTap`] goes into
//! [`super::EngineConfig::kv_events`], the [`KvEventReceiver`] to whoever publishes.
//! The engine turns the pool's recording on before it restores snapshots (restored
//! pages are stored events too) and, between steps, hands over what the pool recorded
//! as one [`KvEventBatch`].
//!
//! The engine never waits for the subscriber: the channel is bounded, and a batch
//! that does not fit is dropped and counted ([`KvEventReceiver::dropped`]). The next
//! batch that fits then says [`KvEventBatch::cleared`]: events were lost, so the
//! subscriber should forget everything it knew of this pool and rebuild from the
//! events that follow. A router that does so holds a subset of what the pool holds
//! (pages stored before the loss and still indexed are unknown to it until they are
//! stored again), never a page the pool no longer has. The first batch is `cleared`
//! as well: a replica that starts holds nothing a router may remember of an earlier
//! run.

use crate::kv::{PageEvent, PagedKv};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// One change to the prefix index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// A full page entered the index: its chained hash, what it continues, its tokens,
    /// and for the first page of a tenant's chain (`parent` is then the salted root)
    /// the tenant's salt (`cache_salt`), which vLLM hashes into such a page's key.
    Stored {
        hash: u128,
        parent: KvParent,
        tokens: Vec<u32>,
        salt: Option<std::sync::Arc<[u8]>>,
    },
    /// A page left the index (evicted to make room).
    Removed { hash: u128 },
}

/// What a stored page continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvParent {
    /// Nothing: it is the first page of a sequence without a tenant salt.
    Root,
    /// The page of this hash; or, where no stored page had it, the root of a salted
    /// chain (a tenant's first page).
    Hash(u128),
}

/// The changes of one or more steps, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvEventBatch {
    /// Forget every page known of this pool before applying `events`: the first
    /// batch, and the first after batches were dropped.
    pub cleared: bool,
    pub events: Vec<KvEvent>,
}

/// The engine's end of the channel (cloned into [`super::EngineConfig`]).
#[derive(Clone)]
pub struct KvEventTap {
    tx: SyncSender<KvEventBatch>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for KvEventTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventTap").finish_non_exhaustive()
    }
}

/// The subscriber's end.
pub struct KvEventReceiver {
    rx: Receiver<KvEventBatch>,
    dropped: Arc<AtomicU64>,
}

/// A channel of at most `capacity` batches (at least one) between the engine and one
/// subscriber.
pub fn kv_event_channel(capacity: usize) -> (KvEventTap, KvEventReceiver) {
    let (tx, rx) = std::sync::mpsc::sync_channel(capacity.max(1));
    let dropped = Arc::new(AtomicU64::new(0));
    (
        KvEventTap {
            tx,
            dropped: dropped.clone(),
        },
        KvEventReceiver { rx, dropped },
    )
}

impl KvEventReceiver {
    /// The next batch; `Ok(None)` when none came within `timeout`; `Err(())` once the
    /// engine has stopped and every batch was taken.
    #[allow(clippy::result_unit_err)]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<KvEventBatch>, ()> {
        match self.rx.recv_timeout(timeout) {
            Ok(b) => Ok(Some(b)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(()),
        }
    }

    /// Batches the engine dropped because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The engine thread's side: takes the pool's recorded changes and sends them.
pub(crate) struct EventPump {
    tap: KvEventTap,
    /// The chain root of unsalted tables (a stored page continuing it is a first page).
    root: u128,
    /// Batches were lost (or none was sent yet): the next one says `cleared`.
    lost: bool,
    /// The subscriber went away: nothing is recorded or sent any more.
    closed: bool,
}

impl EventPump {
    /// Turns the pool's recording on.
    pub(crate) fn new(tap: KvEventTap, kv: &mut PagedKv) -> Self {
        kv.set_page_events(true);
        Self {
            tap,
            root: kv.new_table(None).tail_hash().0,
            lost: true,
            closed: false,
        }
    }

    /// Sends what the pool recorded since the last call, without waiting: a full
    /// channel drops the batch (counted) and marks the next one `cleared`.
    pub(crate) fn pump(&mut self, kv: &mut PagedKv) {
        if self.closed {
            return;
        }
        let taken = kv.take_page_events();
        if taken.is_empty() && !self.lost {
            return;
        }
        let events = taken
            .into_iter()
            .map(|e| match e {
                PageEvent::Stored {
                    hash,
                    parent,
                    tokens,
                    ..
                } => {
                    let (parent, salt) = if parent.0 == self.root {
                        (KvParent::Root, None)
                    } else {
                        (KvParent::Hash(parent.0), kv.salt_of_root(parent.0))
                    };
                    KvEvent::Stored {
                        hash: hash.0,
                        parent,
                        tokens,
                        salt,
                    }
                }
                PageEvent::Removed { hash } => KvEvent::Removed { hash: hash.0 },
            })
            .collect::<Vec<_>>();
        let batch = KvEventBatch {
            cleared: self.lost,
            events,
        };
        match self.tap.tx.try_send(batch) {
            Ok(()) => {
                self.lost = false;
            }
            Err(TrySendError::Full(_)) => {
                if !self.lost {
                    tracing::warn!("KV events: the subscriber lags; events dropped, it will be told to start over");
                }
                self.tap.dropped.fetch_add(1, Ordering::Relaxed);
                self.lost = true;
            }
            // Nobody listens any more: stop recording.
            Err(TrySendError::Disconnected(_)) => {
                kv.set_page_events(false);
                self.closed = true;
            }
        }
    }
}
