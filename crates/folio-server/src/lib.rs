//! `folio serve`: an OpenAI-compatible HTTP server over folio's [`Engine`].
//!
//! It sits on the engine's public facade only: requests go in through
//! [`Engine::submit_with`], whose events land on an async channel, and leave as JSON
//! or server-sent events; a dropped client cancels through [`Engine::cancel`]. The
//! server owns no cache logic: cached-token counts, salts and page figures all come
//! from the engine.
//!
//! Modules: [`app`] (router and layers), `generate` (the two generation routes),
//! `contexts` (the context and snapshot routes, `/v1/kv`),
//! `params` (wire request → engine request), `api` (wire shapes), `answer` (answer
//! shapes), `run` (one request's events and cancellation), `sse` (streams),
//! `misc` (health, models, metrics, tokenize), `deadline` (`--request-timeout`),
//! `guard` (Host, Origin, Content-Type and size checks before any route),
//! `metrics`, `error`, `body`, `state`;
//! `fuzzing` (the body checks alone, for the fuzz targets).

mod answer;
mod api;
pub mod app;
mod body;
mod contexts;
mod deadline;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod generate;
mod guard;
mod metrics;
mod misc;
mod params;
mod run;
mod sse;
mod state;
mod tool_stream;
mod tools;

pub use error::ApiError;

use folio::Engine;
use state::{AppState, Loaded};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::net::TcpListener;

/// Server settings (the engine's are the engine's).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The name `/v1/models` lists and answers carry.
    pub model_name: String,
    /// When set, `/v1/*`, `/tokenize` and `/detokenize` need `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// Largest request body in bytes (413 above).
    pub max_body: usize,
    /// Most requests waiting for their first token before new ones get 503.
    pub max_queue: usize,
    /// At shutdown, how long in-flight requests may run before they are cancelled.
    pub shutdown_timeout: Duration,
    /// Origins allowed by CORS (none by default; `*`: every origin). Any other
    /// `Origin` but the server's own is refused (403).
    pub cors_origins: Vec<String>,
    /// Host names requests may use besides IP literals and `localhost` (`*`: any);
    /// another Host is refused (403), as a DNS-rebinding page would send.
    pub allowed_hosts: Vec<String>,
    /// Contexts idle longer than this are dropped (their committed pages stay cached).
    pub context_ttl: Duration,
    /// Most live contexts (429 above).
    pub max_contexts: usize,
    /// Most tokens one choice may generate (a larger `max_tokens` is 400).
    pub max_tokens: usize,
    /// How long one request may run, queue included, before it is stopped (503, or an
    /// error event ending its stream); a snapshot save's flush is cancelled and
    /// nothing is written (see `deadline.rs`); `None`: no limit.
    pub request_timeout: Option<Duration>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            model_name: "folio".into(),
            api_key: None,
            max_body: 4 << 20,
            max_queue: 256,
            shutdown_timeout: Duration::from_secs(30),
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            context_ttl: Duration::from_secs(600),
            max_contexts: 64,
            max_tokens: 4096,
            request_timeout: Some(Duration::from_secs(600)),
        }
    }
}

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("loading the model: {0}")]
    Load(String),
    #[error("--cors-origin {0:?} is not a valid origin")]
    CorsOrigin(String),
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// The engine and what is built once beside it: the chat template and the grammar
/// token table (a failure of either only disables what needs it, with a warning).
fn with_extras(engine: Engine) -> Loaded {
    let model = engine.model();
    let template = match model.tokenizer.chat_template() {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("the chat template does not compile ({e}): chat routes will answer 400");
            None
        }
    };
    let grammars = match folio::grammar::Grammars::new(&model.tokenizer, model.config.vocab) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!("{e}: structured output will answer 400");
            None
        }
    };
    Loaded {
        engine,
        template,
        grammars,
    }
}

/// How long a client may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `signal` resolves; returns the handle that waits for
/// the open ones. Each connection is HTTP/1.1 with a timeout on the request head.
async fn accept(
    listener: TcpListener,
    app: axum::Router,
    signal: impl Future<Output = ()>,
) -> Result<hyper_util::server::graceful::GracefulShutdown, ServeError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    tokio::pin!(signal);
    loop {
        let stream = tokio::select! {
            _ = &mut signal => return Ok(graceful),
            conn = listener.accept() => match conn {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors and the like: wait a little, keep serving.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// Serves on `listener` until `shutdown` resolves. The routes answer at once (health
/// says 503) while `load` builds the engine on a blocking thread; `on_ready` runs when
/// it is up. At shutdown: health says 503 and new requests are refused, requests in
/// flight run up to `shutdown_timeout`, then the rest are cancelled; returns when
/// every connection is closed.
pub async fn serve<L, R, S>(
    listener: TcpListener,
    config: ServeConfig,
    load: L,
    on_ready: R,
    shutdown: S,
) -> Result<(), ServeError>
where
    L: FnOnce() -> Result<Engine, String> + Send + 'static,
    R: FnOnce() + Send + 'static,
    S: Future<Output = ()> + Send + 'static,
{
    let grace = config.shutdown_timeout;
    let st = Arc::new(AppState::new(config));
    let app = app::router(st.clone())?;
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let loader = {
        let st = st.clone();
        tokio::spawn(async move {
            let load = move || load().map(with_extras);
            match tokio::task::spawn_blocking(load).await {
                Ok(Ok(loaded)) => {
                    let _ = st.loaded.set(loaded);
                    on_ready();
                }
                Ok(Err(e)) => {
                    let _ = failed_tx.send(e);
                }
                Err(e) => {
                    let _ = failed_tx.send(format!("the loader stopped: {e}"));
                }
            }
        })
    };
    let reaper = {
        let st = st.clone();
        let ttl = st.config.context_ttl;
        tokio::spawn(async move {
            let every = (ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
            loop {
                tokio::time::sleep(every).await;
                let n = st.contexts.reap(ttl);
                if n > 0 {
                    tracing::info!("dropped {n} contexts idle for more than {ttl:?}");
                }
            }
        })
    };
    let failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let signal = {
        let st = st.clone();
        let failure = failure.clone();
        async move {
            tokio::select! {
                _ = shutdown => {}
                Ok(e) = failed_rx => {
                    *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                }
            }
            st.draining.store(true, Ordering::Relaxed);
            tracing::info!("shutting down: draining requests in flight (up to {grace:?})");
        }
    };
    let graceful = accept(listener, app, signal).await?;
    // Draining: requests in flight run until the grace ends; then the engine stops
    // (what still runs ends with an error event), and a moment later connections
    // still open (a client that never finished sending its request) are left to be
    // dropped with the runtime.
    let stopper = {
        let st = st.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Some(l) = st.loaded.get() {
                tracing::warn!("shutdown timeout: cancelling the requests still running");
                l.engine.shutdown();
            }
        })
    };
    if tokio::time::timeout(grace + Duration::from_secs(2), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown timeout are dropped");
    }
    stopper.abort();
    loader.abort();
    reaper.abort();
    if let Some(l) = st.loaded.get() {
        l.engine.shutdown();
    }
    let failed = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
    match failed {
        Some(e) => Err(ServeError::Load(e)),
        None => Ok(()),
    }
}
