//! The small routes: the web page at `/`, `/health`, `/v1/models`, `/metrics`, `/tokenize`,
//! `/detokenize`, and the envelope answers for unknown routes and wrong methods.

use crate::answer::List;
use crate::api::{DetokenizeRequest, TokenizeRequest};
use crate::body::JsonBody;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::params::{render_chat, render_continued};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

type St = State<Arc<AppState>>;

/// `/health`'s answer.
#[derive(Serialize)]
struct Health {
    status: &'static str,
}

/// The one model `/v1/models` lists.
#[derive(Serialize)]
struct ModelView {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    max_model_len: usize,
}

/// `/tokenize`'s answer; `pieces` only when asked for.
#[derive(Serialize)]
struct Tokens {
    tokens: Vec<u32>,
    count: usize,
    max_model_len: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pieces: Option<Vec<String>>,
}

/// `/detokenize`'s answer: the text under llama.cpp's name and vLLM's, so either
/// client works.
#[derive(Serialize)]
struct Detokenized {
    content: String,
    prompt: String,
}

/// The web page: chat, the live page map and the context tree. One file, built
/// into the binary; it talks to the API like any client.
pub async fn index() -> Response {
    (
        [(header::CACHE_CONTROL, "no-cache")],
        axum::response::Html(include_str!("../assets/index.html")),
    )
        .into_response()
}

/// 200 when requests are served; 503 while the model loads or the server drains.
pub async fn health(State(st): St) -> Response {
    let status = if st.draining.load(Ordering::Relaxed) {
        "shutting down"
    } else if st.loaded.get().is_none() {
        "loading"
    } else {
        return Json(Health { status: "ok" }).into_response();
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(Health { status })).into_response()
}

#[derive(Serialize)]
struct Version {
    version: &'static str,
}

/// vLLM's `GET /version`. Routers tell engines apart by their routes: the SGLang model
/// gateway takes a worker that answers it for a vLLM one and then reads its load from
/// the `vllm:` gauges of `/metrics`; without it folio is a "generic" worker whose load
/// the gateway never reads.
pub async fn version() -> Response {
    Json(Version {
        version: env!("CARGO_PKG_VERSION"),
    })
    .into_response()
}

pub async fn models(State(st): St) -> Result<Response, ApiError> {
    let l = st.ready()?;
    let model = ModelView {
        id: st.config.model_name.clone(),
        object: "model",
        created: st.started,
        owned_by: "folio",
        max_model_len: l.engine.window(),
    };
    Ok(Json(List::new(vec![model])).into_response())
}

/// Prometheus text; the engine's figures are left out while it loads.
pub async fn metrics(State(st): St) -> Response {
    let stats = match st.loaded.get() {
        Some(l) => {
            let engine = l.engine.clone();
            tokio::task::spawn_blocking(move || engine.stats().ok())
                .await
                .ok()
                .flatten()
        }
        None => None,
    };
    let body = st.metrics.render(&st.config.model_name, stats.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

pub async fn tokenize(
    State(st): St,
    JsonBody(r): JsonBody<TokenizeRequest>,
) -> Result<Response, ApiError> {
    st.ready()?;
    let with_pieces = r.with_pieces.unwrap_or(false);
    let st2 = st.clone();
    let work = tokio::task::spawn_blocking(move || {
        let l = st2.ready()?;
        tokenize_request(&r, l.engine.model(), l.template.as_ref())
    });
    // Encoding is bounded by the body limit and the tokenizer's input cap; the time
    // limit still answers on time (the work, which changes nothing, is then dropped).
    let ids = Deadline::start(&st)
        .within(&st, work)
        .await?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let l = st.ready()?;
    // Control tokens as their text (`<|im_start|>`), not as the nothing they print
    // in output.
    let tok = &l.engine.model().tokenizer;
    let pieces = with_pieces.then(|| {
        ids.iter()
            .map(|&i| tok.decode_special(std::slice::from_ref(&i)))
            .collect()
    });
    let answer = Tokens {
        count: ids.len(),
        tokens: ids,
        max_model_len: l.engine.window(),
        pieces,
    };
    Ok(Json(answer).into_response())
}

/// What `/tokenize` does with its body: the text (or the messages rendered with the
/// chat template), encoded.
pub(crate) fn tokenize_request(
    r: &TokenizeRequest,
    model: &folio::Model,
    template: Option<&folio::tokenizer::ChatTemplate>,
) -> Result<Vec<u32>, ApiError> {
    let add_special = r.add_special.unwrap_or(true);
    let rendered;
    let text = match (&r.content, &r.prompt, &r.messages) {
        (Some(t), None, None) | (None, Some(t), None) => t,
        (None, None, Some(m)) if r.continue_final_message == Some(true) => {
            rendered = render_continued(m, template, None)?;
            &rendered
        }
        (None, None, Some(m)) => {
            let generation_prompt = r.add_generation_prompt.unwrap_or(true);
            rendered = render_chat(m, template, generation_prompt, None)?;
            &rendered
        }
        _ => {
            return Err(ApiError::invalid(
                "content",
                "give one of content (or prompt) and messages",
            ))
        }
    };
    model
        .tokenizer
        .try_encode(text, add_special)
        .map_err(|e| ApiError::from(folio::EngineError::from(e)))
}

pub async fn detokenize(
    State(st): St,
    JsonBody(r): JsonBody<DetokenizeRequest>,
) -> Result<Response, ApiError> {
    st.ready()?;
    // Decoding is bounded by the body limit, but off the async threads all the same
    // (600k ids take a third of a second: /health must not wait behind them).
    let st2 = st.clone();
    let text =
        tokio::task::spawn_blocking(move || detokenize_request(&r, st2.ready()?.engine.model()))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    // llama.cpp answers `content`, vLLM `prompt`: both, so either client works.
    let answer = Detokenized {
        content: text.clone(),
        prompt: text,
    };
    Ok(Json(answer).into_response())
}

/// What `/detokenize` does with its body: every id must be in the vocabulary; the
/// text of them.
pub(crate) fn detokenize_request(
    r: &DetokenizeRequest,
    model: &folio::Model,
) -> Result<String, ApiError> {
    let vocab = model.config.vocab;
    if let Some(bad) = r.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary (0..{vocab})"),
        ));
    }
    Ok(model.tokenizer.decode(&r.tokens))
}

pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {method} {}", uri.path()),
    );
    e.code = Some("not_found");
    e
}

pub async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}
