//! [`blocking`]: an engine call run off the async threads (engine calls wait for the
//! engine thread, which may be in the middle of a step).

use crate::error::ApiError;
use axum::http::StatusCode;

/// Runs `f` on a blocking thread; a panic there is a 500.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}
