//! The context routes' core: `POST /v1/contexts` (create), `GET /v1/contexts` (the
//! list), `GET` and `DELETE /v1/contexts/{id}`, and a context's figures, which every
//! context route answers with ([`info`]). The contexts themselves are in
//! `registry.rs`; append, fork and truncate are in `context_edit.rs`, generation in
//! `context_generate.rs`, snapshots in `snapshots.rs`. Engine calls wait for the
//! engine thread, so they run off the async threads ([`blocking`]).

use crate::answer::List;
use crate::body::RawBody;
use crate::error::ApiError;
use crate::offload::blocking;
use crate::params::check_salt;
use crate::registry::Entry;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::Holder;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;

type St = State<Arc<AppState>>;

/// A context's figures: every context route's answer.
#[derive(Serialize)]
pub struct ContextView {
    pub id: String,
    pub object: &'static str,
    pub seq_len: usize,
    pub page_size: usize,
    pub committed_pages: usize,
    pub working_pages: usize,
    pub pending_tokens: usize,
    pub pending_pages: usize,
    pub reserved_pages: usize,
    pub shared_pages: usize,
    pub cache_salt: Option<String>,
    pub parent: Option<String>,
    pub created: u64,
    pub chat: bool,
}

/// A context in the list: its figures, or only that it is busy (generating) now.
#[derive(Serialize)]
#[serde(untagged)]
enum Listed {
    Idle(ContextView),
    Busy {
        id: String,
        object: &'static str,
        busy: bool,
        parent: Option<String>,
    },
}

/// `DELETE /v1/contexts/{id}`'s answer.
#[derive(Serialize)]
struct Deleted {
    id: String,
    object: &'static str,
    deleted: bool,
}

/// A context's figures (it must be idle: 409 while it generates).
pub fn info(id: &str, e: &Entry) -> Result<ContextView, ApiError> {
    info_in(id, e, &e.ctx.engine().page_map()?)
}

/// [`info`] with the pool's page map already read (one map serves a whole list).
fn info_in(id: &str, e: &Entry, map: &folio::PageMap) -> Result<ContextView, ApiError> {
    let i = e.ctx.info()?;
    let me = Holder::Context(e.ctx.id());
    let shared = map
        .pages
        .iter()
        .filter(|p| p.holders.contains(&me) && p.holders.len() > 1)
        .count();
    Ok(ContextView {
        id: id.to_string(),
        object: "context",
        seq_len: i.seq_len,
        page_size: i.page_size,
        committed_pages: i.committed_pages,
        working_pages: i.working_pages,
        pending_tokens: i.pending_tokens,
        pending_pages: i.pending_tokens.div_ceil(i.page_size),
        reserved_pages: i.spare_pages,
        shared_pages: shared,
        cache_salt: e.salt.clone(),
        parent: e.parent.clone(),
        created: e.created,
        chat: e.chat.load(Ordering::Relaxed),
    })
}

/// Adds `entry` to the registry under a new id (429 past `--max-contexts`); its
/// figures, as the routes that make a context answer (201).
pub fn register(st: &AppState, entry: Entry) -> Result<ContextView, ApiError> {
    let id = st.contexts.insert(st.config.max_contexts, entry)?;
    let e = st.contexts.get(&id)?;
    info(&id, &e)
}

#[derive(Deserialize, Default)]
pub struct CreateContext {
    pub cache_salt: Option<String>,
    /// A system message to start with.
    pub system: Option<String>,
}

impl CreateContext {
    /// The body of `POST /v1/contexts`: JSON, or nothing (blank) for the defaults.
    pub fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        let c: Self = if body.iter().all(u8::is_ascii_whitespace) {
            Self::default()
        } else {
            crate::body::parse(body)?
        };
        check_salt(c.cache_salt.as_deref())?;
        Ok(c)
    }
}

pub async fn create(State(st): St, RawBody(body): RawBody) -> Result<Response, ApiError> {
    let c = CreateContext::from_body(&body)?;
    let engine = st.engine()?;
    let st2 = st.clone();
    let v = blocking(move || {
        let salt = c.cache_salt.clone().map(String::into_bytes);
        let ctx = engine.context(salt)?;
        if let Some(sys) = &c.system {
            ctx.system(sys)?;
        }
        register(
            &st2,
            Entry::new(ctx, c.cache_salt, None, c.system.is_some()),
        )
    })
    .await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

pub async fn list(State(st): St) -> Result<Response, ApiError> {
    let engine = st.engine()?;
    let st2 = st.clone();
    let data = blocking(move || {
        let map = engine.page_map()?;
        Ok(st2
            .contexts
            .list()
            .into_iter()
            .map(|(id, e)| match info_in(&id, &e, &map) {
                Ok(v) => Listed::Idle(v),
                Err(_) => Listed::Busy {
                    id,
                    object: "context",
                    busy: true,
                    parent: e.parent.clone(),
                },
            })
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(Json(List::new(data)).into_response())
}

pub async fn get(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    st.engine()?;
    let e = st.contexts.peek(&id)?;
    let v = blocking(move || info(&id, &e)).await?;
    Ok(Json(v).into_response())
}

pub async fn delete(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    st.contexts.remove(&id)?;
    let answer = Deleted {
        id,
        object: "context",
        deleted: true,
    };
    Ok(Json(answer).into_response())
}
