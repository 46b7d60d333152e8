//! [`Inferlets`]: the inferlet host and the stored programs, built beside the engine
//! when it has loaded (the routes are `inferlets.rs`'s).

use crate::config::ServeConfig;
use folio::Engine;
use folio_inferlet::{Host, InferletError, Library};

/// The host and the stored programs, built when the engine has loaded.
pub struct Inferlets {
    pub host: Host,
    pub library: Library,
}

impl Inferlets {
    /// The host over `engine` with the configured limits, and the programs in
    /// `--inferlet-dir` (compiled now).
    pub fn new(engine: Engine, cfg: &ServeConfig) -> Result<Self, InferletError> {
        let host = Host::new(engine, cfg.inferlet_limits.clone())?;
        let library = match &cfg.inferlet_dir {
            Some(d) => Library::open(&host, d)?,
            None => Library::in_memory(),
        };
        Ok(Self { host, library })
    }
}
