//! [`JsonBody`]: a request body read under the size limit and parsed as JSON, every
//! failure answered in the error envelope: 413 over `--max-body`, 400 for malformed
//! JSON, and 400 naming the field for a known field of the wrong type. Unknown fields
//! are ignored (clients send many we have no use for).

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

/// A JSON body of type `T`.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let RawBody(bytes) = RawBody::from_request(req, state).await?;
        parse(&bytes).map(JsonBody)
    }
}

/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The body's bytes, read under the size limit (for routes that parse it twice or
/// allow it empty).
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let read = tokio::time::timeout(BODY_TIMEOUT, Bytes::from_request(req, state));
        let Ok(read) = read.await else {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {BODY_TIMEOUT:?}"),
            ));
        };
        read.map(RawBody).map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    status,
                    "the request body is over the server's limit (--max-body)",
                )
            } else {
                ApiError::new(status, e.body_text())
            }
        })
    }
}

/// Parses `bytes` as a `T`, naming the field at fault.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the body is not valid JSON: {inner}"),
            );
        }
        let msg = readable(&inner.to_string());
        if path == "." {
            ApiError::new(StatusCode::BAD_REQUEST, format!("bad request body: {msg}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {msg}"))
        }
    })?;
    de.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    Ok(value)
}

/// serde's message, minus the position (the field's name says where) and with the
/// untagged enums' "did not match any variant" made specific.
fn readable(msg: &str) -> String {
    let msg = msg.split(" at line ").next().unwrap_or(msg);
    for (ty, what) in [
        (
            "PromptInput",
            "a string, a list of strings, a list of token ids or a list of lists of token ids",
        ),
        ("StopInput", "a string or a list of strings"),
        ("Content", "a string or a list of content parts"),
        (
            "LogprobsInput",
            "a boolean (chat) or an integer (completions)",
        ),
    ] {
        if msg.contains(&format!("enum {ty}")) {
            return format!("must be {what}");
        }
    }
    msg.to_string()
}
