//! [`ApiError`]: every failure a route answers with, in OpenAI's envelope
//! `{"error": {"message", "type", "param", "code"}}`. The status comes from the
//! engine's [`ErrorKind`], never from reading the text, so a user's mistake is a 4xx
//! and only the server's own failure is a 500.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use folio::{EngineError, ErrorKind};
use serde::Serialize;

/// An error answer: status, message and the parameter at fault (if one is).
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    /// OpenAI's short code (`invalid_api_key`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (sent as `Retry-After` with a 503 or 429).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, message);
        e.param = Some(param.into());
        e
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 503 with `Retry-After`: the server is busy or not ready; the request did nothing.
    pub fn unavailable(message: impl Into<String>, retry_after: u32) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, message);
        e.retry_after = Some(retry_after);
        e
    }

    /// OpenAI's `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 if self.status != StatusCode::SERVICE_UNAVAILABLE => "server_error",
            503 => "service_unavailable_error",
            _ => "invalid_request_error",
        }
    }

    /// The envelope (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> Envelope<'_> {
        Envelope {
            error: Fields {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }
}

/// OpenAI's error envelope: `{"error": {"message", "type", "param", "code"}}`, the
/// last two `null` when unset.
#[derive(Serialize)]
pub struct Envelope<'a> {
    error: Fields<'a>,
}

#[derive(Serialize)]
struct Fields<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

/// The HTTP status of an error of `kind`.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Busy => StatusCode::CONFLICT,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Limit => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let status = status_of(e.kind());
        let mut out = ApiError::new(status, e.to_string());
        match &e {
            EngineError::Param { name, .. } => out.param = Some((*name).to_string()),
            EngineError::PromptTooLong { .. } => {
                out.param = Some("prompt".into());
                out.code = Some("context_length_exceeded");
            }
            EngineError::TooLargeForPool { .. } => out.param = Some("max_tokens".into()),
            EngineError::Tokenizer(_) | EngineError::EmptyPrompt => {
                out.param = Some("prompt".into())
            }
            EngineError::TimedOut { .. } => {
                out.message.push_str(" (--request-timeout)");
                out.code = Some("request_timeout");
            }
            _ => {}
        }
        // A request stopped by its time limit would only be stopped again.
        if status == StatusCode::SERVICE_UNAVAILABLE && !matches!(e, EngineError::TimedOut { .. }) {
            out.retry_after = Some(1);
        }
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!("{e}");
        }
        out
    }
}

impl From<folio_inferlet::InferletError> for ApiError {
    fn from(e: folio_inferlet::InferletError) -> Self {
        use folio_inferlet::InferletError as I;
        let mut out = match e {
            I::Engine(e) => return e.into(),
            ref e => ApiError::new(status_of(e.kind()), e.to_string()),
        };
        out.code = match e {
            I::Invalid(_) => Some("inferlet_invalid"),
            I::BadName(_) => Some("inferlet_name"),
            I::TimedOut(_) => Some("inferlet_time_limit"),
            I::Trap(_) => Some("inferlet_trap"),
            I::Program(_) => Some("inferlet_error"),
            I::Cancelled => Some("inferlet_cancelled"),
            I::Quota(_) => Some("inferlet_quota"),
            I::TooManyRuns(_) => Some("inferlet_runs"),
            _ => None,
        };
        if matches!(e, I::BadName(_)) {
            out.param = Some("name".into());
        }
        if out.status == StatusCode::TOO_MANY_REQUESTS && matches!(e, I::TooManyRuns(_)) {
            out.retry_after = Some(1);
        }
        if out.status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!("{}", out.message);
        }
        out
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
