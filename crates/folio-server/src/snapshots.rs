//! The snapshot routes: `POST /v1/snapshots` (save a context under a name: its pages
//! flushed and pinned, and written to disk), `GET /v1/snapshots` (the list),
//! `POST /v1/snapshots/{name}/load` (a new context from it) and
//! `DELETE /v1/snapshots/{name}`. A save past `--request-timeout` is cancelled and
//! writes nothing; one over the snapshot quota is 507.

use crate::answer::List;
use crate::body::JsonBody;
use crate::contexts::register;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::offload::blocking;
use crate::registry::Entry;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::Context;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

type St = State<Arc<AppState>>;

/// A snapshot: its name and length; `context` only in a save's answer (the
/// context saved).
#[derive(Serialize)]
struct SnapshotView {
    name: String,
    object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<String>,
    tokens: usize,
}

/// `DELETE /v1/snapshots/{name}`'s answer.
#[derive(Serialize)]
struct Deleted {
    name: String,
    object: &'static str,
    deleted: bool,
}

#[derive(Deserialize)]
pub struct Save {
    pub context: String,
    pub name: String,
}

impl Save {
    /// The name can name a snapshot (checked before the context's flush).
    pub fn check(&self) -> Result<(), ApiError> {
        Context::check_name(&self.name).map_err(|e| {
            let mut e = ApiError::from(e);
            e.param = Some("name".into());
            e
        })
    }
}

pub async fn save(State(st): St, JsonBody(s): JsonBody<Save>) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    s.check()?;
    st.engine()?;
    let e = st.contexts.get(&s.context)?;
    let name = s.name.clone();
    let st2 = st.clone();
    let tokens = blocking(move || {
        use folio::SnapshotError as S;
        match e.ctx.save_by(&s.name, deadline.get()) {
            Err(folio::EngineError::TimedOut { limit }) => {
                return Err(Deadline::timed_out(&st2, limit))
            }
            // Over the snapshot quota: 507, no Retry-After (waiting frees nothing; a
            // delete does).
            Err(folio::EngineError::Snapshot(q @ (S::OverBytes { .. } | S::TooMany { .. }))) => {
                let mut err = ApiError::new(StatusCode::INSUFFICIENT_STORAGE, q.to_string());
                err.code = Some("snapshot_quota_exceeded");
                return Err(err);
            }
            r => r?,
        }
        Ok(e.ctx.info()?.seq_len)
    })
    .await?;
    let answer = SnapshotView {
        name,
        object: "snapshot",
        context: Some(s.context),
        tokens,
    };
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

pub async fn list(State(st): St) -> Result<Response, ApiError> {
    let engine = st.engine()?;
    let list = blocking(move || Ok(engine.snapshot_list()?)).await?;
    let data = list
        .into_iter()
        .map(|(name, tokens)| SnapshotView {
            name,
            object: "snapshot",
            context: None,
            tokens,
        })
        .collect();
    Ok(Json(List::new(data)).into_response())
}

pub async fn load(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let engine = st.engine()?;
    let st2 = st.clone();
    let v = blocking(move || {
        let ctx = Context::load(&engine, &name)?;
        // The tenant salt the snapshot was saved with (a server's salts are text).
        let salt = ctx.salt()?.and_then(|s| String::from_utf8(s).ok());
        register(
            &st2,
            Entry::new(ctx, salt, Some(format!("snapshot:{name}")), false),
        )
    })
    .await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

pub async fn delete(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let engine = st.engine()?;
    let n = name.clone();
    blocking(move || Ok(Context::delete(&engine, &n)?)).await?;
    let answer = Deleted {
        name,
        object: "snapshot",
        deleted: true,
    };
    Ok(Json(answer).into_response())
}
