//! Server-sent events: `data: {json}` lines, ending with `data: [DONE]` (OpenAI's
//! form), or, where the route's [`Chunker`] names its events, `event: {name}` before
//! each and no `[DONE]` (Anthropic's). A [`Chunker`] turns each engine event into the
//! route's chunk objects; a failure midway sends the route's error envelope as the
//! last chunk. The body owns the [`Run`], so
//! a client that disconnects drops it, which cancels the requests.

use crate::error::ApiError;
use crate::run::{Run, Tagged};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use folio::Event;
use serde::Serialize;

/// The route's part of a stream.
pub trait Chunker: Send + 'static {
    /// The route's chunk object.
    type Chunk: Serialize + Send;
    /// Chunks sent before any event (a chat's role chunk, an echoed prompt).
    fn start(&mut self) -> Vec<Self::Chunk>;
    /// Chunks for one event.
    fn event(&mut self, t: Tagged) -> Vec<Self::Chunk>;
    /// Chunks after the last event (usage).
    fn end(&mut self) -> Vec<Self::Chunk>;
    /// The `event:` name of a chunk (none in OpenAI's form).
    fn name(_chunk: &Self::Chunk) -> Option<&'static str> {
        None
    }
    /// Whether the stream ends with `data: [DONE]`.
    const DONE: bool = true;
    /// A failure midway: its event name and body (OpenAI's envelope by default).
    fn error(&mut self, e: &ApiError) -> (Option<&'static str>, serde_json::Value) {
        (None, serde_json::to_value(e.body()).unwrap_or_default())
    }
}

struct State<C> {
    run: Run,
    first: Option<Tagged>,
    chunker: C,
    started: bool,
    over: bool,
}

fn frame(out: &mut Vec<u8>, v: &impl Serialize) {
    named(out, None, v)
}

/// A frame, after `event: {name}` where it has one.
fn named(out: &mut Vec<u8>, name: Option<&str>, v: &impl Serialize) {
    if let Some(n) = name {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"data: ");
    // The answer shapes cannot fail to serialize (their maps' keys are strings).
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

/// A stream of chunks known up front (nothing to compute), then `[DONE]`.
pub fn fixed<T: Serialize>(chunks: &[T]) -> Response {
    let mut out = Vec::new();
    for v in chunks {
        frame(&mut out, v);
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    event_stream(Body::from(out))
}

fn event_stream(body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The streaming response: `first` is the run's first event, already received (so
/// errors found before any output were answered with a status instead).
pub fn respond<C: Chunker>(run: Run, first: Tagged, chunker: C) -> Response {
    let state = State {
        run,
        first: Some(first),
        chunker,
        started: false,
        over: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        if s.over {
            return None;
        }
        let mut out = Vec::new();
        if !std::mem::replace(&mut s.started, true) {
            for v in s.chunker.start() {
                named(&mut out, C::name(&v), &v);
            }
        }
        loop {
            let next = match s.first.take() {
                Some(t) => Some(t),
                None => s.run.next().await,
            };
            match next {
                Some(Tagged {
                    event: Event::Error(e),
                    ..
                }) => {
                    let err = if s.run.overflowed() {
                        ApiError::unavailable(
                            "the stream was not read: more events waited than the server keeps for one request, so it was stopped",
                            1,
                        )
                    } else {
                        ApiError::from(e)
                    };
                    let (name, body) = s.chunker.error(&err);
                    named(&mut out, name, &body);
                    if C::DONE {
                        out.extend_from_slice(b"data: [DONE]\n\n");
                    }
                    s.over = true;
                }
                Some(t) => {
                    for v in s.chunker.event(t) {
                        named(&mut out, C::name(&v), &v);
                    }
                }
                None => {
                    for v in s.chunker.end() {
                        named(&mut out, C::name(&v), &v);
                    }
                    if C::DONE {
                        out.extend_from_slice(b"data: [DONE]\n\n");
                    }
                    s.over = true;
                }
            }
            if !out.is_empty() {
                return Some((Ok::<_, std::convert::Infallible>(Bytes::from(out)), s));
            }
        }
    });
    event_stream(Body::from_stream(stream))
}
