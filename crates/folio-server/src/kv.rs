//! The pool over HTTP: `GET /v1/kv`, every page (state, references, fill, indexed,
//! eviction rank, whether the disk tier has it too, who holds it, contexts under their
//! server ids) and the totals (the disk tier's among them); and
//! `GET /v1/kv/check`, the page store's invariants checked between two steps. Both
//! are debug views behind the API key like the rest of `/v1`.

use crate::error::ApiError;
use crate::offload::blocking;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::{Holder, PageState};
use serde::Serialize;
use std::sync::Arc;

type St = State<Arc<AppState>>;

/// `GET /v1/kv`'s answer.
#[derive(Serialize)]
struct KvView {
    object: &'static str,
    page_size: usize,
    /// The K/V element type (`f16`, `f32`, `q8_0`) and the bytes of K/V one page holds.
    kv_dtype: &'static str,
    page_bytes: usize,
    totals: Totals,
    pages: Vec<Page>,
}

/// The pool's counts (pages by state, and the scheduler's queues).
#[derive(Serialize)]
struct Totals {
    pages: usize,
    free: usize,
    working: usize,
    committed: usize,
    cached: usize,
    pinned: usize,
    shared: usize,
    running: usize,
    waiting: usize,
    /// The disk tier (`--kv-disk`), when on.
    #[serde(skip_serializing_if = "Option::is_none")]
    disk: Option<DiskTotals>,
}

/// What the disk tier holds, and its limit.
#[derive(Serialize)]
struct DiskTotals {
    pages: usize,
    bytes: u64,
    max_bytes: u64,
}

/// One page: its state, references, fill, whether the prefix index has it, its
/// eviction rank, and who holds it.
#[derive(Serialize)]
struct Page {
    id: usize,
    state: &'static str,
    refs: u32,
    fill: usize,
    indexed: bool,
    lru: Option<usize>,
    /// Its content is on disk too (`--kv-disk`): it survives eviction and restarts.
    on_disk: bool,
    holders: Vec<String>,
}

/// `GET /v1/kv/check`'s answer.
#[derive(Serialize)]
struct Checked {
    object: &'static str,
    ok: bool,
    pages: usize,
}

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
    let answer = Checked {
        object: "kv.check",
        ok: true,
        pages,
    };
    Ok(Json(answer).into_response())
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
    let pages = map
        .pages
        .iter()
        .enumerate()
        .map(|(i, p)| Page {
            id: i,
            state: state_str(p.state),
            refs: p.refs,
            fill: p.fill,
            indexed: p.indexed,
            lru: p.lru_rank,
            on_disk: p.on_disk,
            holders: p
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
                .collect(),
        })
        .collect();
    let totals = Totals {
        pages: stats.pages_total,
        free: stats.pages_free,
        working: stats.pages_working,
        committed: stats.pages_committed,
        cached: stats.pages_cached,
        pinned: stats.pages_pinned,
        shared: stats.pages_shared,
        running: stats.running,
        waiting: stats.waiting,
        disk: stats.disk.as_ref().map(|d| DiskTotals {
            pages: d.pages,
            bytes: d.bytes,
            max_bytes: d.max_bytes,
        }),
    };
    let answer = KvView {
        object: "kv",
        page_size: map.page_size,
        kv_dtype: map.kv_dtype.name(),
        page_bytes: map.page_bytes,
        totals,
        pages,
    };
    Ok(Json(answer).into_response())
}
