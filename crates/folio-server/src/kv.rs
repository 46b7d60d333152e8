//! The pool over HTTP: `GET /v1/kv`, every page (state, references, fill, indexed,
//! eviction rank, who holds it, contexts under their server ids) and the totals; and
//! `GET /v1/kv/check`, the page store's invariants checked between two steps. Both
//! are debug views behind the API key like the rest of `/v1`.

use crate::error::ApiError;
use crate::offload::blocking;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::{Holder, PageState};
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<AppState>>;

/// `GET /v1/kv/check`: the page store's invariants (every page's state and
/// references against every table, the free list, the eviction order, the prefix
/// index), checked between two steps. 200 when they hold; a violation is a bug: 500
/// naming the first page at fault. It walks every page: a debug route, behind the
/// API key like the rest of /v1.
pub async fn check(State(st): St) -> Result<Response, ApiError> {
    let engine = st.engine()?;
    let pages = blocking(move || {
        engine.check_invariants()?;
        Ok(engine.stats()?.pages_total)
    })
    .await?;
    Ok(Json(json!({"object": "kv.check", "ok": true, "pages": pages})).into_response())
}

fn state_str(s: PageState) -> &'static str {
    match s {
        PageState::Free => "free",
        PageState::Working => "working",
        PageState::Committed => "committed",
        PageState::Cached => "cached",
    }
}

/// `GET /v1/kv`: every page (state, references, fill, indexed, eviction rank, who
/// holds it) and the totals.
pub async fn kv(State(st): St) -> Result<Response, ApiError> {
    let engine = st.engine()?;
    let ids = st.contexts.ids();
    let (map, stats) = blocking(move || Ok((engine.page_map()?, engine.stats()?))).await?;
    let pages: Vec<Value> = map
        .pages
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let holders: Vec<String> = p
                .holders
                .iter()
                .map(|h| match h {
                    Holder::Request { id, sample } => format!("req-{id}.{sample}"),
                    Holder::Context(c) => ids
                        .get(c)
                        .cloned()
                        .unwrap_or_else(|| format!("context-{c}")),
                    Holder::Snapshot(n) => format!("snapshot:{n}"),
                })
                .collect();
            json!({"id": i, "state": state_str(p.state), "refs": p.refs, "fill": p.fill,
                   "indexed": p.indexed, "lru": p.lru_rank, "holders": holders})
        })
        .collect();
    Ok(Json(json!({
        "object": "kv",
        "page_size": map.page_size,
        "totals": {
            "pages": stats.pages_total, "free": stats.pages_free, "working": stats.pages_working,
            "committed": stats.pages_committed, "cached": stats.pages_cached,
            "pinned": stats.pages_pinned, "shared": stats.pages_shared,
            "running": stats.running, "waiting": stats.waiting,
        },
        "pages": pages,
    }))
    .into_response())
}
