//! What a request must be before any route sees it, so that a web page the user
//! happens to visit cannot drive a server on their machine (cross-site requests and
//! DNS rebinding), and an oversized body is refused before it is sent:
//!
//! - **Host**: an IP literal, `localhost` (or a name under it), or a name given with
//!   `--allowed-hosts` (`*`: any). A rebinding page reaches us under its own name,
//!   which is none of these. 403 otherwise.
//! - **Origin**: when a browser sends one, it must be the server's own (the web page
//!   at `/`: same scheme-less authority as the Host) or one `--cors-origin` allows.
//!   403 otherwise (`null` included).
//! - **Content-Type**: a request with a body (or a type) must say `application/json` (so a
//!   cross-site form or `text/plain` "simple request" is refused: a page can send JSON
//!   only after a CORS preflight, which we answer for allowed origins alone). 415.
//! - **Content-Length** over `--max-body`: 413 at once, before `100 Continue`.
//!
//! One route takes another body: an inferlet upload (`POST /v1/inferlets`) is the
//! component's bytes as `application/wasm` (no form or simple request can send that
//! type either), up to the inferlet size limit instead of `--max-body`.

use crate::allowed::strip_port;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

fn forbidden(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, message)
        .code("forbidden")
        .into_response()
}

/// The request's body is declared (a length over zero, or chunked).
fn has_body(h: &HeaderMap) -> bool {
    h.contains_key(header::TRANSFER_ENCODING) || declared_length(h).is_some_and(|n| n > 0)
}

fn declared_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the request is an inferlet upload (a component's bytes, not JSON).
fn is_upload(req: &Request) -> bool {
    req.method() == axum::http::Method::POST && req.uri().path() == "/v1/inferlets"
}

fn is_type(h: &HeaderMap, want: &str) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

pub async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let h = req.headers();
    // Fails closed: a Host that is not ASCII text is no host of ours. (A request with
    // none at all, as HTTP/1.0 allows, comes from no browser.)
    let host = match h.get(header::HOST).map(|v| v.to_str()) {
        Some(Ok(v)) => Some(v.to_string()),
        Some(Err(_)) => {
            return forbidden("the Host header is not a host name".into());
        }
        None => req.uri().authority().map(|a| a.to_string()),
    };
    if let Some(host) = &host {
        if !st.allowed.host(host) {
            return forbidden(format!(
                "the Host {host:?} is not this server's: start it with --allowed-hosts {} to serve that name",
                strip_port(host)
            ));
        }
    }
    if let Some(origin) = h.get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        if !st.allowed.origin(&origin, host.as_deref()) {
            return forbidden(format!(
                "cross-origin requests from {origin:?} are refused: start the server with --cors-origin {origin} to allow them"
            ));
        }
    }
    let upload = is_upload(&req);
    let (limit, flag) = if upload {
        (
            st.config.inferlet_limits.program_bytes,
            "--inferlet-max-bytes",
        )
    } else {
        (st.config.max_body, "--max-body")
    };
    if upload
        && (has_body(h) || h.contains_key(header::CONTENT_TYPE))
        && !is_type(h, "application/wasm")
    {
        return ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "an inferlet upload is the component's bytes with Content-Type: application/wasm",
        )
        .into_response();
    }
    if let Some(n) = declared_length(h) {
        if n > limit as u64 {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body ({n} bytes) is over the server's limit of {limit} bytes ({flag})"
                ),
            )
            .into_response();
        }
    }
    if !upload && (has_body(h) || h.contains_key(header::CONTENT_TYPE)) && !is_json(h) {
        let given = h
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            match given {
                Some(t) => {
                    format!("the body must be JSON with Content-Type: application/json, not {t:?}")
                }
                None => {
                    "the body must be JSON with Content-Type: application/json (none was given)"
                        .into()
                }
            },
        )
        .into_response();
    }
    next.run(req).await
}
