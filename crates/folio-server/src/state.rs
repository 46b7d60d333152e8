//! [`AppState`]: what every route shares: the engine once the model is loaded (routes
//! answer 503 before), the compiled chat template, the settings, the metrics, the
//! context registry, and the count of requests still waiting for their first token
//! (the queue `--max-queue` bounds).

use crate::allowed::Allowed;
use crate::clock::unix_now;
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::registry::Contexts;
use crate::responses_store::Responses;
use folio::tokenizer::ChatTemplate;
use folio::Engine;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The engine and what goes with it, set once when the model has loaded.
pub struct Loaded {
    pub engine: Engine,
    /// `None` when the model's template does not compile (chat routes then say so).
    pub template: Option<ChatTemplate>,
    /// Every completion's `system_fingerprint`: `fp_` and the model fingerprint's
    /// first 12 hex digits.
    pub system_fingerprint: String,
    /// The inferlet host and stored programs; `None` when the host cannot be built
    /// (the inferlet routes then answer 503).
    pub inferlets: Option<std::sync::Arc<crate::inferlet_host::Inferlets>>,
}

pub struct AppState {
    pub config: ServeConfig,
    /// The hosts and origins requests may come from (`guard.rs`).
    pub allowed: Allowed,
    pub loaded: OnceLock<Loaded>,
    pub metrics: Metrics,
    pub contexts: Contexts,
    /// The stored responses (their contexts are in `contexts`).
    pub responses: Responses,
    /// Requests submitted that have not yet produced an event.
    pub queued: AtomicUsize,
    /// Set at SIGINT/SIGTERM: health answers 503 and new requests are refused.
    pub draining: AtomicBool,
    /// Unix time the server started (OpenAI's `created` of the model).
    pub started: u64,
}

impl AppState {
    pub fn new(config: ServeConfig) -> Self {
        Self {
            allowed: Allowed::new(&config.cors_origins, &config.allowed_hosts),
            config,
            loaded: OnceLock::new(),
            metrics: Metrics::default(),
            contexts: Default::default(),
            responses: Default::default(),
            queued: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            started: unix_now(),
        }
    }

    /// The engine, or 503 while the model loads or the server drains.
    pub fn ready(&self) -> Result<&Loaded, ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down", 5));
        }
        self.loaded
            .get()
            .ok_or_else(|| ApiError::unavailable("the model is still loading", 1))
    }

    /// A handle on the engine, or 503 as [`AppState::ready`] says.
    pub fn engine(&self) -> Result<Engine, ApiError> {
        Ok(self.ready()?.engine.clone())
    }
}
