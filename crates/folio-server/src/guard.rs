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

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Which origins and hosts the server accepts, from the settings.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    /// `--cors-origin` values (lower case); `*` allows every origin.
    pub origins: Vec<String>,
    /// `--allowed-hosts` values (lower case); `*` allows every host, `.example.com`
    /// the name and every name under it.
    pub hosts: Vec<String>,
}

impl Allowed {
    pub fn new(origins: &[String], hosts: &[String]) -> Self {
        let lower = |v: &[String]| v.iter().map(|s| s.trim().to_ascii_lowercase()).collect();
        Self {
            origins: lower(origins),
            hosts: lower(hosts),
        }
    }

    fn any_origin(&self) -> bool {
        self.origins.iter().any(|o| o == "*")
    }

    /// Whether a Host header's name (port stripped) may reach the server.
    pub fn host(&self, host: &str) -> bool {
        let name = strip_port(host).to_ascii_lowercase();
        if name.parse::<std::net::IpAddr>().is_ok() || is_bracketed_v6(&name) {
            return true;
        }
        if name == "localhost" || name.ends_with(".localhost") {
            return true;
        }
        self.hosts.iter().any(|h| {
            h == "*"
                || *h == name
                || (h.starts_with('.') && (name.ends_with(h.as_str()) || name == h[1..]))
        })
    }

    /// Whether a request with this Origin may act, given its Host.
    pub fn origin(&self, origin: &str, host: Option<&str>) -> bool {
        let o = origin.trim().to_ascii_lowercase();
        if self.any_origin() || self.origins.contains(&o) {
            return true;
        }
        // The server's own page: the origin's authority is the Host the browser used.
        let authority = o
            .strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"));
        match (authority, host) {
            (Some(a), Some(h)) => a == h.to_ascii_lowercase(),
            _ => false,
        }
    }
}

fn is_bracketed_v6(name: &str) -> bool {
    name.strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .is_some_and(|n| n.parse::<std::net::Ipv6Addr>().is_ok())
}

/// `name:port` → `name` (a bracketed IPv6 literal keeps its brackets).
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

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
    if let Some(n) = declared_length(h) {
        if n > st.config.max_body as u64 {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body ({n} bytes) is over the server's limit of {} bytes (--max-body)",
                    st.config.max_body
                ),
            )
            .into_response();
        }
    }
    if (has_body(h) || h.contains_key(header::CONTENT_TYPE)) && !is_json(h) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(origins: &[&str], hosts: &[&str]) -> Allowed {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Allowed::new(&v(origins), &v(hosts))
    }

    #[test]
    fn hosts_by_default_are_ip_literals_and_localhost() {
        let a = allowed(&[], &[]);
        for h in [
            "127.0.0.1",
            "127.0.0.1:8080",
            "localhost:8080",
            "LocalHost",
            "app.localhost:1",
            "[::1]:8080",
            "[::1]",
            "10.1.2.3:80",
        ] {
            assert!(a.host(h), "{h}");
        }
        for h in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.evil.com",
            "evil",
        ] {
            assert!(!a.host(h), "{h}");
        }
    }

    #[test]
    fn allowed_hosts_extend_the_names() {
        let a = allowed(&[], &["box.lan", ".corp.example"]);
        assert!(a.host("box.lan:8080"));
        assert!(a.host("corp.example"));
        assert!(a.host("gpu1.corp.example:80"));
        assert!(!a.host("evilcorp.example"));
        assert!(!a.host("box.lan.evil"));
        assert!(allowed(&[], &["*"]).host("anything.example"));
    }

    #[test]
    fn origins_are_the_servers_own_or_listed() {
        let a = allowed(&["http://good.example"], &[]);
        assert!(a.origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(a.origin("http://good.example", Some("127.0.0.1:8080")));
        assert!(a.origin("HTTP://GOOD.EXAMPLE", None));
        for o in [
            "http://evil.example",
            "null",
            "http://good.example.evil.com",
            "http://good.example:80",
            "http://127.0.0.1:9999",
        ] {
            assert!(!a.origin(o, Some("127.0.0.1:8080")), "{o}");
        }
        assert!(allowed(&["*"], &[]).origin("http://evil.example", None));
    }
}
