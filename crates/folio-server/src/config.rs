//! [`ServeConfig`]: the server's own settings (the engine's are the engine's), read by
//! the routes through [`crate::state::AppState`].

use std::path::PathBuf;
use std::time::Duration;

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
    /// Where uploaded inferlets persist (`--inferlet-dir`); `None`: in memory only.
    pub inferlet_dir: Option<PathBuf>,
    /// The inferlet sandbox's bounds (time, memory, contexts, runs at once).
    pub inferlet_limits: folio_inferlet::Limits,
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
            inferlet_dir: None,
            inferlet_limits: folio_inferlet::Limits::default(),
        }
    }
}
