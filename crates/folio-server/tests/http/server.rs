//! Starts `folio_server::serve` on 127.0.0.1:0 in its own thread and runtime.

use folio::{Engine, EngineConfig, Model};
use folio_server::{ServeConfig, ServeError};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

pub fn model_path() -> PathBuf {
    std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

pub fn engine(cfg: EngineConfig) -> Engine {
    let model = Model::load(&model_path(), 2).expect("the default model (scripts/setup.sh)");
    Engine::new(model, cfg).expect("engine")
}

pub fn small_engine() -> EngineConfig {
    EngineConfig {
        kv_pages: 512,
        max_seq_tokens: Some(1024),
        ..EngineConfig::default()
    }
}

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

/// A server on the default model with `engine` settings, ready when this returns.
pub fn start(cfg: ServeConfig, engine_cfg: EngineConfig) -> Server {
    let (s, ready) = start_with(cfg, move || Ok(engine(engine_cfg)));
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("the server became ready");
    s
}

/// A server whose engine `load` builds; the receiver answers when it is ready.
pub fn start_with(
    cfg: ServeConfig,
    load: impl FnOnce() -> Result<Engine, String> + Send + 'static,
) -> (Server, mpsc::Receiver<()>) {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let shutdown = async move {
                let _ = stop_rx.await;
            };
            let ready = move || {
                let _ = ready_tx.send(());
            };
            folio_server::serve(listener, cfg, load, ready, shutdown).await
        })
    });
    (
        Server {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        },
        ready_rx,
    )
}

impl Server {
    /// Signals shutdown (as SIGTERM does) without waiting.
    pub fn signal_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Waits for `serve` to return by itself.
    pub fn wait(mut self) -> Result<(), ServeError> {
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("the server thread")
    }

    /// Signals shutdown and waits for `serve` to return.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.signal_stop();
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("the server thread")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
