//! The context API over HTTP: contexts a client builds up, forks in O(1), rolls
//! back, generates into, and pins as snapshots; `/v1/kv`, the pool page by page, and
//! `/v1/kv/check`, the page store's invariants checked between two steps.
//! Each server context is a `folio::Context` under an id (`ctx-N`), with its salt,
//! its parent (for the context tree) and its last use: contexts idle longer than
//! `--context-ttl` are dropped (their committed pages stay cached), and at most
//! `--max-contexts` live at once (429 above). Engine calls wait for the engine
//! thread, so they run off the async threads.

use crate::answer::Head;
use crate::api::{ChatMessage, GenRequest};
use crate::body::{JsonBody, RawBody};
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::generate::{answer_chat, answer_completion, first_event, prepare};
use crate::params::{check_salt, message_text, Route};
use crate::run::Run;
use crate::state::{unix_now, AppState};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::{Context, Engine, Holder, PageState, Role};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type St = State<Arc<AppState>>;

/// One server context.
pub struct Entry {
    pub ctx: Context,
    pub salt: Option<String>,
    /// The context it was forked from, or the snapshot it was loaded from.
    pub parent: Option<String>,
    pub created: u64,
    /// Messages were appended: generation replies as the assistant.
    pub chat: AtomicBool,
    last_used: Mutex<Instant>,
}

impl Entry {
    fn new(ctx: Context, salt: Option<String>, parent: Option<String>, chat: bool) -> Self {
        Self {
            ctx,
            salt,
            parent,
            created: unix_now(),
            chat: AtomicBool::new(chat),
            last_used: Mutex::new(Instant::now()),
        }
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
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, max: usize, e: Entry) -> Result<String, ApiError> {
        let mut m = self.map();
        if m.len() >= max {
            let mut err = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("{max} contexts are live (--max-contexts): delete one first"),
            );
            err.retry_after = Some(5);
            return Err(err);
        }
        let id = format!("ctx-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        m.insert(id.clone(), Arc::new(e));
        Ok(id)
    }

    /// The context, as used now (its idle time starts again).
    fn get(&self, id: &str) -> Result<Arc<Entry>, ApiError> {
        let e = self.peek(id)?;
        e.touch();
        Ok(e)
    }

    /// The context, for reading its figures only: a look does not keep a context
    /// alive (else a cheap GET would renew an idle one's pages forever).
    fn peek(&self, id: &str) -> Result<Arc<Entry>, ApiError> {
        self.map().get(id).cloned().ok_or_else(|| no_context(id))
    }

    fn remove(&self, id: &str) -> Result<(), ApiError> {
        self.map()
            .remove(id)
            .map(drop)
            .ok_or_else(|| no_context(id))
    }

    fn list(&self) -> Vec<(String, Arc<Entry>)> {
        let mut v: Vec<_> = self
            .map()
            .iter()
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        v.sort_by_key(|(k, _)| k[4..].parse::<u64>().unwrap_or(0));
        v
    }

    /// Engine context id → server id.
    fn ids(&self) -> HashMap<u64, String> {
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
pub struct InUse(Arc<Entry>);

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

/// Runs an engine call off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

fn engine(st: &AppState) -> Result<Engine, ApiError> {
    Ok(st.ready()?.engine.clone())
}

/// A context's figures (it must be idle: 409 while it generates).
fn info(id: &str, e: &Entry) -> Result<Value, ApiError> {
    info_in(id, e, &e.ctx.engine().page_map()?)
}

/// [`info`] with the pool's page map already read (one map serves a whole list).
fn info_in(id: &str, e: &Entry, map: &folio::PageMap) -> Result<Value, ApiError> {
    let i = e.ctx.info()?;
    let me = Holder::Context(e.ctx.id());
    let shared = map
        .pages
        .iter()
        .filter(|p| p.holders.contains(&me) && p.holders.len() > 1)
        .count();
    Ok(json!({
        "id": id,
        "object": "context",
        "seq_len": i.seq_len,
        "page_size": i.page_size,
        "committed_pages": i.committed_pages,
        "working_pages": i.working_pages,
        "pending_tokens": i.pending_tokens,
        "pending_pages": i.pending_tokens.div_ceil(i.page_size),
        "reserved_pages": i.spare_pages,
        "shared_pages": shared,
        "cache_salt": e.salt,
        "parent": e.parent,
        "created": e.created,
        "chat": e.chat.load(Ordering::Relaxed),
    }))
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
    let engine = engine(&st)?;
    let st2 = st.clone();
    let v = blocking(move || {
        let salt = c.cache_salt.clone().map(String::into_bytes);
        let ctx = engine.context(salt)?;
        if let Some(sys) = &c.system {
            ctx.system(sys)?;
        }
        let e = Entry::new(ctx, c.cache_salt, None, c.system.is_some());
        let id = st2.contexts.insert(st2.config.max_contexts, e)?;
        let e = st2.contexts.get(&id)?;
        info(&id, &e)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

pub async fn list(State(st): St) -> Result<Response, ApiError> {
    let engine = engine(&st)?;
    let st2 = st.clone();
    let data = blocking(move || {
        let map = engine.page_map()?;
        Ok(st2
            .contexts
            .list()
            .into_iter()
            .map(|(id, e)| {
                info_in(&id, &e, &map).unwrap_or_else(
                    |_| json!({"id": id, "object": "context", "busy": true, "parent": e.parent}),
                )
            })
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

pub async fn get(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    engine(&st)?;
    let e = st.contexts.peek(&id)?;
    let v = blocking(move || info(&id, &e)).await?;
    Ok(Json(v).into_response())
}

pub async fn delete(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    st.contexts.remove(&id)?;
    Ok(Json(json!({"id": id, "object": "context", "deleted": true})).into_response())
}

#[derive(Deserialize)]
pub struct Append {
    pub text: Option<String>,
    pub tokens: Option<Vec<u32>>,
    pub messages: Option<Vec<ChatMessage>>,
}

/// What an [`Append`] adds, checked whole before any of it is appended.
pub enum Appended {
    Text(String),
    Tokens(Vec<u32>),
    Messages(Vec<(Role, String)>),
}

impl Append {
    /// Exactly one of text, tokens and messages, each message's role and text checked.
    pub fn checked(self) -> Result<Appended, ApiError> {
        match (self.text, self.tokens, self.messages) {
            (Some(t), None, None) => Ok(Appended::Text(t)),
            (None, Some(t), None) => Ok(Appended::Tokens(t)),
            (None, None, Some(msgs)) => msgs
                .iter()
                .enumerate()
                .map(|(i, m)| Ok((role(&m.role, i)?, message_text(&m.content, i)?)))
                .collect::<Result<_, ApiError>>()
                .map(Appended::Messages),
            _ => Err(ApiError::invalid(
                "text",
                "give exactly one of text, tokens and messages",
            )),
        }
    }
}

fn role(r: &str, i: usize) -> Result<Role, ApiError> {
    match r {
        "system" | "developer" => Ok(Role::System),
        "user" => Ok(Role::User),
        "assistant" => Ok(Role::Assistant),
        other => Err(ApiError::invalid(
            format!("messages[{i}].role"),
            format!("role {other:?}: a context takes system, user and assistant messages"),
        )),
    }
}

pub async fn append(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(a): JsonBody<Append>,
) -> Result<Response, ApiError> {
    engine(&st)?;
    let e = st.contexts.get(&id)?;
    let a = a.checked()?;
    let v = blocking(move || {
        match a {
            Appended::Text(t) => e.ctx.append_text(&t)?,
            Appended::Tokens(t) => e.ctx.append_tokens(&t)?,
            Appended::Messages(parsed) => {
                for (r, t) in parsed {
                    e.ctx.message(r, &t)?;
                }
                e.chat.store(true, Ordering::Relaxed);
            }
        }
        info(&id, &e)
    })
    .await?;
    Ok(Json(v).into_response())
}

pub async fn fork(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    engine(&st)?;
    let e = st.contexts.get(&id)?;
    let st2 = st.clone();
    let v = blocking(move || {
        let child = e.ctx.fork()?;
        let entry = Entry::new(
            child,
            e.salt.clone(),
            Some(id),
            e.chat.load(Ordering::Relaxed),
        );
        let new = st2.contexts.insert(st2.config.max_contexts, entry)?;
        let e = st2.contexts.get(&new)?;
        info(&new, &e)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

#[derive(Deserialize)]
pub struct Truncate {
    pub tokens: usize,
}

pub async fn truncate(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(t): JsonBody<Truncate>,
) -> Result<Response, ApiError> {
    engine(&st)?;
    let e = st.contexts.get(&id)?;
    let v = blocking(move || {
        e.ctx.truncate(t.tokens)?;
        info(&id, &e)
    })
    .await?;
    Ok(Json(v).into_response())
}

/// Generation body: the chat-completion sampling fields, `stream`, an optional
/// `prompt` appended first, and `chat` (reply as the assistant; default: whether the
/// context holds messages).
#[derive(Deserialize)]
pub struct GenerateExtra {
    pub chat: Option<bool>,
}

pub async fn generate(
    State(st): St,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    let extra: GenerateExtra = crate::body::parse(&body)?;
    let r: GenRequest = crate::body::parse(&body)?;
    let e = st.contexts.get(&id)?;
    let job = prepare(&st, Route::Context, r, deadline).await?;
    let chat = extra.chat.unwrap_or(e.chat.load(Ordering::Relaxed));
    let engine = engine(&st)?;
    let st2 = st.clone();
    let run = blocking(move || {
        let mut run = Run::start_context(&st2, &e.ctx, &job, chat, deadline)?;
        run.hold(InUse(e));
        Ok((run, job))
    })
    .await;
    let (run, job) = run?;
    let (run, first) = first_event(run).await?;
    if chat {
        answer_chat(
            engine,
            Head::new("chatcmpl", &st.config.model_name),
            job,
            run,
            first,
        )
        .await
    } else {
        answer_completion(
            engine,
            Head::new("cmpl", &st.config.model_name),
            job,
            run,
            first,
        )
        .await
    }
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

pub async fn snapshot_save(
    State(st): St,
    JsonBody(s): JsonBody<Save>,
) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    s.check()?;
    engine(&st)?;
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
    Ok((
        StatusCode::CREATED,
        Json(json!({"name": name, "object": "snapshot", "context": s.context, "tokens": tokens})),
    )
        .into_response())
}

pub async fn snapshot_list(State(st): St) -> Result<Response, ApiError> {
    let engine = engine(&st)?;
    let list = blocking(move || Ok(engine.snapshot_list()?)).await?;
    let data: Vec<Value> = list
        .iter()
        .map(|(n, tokens)| json!({"name": n, "object": "snapshot", "tokens": tokens}))
        .collect();
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

pub async fn snapshot_load(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let engine = engine(&st)?;
    let st2 = st.clone();
    let v = blocking(move || {
        let ctx = Context::load(&engine, &name)?;
        let entry = Entry::new(ctx, None, Some(format!("snapshot:{name}")), false);
        let id = st2.contexts.insert(st2.config.max_contexts, entry)?;
        let e = st2.contexts.get(&id)?;
        info(&id, &e)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

pub async fn snapshot_delete(
    State(st): St,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let engine = engine(&st)?;
    let n = name.clone();
    blocking(move || Ok(Context::delete(&engine, &n)?)).await?;
    Ok(Json(json!({"name": name, "object": "snapshot", "deleted": true})).into_response())
}

/// `GET /v1/kv/check`: the page store's invariants (every page's state and
/// references against every table, the free list, the eviction order, the prefix
/// index), checked between two steps. 200 when they hold; a violation is a bug: 500
/// naming the first page at fault. It walks every page: a debug route, behind the
/// API key like the rest of /v1.
pub async fn kv_check(State(st): St) -> Result<Response, ApiError> {
    let engine = engine(&st)?;
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
    let engine = engine(&st)?;
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
