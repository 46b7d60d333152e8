//! `folio serve`: the OpenAI-compatible server (the `folio-server` crate) on the
//! engine the flags describe. The port opens at once (health answers 503 while the
//! model loads, with a progress bar on a terminal); one line with the URL says it is
//! ready. SIGINT/SIGTERM drain: see `folio_server::serve`.

use crate::opts::{self, ModelArgs};
use anyhow::{Context, Result};
use folio::Engine;
use folio_server::ServeConfig;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default: only this machine can connect).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one; the ready line says which).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize.
    #[arg(long, env = "FOLIO_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Largest request body (413 above).
    #[arg(long, value_parser = opts::parse_size, default_value = "4MiB")]
    pub max_body: u64,
    /// Most requests waiting for their first token; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Seconds requests in flight may run after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// An origin allowed by CORS (repeatable; none by default; `*`: any). Requests
    /// from any other origin but the server's own page are refused (403).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    /// A host name clients may use besides IP addresses and localhost (repeatable;
    /// `.example.com` also allows names under it; `*`: any). Guards against DNS
    /// rebinding: a request for another name is refused (403).
    #[arg(long = "allowed-hosts", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// The model's name in /v1/models and answers [default: the file's name].
    #[arg(long)]
    pub model_name: Option<String>,
    /// Seconds a context may sit idle before it is dropped (its committed pages stay
    /// cached).
    #[arg(long, default_value_t = 600.0)]
    pub context_ttl: f64,
    /// Most live contexts (/v1/contexts answers 429 above).
    #[arg(long, default_value_t = 64)]
    pub max_contexts: usize,
    /// Most token rows in one forward step (decode tokens plus prefill chunks).
    #[arg(long, default_value_t = 512)]
    pub max_batch_tokens: usize,
    /// Most tokens one choice may generate: a larger max_tokens is 400 (a request
    /// without one gets at most this).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_cap: usize,
    /// Seconds one request may run, queue included, before it is stopped (503, or an
    /// error event ending its stream; a snapshot save writes nothing); 0: no limit.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// The most KV pages contexts and snapshots may hold together (a page shared by
    /// forks counts once); the rest of the pool is kept for requests. An operation
    /// that would take them past it gets 429 [default: half the pool].
    #[arg(long)]
    pub context_pages: Option<usize>,
    /// Most bytes all snapshot files together may hold (suffixes K, M, G, KiB, MiB,
    /// GiB); a save past it answers 507 and writes nothing (files found at start count).
    #[arg(long, value_parser = opts::parse_size, default_value = "4GiB")]
    pub snapshot_max_bytes: u64,
    /// Most snapshots kept; a save under a new name past it answers 507.
    #[arg(long, default_value_t = 256)]
    pub max_snapshots: usize,
    /// Where uploaded inferlets (POST /v1/inferlets) persist; they are compiled
    /// again at start. Without it they live in memory only.
    #[arg(long, value_name = "DIR")]
    pub inferlet_dir: Option<std::path::PathBuf>,
    /// Seconds one inferlet run may take, generation included; a program past it is
    /// stopped (its contexts dropped) and the run answers 400.
    #[arg(long, default_value_t = 120.0)]
    pub inferlet_time_limit: f64,
    /// Linear memory one inferlet instance may hold (suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, value_parser = opts::parse_size, default_value = "256MiB")]
    pub inferlet_memory: u64,
    /// Inferlet runs at once; one more answers 429.
    #[arg(long, default_value_t = 4)]
    pub max_inferlet_runs: usize,
    /// Contexts one inferlet run may hold at once.
    #[arg(long, default_value_t = 64)]
    pub inferlet_contexts: usize,
    /// Pool pages one inferlet run's contexts may hold together (each page once);
    /// past it the run is stopped (429) and its pages return. The contexts' share
    /// of the pool (--context-pages) bounds all runs together besides.
    #[arg(long, default_value_t = 4096)]
    pub inferlet_pages: usize,
    /// Allocate each inferlet run's instance afresh instead of from the pool of
    /// warm slots reserved at start.
    #[arg(long)]
    pub no_inferlet_pool: bool,
    /// Largest inferlet upload (suffixes as --inferlet-memory).
    #[arg(long, value_parser = opts::parse_size, default_value = "64MiB")]
    pub inferlet_max_bytes: u64,
    /// Publish the prefix cache's changes (pages stored, evicted) as vLLM's KV events
    /// on a ZMQ PUB socket, for a prefix-aware router: `tcp://*:PORT` binds, any
    /// other host connects to a subscriber that binds (llm-d's). Off by default.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// The KV events' topic (first frame) [default: kv@HOST:PORT@MODEL, the form
    /// llm-d's indexer reads a replica and a model from].
    #[arg(long, value_name = "TOPIC")]
    pub kv_events_topic: Option<String>,
    /// The KV events' block keys: `vllm`, vLLM's sha256_cbor keys (a router
    /// reproduces them from the token ids), or `folio`, the pool's own 128-bit hashes.
    #[arg(long, value_name = "MODE", default_value = "vllm")]
    pub kv_events_hash: folio_server::kv_events::KvHashMode,
    /// The seed of the `vllm` keys' chain, as vLLM takes it from PYTHONHASHSEED:
    /// replicas and router with the same seed agree on every key.
    #[arg(long, value_name = "SEED", env = "PYTHONHASHSEED", default_value = "0")]
    pub kv_events_seed: String,
    /// A ZMQ ROUTER socket (bound) where a subscriber that saw a gap in the sequence
    /// numbers asks for the messages it missed, as from vLLM's replay endpoint: it
    /// sends the first sequence number it wants (8 bytes, big-endian) and gets every
    /// buffered message from there (the last 10,000 are kept), then an end marker.
    /// Off by default; needs --kv-events.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    pub kv_events_replay: Option<String>,
}

/// Engine steps' KV-event batches that may wait for the publisher; past them the
/// engine drops batches and the subscriber is told to start over.
const KV_EVENT_BATCHES: usize = 4096;

/// Full-length sequences the default pool holds (`--kv-memory` or `--kv-pages` set
/// it otherwise).
const DEFAULT_SEQUENCES: usize = 8;

pub fn run(a: Args) -> Result<()> {
    let path = a.model.path()?;
    anyhow::ensure!(a.max_tokens_cap >= 1, "--max-tokens-cap must be at least 1");
    anyhow::ensure!(
        a.kv_events.is_none() || a.model.kv == opts::KvKind::Paged,
        "--kv-events needs the paged pool (--kv paged): the contiguous cache has no prefix index"
    );
    for (flag, v) in [
        ("--shutdown-timeout", a.shutdown_timeout),
        ("--context-ttl", a.context_ttl),
        ("--request-timeout", a.request_timeout),
        ("--inferlet-time-limit", a.inferlet_time_limit),
    ] {
        anyhow::ensure!(
            v.is_finite() && (0.0..=1e9).contains(&v),
            "{flag} must be a number of seconds between 0 and 1e9"
        );
    }
    let name = a.model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or("folio".into(), |s| s.to_string_lossy().into_owned())
    });
    let config = ServeConfig {
        model_name: name.clone(),
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        max_body: usize::try_from(a.max_body).unwrap_or(usize::MAX),
        max_queue: a.max_queue,
        shutdown_timeout: Duration::from_secs_f64(a.shutdown_timeout),
        cors_origins: a.cors_origin.clone(),
        allowed_hosts: a.allowed_hosts.clone(),
        context_ttl: Duration::from_secs_f64(a.context_ttl),
        max_contexts: a.max_contexts,
        max_tokens: a.max_tokens_cap,
        request_timeout: (a.request_timeout > 0.0)
            .then(|| Duration::from_secs_f64(a.request_timeout)),
        inferlet_dir: a.inferlet_dir.clone(),
        inferlet_limits: folio_inferlet::Limits {
            run_time: Duration::from_secs_f64(a.inferlet_time_limit),
            memory_bytes: usize::try_from(a.inferlet_memory).unwrap_or(usize::MAX),
            contexts: a.inferlet_contexts,
            pages: a.inferlet_pages,
            pooled: !a.no_inferlet_pool,
            concurrent_runs: a.max_inferlet_runs,
            program_bytes: usize::try_from(a.inferlet_max_bytes).unwrap_or(usize::MAX),
            ..folio_inferlet::Limits::default()
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        survive_file_size_limit();
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        let (model_args, batch, ctx_pages) = (a.model.clone(), a.max_batch_tokens, a.context_pages);
        let quota = (a.snapshot_max_bytes, a.max_snapshots);
        let tap = match &a.kv_events {
            None => None,
            Some(endpoint) => {
                let (tap, rx) = folio::kv_event_channel(KV_EVENT_BATCHES);
                let cfg = folio_server::kv_events::KvEventsConfig {
                    endpoint: endpoint.clone(),
                    topic: a
                        .kv_events_topic
                        .clone()
                        .unwrap_or_else(|| format!("kv@{addr}@{name}")),
                    hash: a.kv_events_hash,
                    seed: a.kv_events_seed.clone(),
                    block_size: a.model.page_size,
                    replay: a.kv_events_replay.clone(),
                };
                folio_server::kv_events::spawn(cfg, rx)?;
                Some(tap)
            }
        };
        let load = move || {
            load(&path, &model_args, batch, ctx_pages, quota, tap).map_err(|e| format!("{e:#}"))
        };
        let ready = move || {
            println!("folio: serving {name} at http://{addr} (OpenAI API: http://{addr}/v1)")
        };
        folio_server::serve(listener, config, load, ready, shutdown_signal()).await?;
        eprintln!("folio: stopped");
        Ok(())
    })
}

/// Reads the weights once with a progress bar (the mmap then finds them in the page
/// cache), then builds the engine.
/// `quota`: the snapshot files' most bytes and most snapshots; `kv_events`: where the
/// prefix index's changes go (`--kv-events`).
fn load(
    path: &Path,
    args: &ModelArgs,
    max_batch_tokens: usize,
    context_pages: Option<usize>,
    quota: (u64, usize),
    kv_events: Option<folio::KvEventTap>,
) -> Result<Engine> {
    warm(path).with_context(|| format!("reading {}", path.display()))?;
    let model = args.load_from(path)?;
    let mut config = args.engine_config(&model, DEFAULT_SEQUENCES)?;
    config.max_batch_tokens = max_batch_tokens;
    // A server's contexts belong to its clients: they share half the pool by default.
    config.context_pages = Some(context_pages.unwrap_or(config.kv_pages / 2));
    (config.snapshot_max_bytes, config.snapshot_max_count) = quota;
    config.kv_events = kv_events;
    Engine::new(model, config).map_err(|e| match opts::flag_error(&e) {
        Some(msg) => anyhow::anyhow!(msg),
        None => e.into(),
    })
}

fn warm(path: &Path) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let bar = indicatif::ProgressBar::new(len).with_style(
        indicatif::ProgressStyle::with_template("loading {msg} {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(
        path.file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned()),
    );
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

/// A write past the file-size limit (`ulimit -f`) raises SIGXFSZ, whose default
/// action kills the process: with a handler installed the write fails with EFBIG
/// instead, and a snapshot save reports it (the previous save is kept) like a full
/// disk. The handler only logs.
fn survive_file_size_limit() {
    #[cfg(target_os = "linux")]
    {
        use tokio::signal::unix::{signal, SignalKind};
        const SIGXFSZ: i32 = 25;
        match signal(SignalKind::from_raw(SIGXFSZ)) {
            Ok(mut s) => {
                tokio::spawn(async move {
                    while s.recv().await.is_some() {
                        tracing::warn!("a write went past the file-size limit (SIGXFSZ)");
                    }
                });
            }
            Err(e) => tracing::warn!("cannot handle SIGXFSZ: {e}"),
        }
    }
}

/// Resolves at the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
