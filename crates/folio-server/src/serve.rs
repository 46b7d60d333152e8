//! [`serve`]: the server's lifetime. It binds first and answers at once (health 503)
//! while the engine loads on a blocking thread; a reaper drops contexts idle past
//! `--context-ttl`; at shutdown it drains requests in flight, then stops the engine.
//! Connections are HTTP/1.1 with a timeout on the request head.

use crate::app;
use crate::config::ServeConfig;
use crate::serve_error::{LoadError, ServeError};
use crate::state::{AppState, Loaded};
use folio::Engine;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a client may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves on `listener` until `shutdown` resolves. The routes answer at once (health
/// says 503) while `load` builds the engine on a blocking thread; `on_ready` runs when
/// it is up. At shutdown: health says 503 and new requests are refused, requests in
/// flight run up to `shutdown_timeout`, then the rest are cancelled; returns when
/// every connection is closed. A failed load ends it with [`ServeError::Load`].
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
    let (failed_tx, failed_rx) = oneshot::channel::<LoadError>();
    let loader = spawn_loader(st.clone(), load, on_ready, failed_tx);
    let reaper = spawn_reaper(st.clone());
    let failure = Arc::new(Mutex::new(None::<LoadError>));
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

/// Builds the engine on a blocking thread: sets it in the state and calls `on_ready`,
/// or sends why it failed.
fn spawn_loader<L, R>(
    st: Arc<AppState>,
    load: L,
    on_ready: R,
    failed: oneshot::Sender<LoadError>,
) -> JoinHandle<()>
where
    L: FnOnce() -> Result<Engine, String> + Send + 'static,
    R: FnOnce() + Send + 'static,
{
    tokio::spawn(async move {
        let config = st.config.clone();
        let load = move || load().and_then(|e| with_extras(e, &config));
        // On a thread of its own, not the runtime's blocking pool: a runtime waits for
        // its blocking tasks when it is dropped, so a stop during a long load (or a
        // load stuck on a file) printed "stopped" and the process stayed until the
        // load ended. A thread of its own ends with the process.
        let (tx, rx) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("folio-load".into())
            .spawn(move || {
                let _ = tx.send(load());
            });
        if let Err(e) = spawned {
            let _ = failed.send(LoadError::Loader(format!("cannot start the loader: {e}")));
            return;
        }
        match rx.await {
            Ok(Ok(loaded)) => {
                let _ = st.loaded.set(loaded);
                on_ready();
            }
            Ok(Err(e)) => {
                let _ = failed.send(LoadError::Loader(e));
            }
            Err(_) => {
                let _ = failed.send(LoadError::Stopped);
            }
        }
    })
}

/// Drops contexts idle past `--context-ttl`, checking a few times per TTL.
fn spawn_reaper(st: Arc<AppState>) -> JoinHandle<()> {
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
}

/// The engine and what is built once beside it: the chat template (a failure only
/// disables the chat routes, with a warning; the grammar table is the engine's,
/// built when a request first asks for a grammar: `folio::grammar::lazy`), and
/// the inferlet host with the programs of `--inferlet-dir` (a directory that cannot
/// be read fails the load; a host that cannot be built only disables inferlets).
fn with_extras(engine: Engine, config: &ServeConfig) -> Result<Loaded, String> {
    let model = engine.model();
    let template = match model.tokenizer.chat_template() {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("the chat template does not compile ({e}): chat routes will answer 400");
            None
        }
    };
    let inferlets = match crate::inferlet_host::Inferlets::new(engine.clone(), config) {
        Ok(i) => Some(std::sync::Arc::new(i)),
        Err(e @ folio_inferlet::InferletError::Io(_)) => return Err(e.to_string()),
        Err(e) => {
            tracing::warn!("{e}: the inferlet routes will answer 503");
            None
        }
    };
    Ok(Loaded {
        system_fingerprint: crate::answer::system_fingerprint(&engine.fingerprint()),
        engine,
        template,
        inferlets,
    })
}

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
