//! The inferlet routes: `POST /v1/inferlets?name=NAME` (upload a component, body
//! `application/wasm`; compiled once here), `GET /v1/inferlets`, `DELETE
//! /v1/inferlets/{name}` and `POST /v1/inferlets/{name}/run` (`{"input": any,
//! "stream": bool}`: every chunk the program emits, as one JSON answer or one SSE
//! event each). The host and the stored programs are `folio_inferlet`'s; a run
//! runs on a blocking thread, and a client that hangs up cancels it (the guard the
//! answer holds sets its cancel flag when dropped). `/v1/chat/completions` with
//! `"model": "inferlet:NAME"` comes here too ([`chat`]): any OpenAI client can run
//! a program.

use crate::answer::List;
use crate::body::{JsonBody, RawBody};
use crate::error::ApiError;
use crate::inferlet_host::Inferlets;
use crate::offload::blocking;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio_inferlet::{Cancel, Chunk, InferletError, RunReport};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

type St = State<Arc<AppState>>;

/// A stored program as the routes show it.
#[derive(Serialize)]
struct View {
    id: String,
    object: &'static str,
    bytes: usize,
    created: u64,
}

#[derive(Deserialize)]
pub struct UploadQuery {
    name: Option<String>,
}

fn inferlets(st: &AppState) -> Result<Arc<Inferlets>, ApiError> {
    let loaded = st.ready()?;
    loaded
        .inferlets
        .clone()
        .ok_or_else(|| ApiError::unavailable("inferlets are not available on this server", 60))
}

pub async fn upload(
    State(st): St,
    Query(q): Query<UploadQuery>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let Some(name) = q.name else {
        return Err(ApiError::invalid(
            "name",
            "name the program: POST /v1/inferlets?name=NAME with the component as the body",
        ));
    };
    folio_inferlet::library::check_name(&name)?;
    if body.is_empty() {
        return Err(ApiError::invalid(
            "body",
            "the body must be the component's bytes",
        ));
    }
    let inf = inferlets(&st)?;
    let n = name.clone();
    let stored = blocking(move || Ok(inf.library.put(&inf.host, &n, &body)?)).await?;
    let v = View {
        id: name,
        object: "inferlet",
        bytes: stored.program.size,
        created: stored.created,
    };
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

pub async fn list(State(st): St) -> Result<Response, ApiError> {
    let inf = inferlets(&st)?;
    let data: Vec<View> = inf
        .library
        .list()
        .into_iter()
        .map(|(id, s)| View {
            id,
            object: "inferlet",
            bytes: s.program.size,
            created: s.created,
        })
        .collect();
    let mut v = serde_json::to_value(List::new(data)).unwrap_or_default();
    v["running"] = inf.host.running().into();
    v["max_running"] = inf.host.limits().concurrent_runs.into();
    Ok(Json(v).into_response())
}

pub async fn delete(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let inf = inferlets(&st)?;
    let n = name.clone();
    blocking(move || Ok(inf.library.remove(&n)?)).await?;
    Ok(
        Json(serde_json::json!({"id": name, "object": "inferlet", "deleted": true}))
            .into_response(),
    )
}

/// `POST /v1/inferlets/{name}/run`'s body.
#[derive(Deserialize)]
pub struct RunBody {
    #[serde(default)]
    input: serde_json::Value,
    #[serde(default)]
    stream: bool,
    /// Seconds the run may take (at most the server's `--inferlet-time-limit`).
    time_limit: Option<f64>,
}

/// Cancels the run when dropped before it ended (the client hung up).
struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A chunk on the wire.
fn wire(c: Chunk) -> serde_json::Value {
    match c {
        Chunk::Text(t) => serde_json::json!({"type": "text", "text": t}),
        Chunk::Json(v) => serde_json::json!({"type": "json", "json": v}),
    }
}

fn usage(r: &RunReport) -> serde_json::Value {
    serde_json::json!({
        "host_calls": r.host_calls,
        "elapsed_ms": r.elapsed.as_secs_f64() * 1e3,
        "instantiate_ms": r.instantiate.as_secs_f64() * 1e3,
        "prompt_tokens": r.usage.prompt_tokens,
        "completion_tokens": r.usage.completion_tokens,
    })
}

/// A run started: its chunks, and its outcome once the chunks end.
pub struct Started {
    pub rx: tokio::sync::mpsc::UnboundedReceiver<Chunk>,
    pub task: tokio::task::JoinHandle<Result<RunReport, InferletError>>,
    guard: CancelOnDrop,
}

impl Started {
    /// The run's outcome (after its last chunk); the guard is spent.
    pub async fn outcome(self) -> Result<RunReport, ApiError> {
        let Started { task, guard, .. } = self;
        let r = task.await.map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("inferlet run: {e}"),
            )
        })?;
        // The run has ended: cancelling it now does nothing.
        drop(guard);
        Ok(r?)
    }
}

/// Starts program `name` with `input` (429 when the most runs are going already),
/// within `time_limit` when given.
pub fn start(
    st: &AppState,
    name: &str,
    input: &serde_json::Value,
    time_limit: Option<Duration>,
) -> Result<Started, ApiError> {
    let inf = inferlets(st)?;
    let stored = inf.library.get(name)?;
    let permit = inf.host.permit()?;
    let input = input.to_string();
    let cancel = Cancel::default();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let c = cancel.clone();
    let task = tokio::task::spawn_blocking(move || {
        inf.host.run(
            permit,
            &stored.program,
            &input,
            time_limit,
            &c,
            move |chunk| tx.send(chunk).is_ok(),
        )
    });
    Ok(Started {
        rx,
        task,
        guard: CancelOnDrop(cancel),
    })
}

pub async fn run(
    State(st): St,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<RunBody>,
) -> Result<Response, ApiError> {
    let limit = match body.time_limit {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Some(Duration::from_secs_f64(s)),
        Some(s) => {
            return Err(ApiError::invalid(
                "time_limit",
                format!("is {s}; it must be a number of seconds above 0"),
            ))
        }
    };
    let mut started = start(&st, &name, &body.input, limit)?;
    if body.stream {
        return Ok(stream(name, started));
    }
    let mut output = Vec::new();
    let mut text = String::new();
    while let Some(c) = started.rx.recv().await {
        if let Chunk::Text(t) = &c {
            text.push_str(t);
        }
        output.push(wire(c));
    }
    let report = started.outcome().await?;
    Ok(Json(serde_json::json!({
        "object": "inferlet.run",
        "inferlet": name,
        "output": output,
        "text": text,
        "usage": usage(&report),
    }))
    .into_response())
}

fn frame(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// One SSE event per chunk, then `{"type": "done", "usage"}` (or the error
/// envelope) and `[DONE]`. The stream owns the run: a client that disconnects drops
/// it, which cancels the run.
fn stream(name: String, started: Started) -> Response {
    let s = futures_util::stream::unfold(Some(started), move |state| {
        let name = name.clone();
        async move {
            let mut started = state?;
            if let Some(c) = started.rx.recv().await {
                return Some((
                    Ok::<_, std::convert::Infallible>(frame(&wire(c))),
                    Some(started),
                ));
            }
            let last = match started.outcome().await {
                Ok(r) => serde_json::json!({"type": "done", "inferlet": name, "usage": usage(&r)}),
                Err(e) => serde_json::to_value(e.body()).unwrap_or_default(),
            };
            let mut out = format!("data: {last}\n\n").into_bytes();
            out.extend_from_slice(b"data: [DONE]\n\n");
            Some((Ok(Bytes::from(out)), None))
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(s),
    )
        .into_response()
}

/// `/v1/chat/completions` with `"model": "inferlet:NAME"`: the program runs with the
/// whole request as its input (its `messages`, and any other field); the text it
/// emits is the assistant's message (JSON chunks, when it emits no text, one per
/// line), whole or as `chat.completion.chunk` events.
pub async fn chat(st: &AppState, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let input: serde_json::Value = crate::body::parse(body)?;
    if !input
        .get("messages")
        .is_some_and(serde_json::Value::is_array)
    {
        return Err(ApiError::invalid(
            "messages",
            "a chat needs its messages, a list",
        ));
    }
    let stream = input.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
    let model = format!("inferlet:{name}");
    // An id no other answer of this server has (as every answer's).
    let head = crate::answer::Head::new("chatcmpl", &model, "");
    let (id, created) = (head.id, head.created);
    let include_usage = input
        .pointer("/stream_options/include_usage")
        .and_then(serde_json::Value::as_bool)
        == Some(true);
    let mut started = start(st, name, &input, None)?;
    if stream {
        return Ok(chat_stream(id, model, created, started, include_usage));
    }
    let (mut text, mut json) = (String::new(), Vec::new());
    while let Some(c) = started.rx.recv().await {
        match c {
            Chunk::Text(t) => text.push_str(&t),
            Chunk::Json(v) => json.push(v.to_string()),
        }
    }
    let report = started.outcome().await?;
    if text.is_empty() {
        text = json.join("\n");
    }
    Ok(Json(serde_json::json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }],
        "usage": chat_usage(&report.usage),
    }))
    .into_response())
}

/// A run's token counts as a chat completion's `usage`: its generations' prompt
/// tokens (with those read from the cache) and generated tokens (`RunReport::usage`).
fn chat_usage(u: &folio::Usage) -> serde_json::Value {
    let u = crate::answer::usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens);
    serde_json::to_value(u).unwrap_or_default()
}

/// The streamed form of [`chat`]: a role chunk, a content chunk per text chunk (a
/// JSON chunk as its text), a finish chunk, `[DONE]`; an error midway is the error
/// envelope.
fn chat_stream(
    id: String,
    model: String,
    created: u64,
    started: Started,
    include_usage: bool,
) -> Response {
    let chunk = move |delta: serde_json::Value, finish: Option<&str>| {
        let mut c = serde_json::json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        // As OpenAI's (and folio's own chat stream): with the usage chunk asked for,
        // every other chunk says `"usage": null`.
        if include_usage {
            c["usage"] = serde_json::Value::Null;
        }
        c
    };
    let first = frame(&chunk(
        serde_json::json!({"role": "assistant", "content": ""}),
        None,
    ));
    let s = futures_util::stream::unfold((Some(started), Some(first)), move |(state, first)| {
        let chunk = chunk.clone();
        async move {
            if let Some(f) = first {
                return Some((Ok::<_, std::convert::Infallible>(f), (state, None)));
            }
            let mut started = state?;
            if let Some(c) = started.rx.recv().await {
                let content = match c {
                    Chunk::Text(t) => t,
                    Chunk::Json(v) => v.to_string(),
                };
                let f = frame(&chunk(serde_json::json!({"content": content}), None));
                return Some((Ok(f), (Some(started), None)));
            }
            let (last, report) = match started.outcome().await {
                Ok(r) => (chunk(serde_json::json!({}), Some("stop")), Some(r)),
                Err(e) => (serde_json::to_value(e.body()).unwrap_or_default(), None),
            };
            let mut out = format!("data: {last}\n\n").into_bytes();
            // OpenAI's usage chunk, asked for by `stream_options.include_usage`: no
            // choices, the run's token counts.
            if let Some(r) = report.filter(|_| include_usage) {
                let mut u = chunk(serde_json::json!({}), None);
                u["choices"] = serde_json::json!([]);
                u["usage"] = chat_usage(&r.usage);
                out.extend_from_slice(format!("data: {u}\n\n").as_bytes());
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
            Some((Ok(Bytes::from(out)), (None, None)))
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(s),
    )
        .into_response()
}
