//! The router: routes, and the layers around them: CORS (outermost, so a preflight
//! never needs the key), the request guard (`guard.rs`: Host, Origin, Content-Type,
//! declared size), the API key, the body limit, and a panic guard that answers 500 in
//! the envelope instead of dropping the connection (the panic's text is logged, never
//! sent).

use crate::error::ApiError;
use crate::serve_error::ServeError;
use crate::state::AppState;
use crate::{
    cache_match, context_edit, context_generate, contexts, embeddings, generate, guard, inferlets,
    kv, messages, misc, responses, snapshots,
};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// Every route and the layers around them, over `st`; a `--cors-origin` that is no
/// header value is an error.
pub fn router(st: Arc<AppState>) -> Result<Router, ServeError> {
    let cfg = &st.config;
    let mut app = Router::new()
        .route("/", get(misc::index))
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/version", get(misc::version))
        .route("/v1/models", get(misc::models))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/embeddings", post(embeddings::embeddings))
        // llama.cpp's aliases, for clients configured without the /v1.
        .route("/models", get(misc::models))
        .route("/completions", post(generate::completions))
        .route("/chat/completions", post(generate::chat))
        .route("/embeddings", post(embeddings::embeddings))
        .route("/v1/contexts", post(contexts::create).get(contexts::list))
        .route(
            "/v1/contexts/{id}",
            get(contexts::get).delete(contexts::delete),
        )
        .route("/v1/contexts/{id}/append", post(context_edit::append))
        .route("/v1/contexts/{id}/fork", post(context_edit::fork))
        .route("/v1/contexts/{id}/truncate", post(context_edit::truncate))
        .route(
            "/v1/contexts/{id}/generate",
            post(context_generate::generate),
        )
        .route("/v1/snapshots", post(snapshots::save).get(snapshots::list))
        .route("/v1/snapshots/{name}", delete(snapshots::delete))
        .route("/v1/snapshots/{name}/load", post(snapshots::load))
        .route(
            "/v1/inferlets",
            post(inferlets::upload)
                .layer(DefaultBodyLimit::max(cfg.inferlet_limits.program_bytes))
                .get(inferlets::list),
        )
        .route("/v1/inferlets/{name}", delete(inferlets::delete))
        .route("/v1/inferlets/{name}/run", post(inferlets::run))
        .route("/v1/kv", get(kv::kv))
        .route("/v1/cache/match", post(cache_match::cache_match))
        .route("/v1/kv/check", get(kv::check))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .fallback(misc::not_found)
        .method_not_allowed_fallback(misc::wrong_method)
        .layer(DefaultBodyLimit::max(cfg.max_body))
        .layer(middleware::from_fn_with_state(st.clone(), auth))
        .layer(middleware::from_fn_with_state(st.clone(), guard::guard))
        .layer(CatchPanicLayer::custom(
            |panic: Box<dyn std::any::Any + Send>| {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                tracing::error!("a request handler panicked: {what}");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
            },
        ));
    if !cfg.cors_origins.is_empty() {
        let allow = if cfg.cors_origins.iter().any(|o| o.trim() == "*") {
            AllowOrigin::any()
        } else {
            let origins = cfg
                .cors_origins
                .iter()
                .map(|o| {
                    HeaderValue::from_str(o.trim()).map_err(|_| ServeError::CorsOrigin(o.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            AllowOrigin::list(origins)
        };
        app = app.layer(
            CorsLayer::new()
                .allow_origin(allow)
                .allow_methods([Method::GET, Method::POST, Method::DELETE])
                .allow_headers(tower_http::cors::AllowHeaders::mirror_request()),
        );
    }
    Ok(app.with_state(st))
}

/// Routes that need the key when one is set (health and metrics stay open, as in
/// vLLM, for probes and scrapers).
fn guarded(path: &str) -> bool {
    path.starts_with("/v1/")
        || matches!(
            path,
            "/tokenize"
                | "/detokenize"
                | "/models"
                | "/completions"
                | "/chat/completions"
                | "/embeddings"
        )
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.config.api_key {
        if guarded(req.uri().path()) {
            // OpenAI's clients send `Authorization: Bearer`, Anthropic's `x-api-key`.
            let h = req.headers();
            let bearer = (h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()))
                .and_then(|v| v.strip_prefix("Bearer "));
            let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
            let given = bearer.or(x_key).unwrap_or("");
            if !same(given.as_bytes(), key.as_bytes()) {
                let mut e = ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "a valid API key is needed: Authorization: Bearer <key> (or x-api-key)",
                );
                e.code = Some("invalid_api_key");
                return e.into_response();
            }
        }
    }
    next.run(req).await
}

/// Compares in time that depends only on the lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
