//! [`Deadline`]: one request's wall-clock limit (`--request-timeout`), counted from
//! when its handler starts (the body's arrival has its own limit). Generation runs
//! check it between events ([`crate::run::Run`]); the work before a run (tokenizing,
//! compiling a grammar) and a snapshot save's flush check it too. Past it the answer
//! is 503 with code `request_timeout`, and the request's work is stopped: a run is
//! cancelled, a flush is cancelled and its save not made (an earlier snapshot of that
//! name stays as it was). Routes that only touch page tables (fork, truncate, load,
//! delete, info) or only queue tokens (create, append) do no model work: they are
//! bounded by the pool's size and the body limit, and are not timed.

use crate::error::ApiError;
use crate::state::AppState;
use folio::EngineError;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// When a request is stopped, and the limit (for the message); `None`: no limit.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Option<(Instant, Duration)>);

impl Deadline {
    /// The limit of a request starting now.
    pub fn start(st: &AppState) -> Self {
        Self(
            st.config
                .request_timeout
                .and_then(|limit| Some((Instant::now().checked_add(limit)?, limit))),
        )
    }

    /// When to stop and the limit, as the engine's `*_by` calls take them.
    pub fn get(self) -> Option<(Instant, Duration)> {
        self.0
    }

    /// The answer of a request stopped by it (counted in the metrics).
    pub fn timed_out(st: &AppState, limit: Duration) -> ApiError {
        tracing::warn!("a request ran past --request-timeout ({limit:?}): stopped");
        st.metrics.timed_out.fetch_add(1, Ordering::Relaxed);
        st.metrics.failed.fetch_add(1, Ordering::Relaxed);
        EngineError::TimedOut { limit }.into()
    }

    /// Awaits `f`, or answers [`Deadline::timed_out`] when time runs out first (`f` is
    /// then dropped: only for work that changes nothing, or stops when dropped).
    pub async fn within<F: Future>(self, st: &AppState, f: F) -> Result<F::Output, ApiError> {
        let Some((at, limit)) = self.0 else {
            return Ok(f.await);
        };
        tokio::time::timeout_at(at.into(), f)
            .await
            .map_err(|_| Self::timed_out(st, limit))
    }
}
