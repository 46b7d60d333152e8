//! [`ServeError`] and [`LoadError`]: why `serve` itself ends (the
//! model did not load, a setting the router cannot take, the socket), as opposed to
//! a route's failure, which is an [`crate::error::ApiError`] answer.

use thiserror::Error;

/// Why `serve` stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The model or engine did not load: the server stops (its routes answered 503
    /// until then).
    #[error("loading the model: {0}")]
    Load(LoadError),
    #[error("--cors-origin {0:?} is not a valid origin")]
    CorsOrigin(String),
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// Why the model did not load.
#[derive(Debug, Error)]
pub enum LoadError {
    /// The loader returned this reason (a missing file, a bad flag, the engine's
    /// refusal), as its text.
    #[error("{0}")]
    Loader(String),
    /// The loader's thread ended without returning (it panicked).
    #[error("the loader stopped without a model or a reason (it panicked)")]
    Stopped,
}

impl From<LoadError> for ServeError {
    fn from(e: LoadError) -> Self {
        Self::Load(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_error_reads_as_before() {
        let e = ServeError::from(LoadError::Loader("no such file".into()));
        assert_eq!(e.to_string(), "loading the model: no such file");
        // The reason is in the text, not repeated as a source (anyhow's `{:#}` would
        // print it twice).
        assert!(std::error::Error::source(&e).is_none());
    }
}
