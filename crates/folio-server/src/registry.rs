//! The context registry: each server context is a `folio::Context` under an id
//! (`ctx-N`), with its salt, its parent (for the context tree) and its last use.
//! Contexts idle longer than `--context-ttl` are dropped by the reaper
//! ([`Contexts::reap`]; their committed pages stay cached), and at most
//! `--max-contexts` live at once: above, the least recently used idle context of a
//! stored response (`responses_store.rs`; those are a cache a client did not ask for
//! by name) makes room, and with none such the answer is 429. A look at a context's
//! figures does not renew it; using it does.

use crate::clock::unix_now;
use crate::error::ApiError;
use axum::http::StatusCode;
use folio::Context;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One server context.
pub struct Entry {
    pub ctx: Context,
    pub salt: Option<String>,
    /// The context it was forked from, or the snapshot it was loaded from.
    pub parent: Option<String>,
    pub created: u64,
    /// Messages were appended: generation replies as the assistant.
    pub chat: AtomicBool,
    /// A stored response's context: dropped to make room when the registry is full,
    /// and read-only through the context routes (its record says what it holds).
    pub evictable: bool,
    last_used: Mutex<Instant>,
}

impl Entry {
    pub fn new(ctx: Context, salt: Option<String>, parent: Option<String>, chat: bool) -> Self {
        Self {
            ctx,
            salt,
            parent,
            created: unix_now(),
            chat: AtomicBool::new(chat),
            evictable: false,
            last_used: Mutex::new(Instant::now()),
        }
    }

    /// 409 for a stored response's context: appending, truncating or generating into
    /// it would change the conversation its response continues from under it. A
    /// fork of it is an ordinary context.
    pub fn editable(&self, id: &str) -> Result<(), ApiError> {
        if self.evictable {
            let mut e = ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "context {id:?} holds a stored response: continue it with \
                     previous_response_id, or fork it and change the fork"
                ),
            );
            e.code = Some("context_read_only");
            return Err(e);
        }
        Ok(())
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}

/// The live contexts by id.
#[derive(Default)]
pub struct Contexts {
    map: Mutex<HashMap<String, Arc<Entry>>>,
    next: AtomicU64,
}

impl Contexts {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a context under a new id. When `max` are live already, the evictable one
    /// idle longest that no request uses goes; with none such, 429.
    pub fn insert(&self, max: usize, e: Entry) -> Result<String, ApiError> {
        self.insert_shared(max, Arc::new(e))
    }

    /// [`Contexts::insert`] of an entry a request may still hold (it counts as in use
    /// until that request lets go).
    pub fn insert_shared(&self, max: usize, e: Arc<Entry>) -> Result<String, ApiError> {
        let mut m = self.map();
        if m.len() >= max {
            let victim = m
                .iter()
                .filter(|(_, e)| e.evictable && Arc::strong_count(e) == 1)
                .max_by_key(|(_, e)| e.idle_for())
                .map(|(k, _)| k.clone());
            if let Some(k) = victim {
                m.remove(&k);
            }
        }
        if m.len() >= max {
            let mut err = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{max} contexts are live (--max-contexts): delete one first"),
            );
            err.retry_after = Some(5);
            return Err(err);
        }
        let id = format!("ctx-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        m.insert(id.clone(), e);
        Ok(id)
    }

    /// The context, as used now (its idle time starts again).
    pub fn get(&self, id: &str) -> Result<Arc<Entry>, ApiError> {
        let e = self.peek(id)?;
        e.touch();
        Ok(e)
    }

    /// The context, for reading its figures only: a look does not keep a context
    /// alive (else a cheap GET would renew an idle one's pages forever).
    pub fn peek(&self, id: &str) -> Result<Arc<Entry>, ApiError> {
        self.map().get(id).cloned().ok_or_else(|| no_context(id))
    }

    /// Whether context `id` is live.
    pub fn contains(&self, id: &str) -> bool {
        self.map().contains_key(id)
    }

    pub fn remove(&self, id: &str) -> Result<(), ApiError> {
        self.map()
            .remove(id)
            .map(drop)
            .ok_or_else(|| no_context(id))
    }

    /// Every live context, in the order of their ids' numbers.
    pub fn list(&self) -> Vec<(String, Arc<Entry>)> {
        let mut v: Vec<_> = self
            .map()
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        v.sort_by_key(|(k, _)| k[4..].parse::<u64>().unwrap_or(0));
        v
    }

    /// Engine context id → server id.
    pub fn ids(&self) -> HashMap<u64, String> {
        self.map()
            .iter()
            .map(|(k, e)| (e.ctx.id(), k.clone()))
            .collect()
    }

    /// Drops contexts idle for longer than `ttl` that no request is using (a request
    /// holds an `Arc` of the entry: a generation through its [`InUse`] mark, for as long as
    /// it runs).
    pub fn reap(&self, ttl: Duration) -> usize {
        let mut m = self.map();
        let before = m.len();
        m.retain(|_, e| Arc::strong_count(e) > 1 || e.idle_for() <= ttl);
        before - m.len()
    }
}

/// Marks a context in use while a generation into it runs (the reaper skips it), and
/// starts its idle time again when the generation ends.
pub struct InUse(pub Arc<Entry>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.touch();
    }
}

fn no_context(id: &str) -> ApiError {
    let mut e = ApiError::new(StatusCode::NOT_FOUND, format!("no context {id:?}"));
    e.code = Some("context_not_found");
    e
}
