//! The Messages API's answer (`/v1/messages`): the whole message from a run's
//! [`Tally`] (text, and `tool_use` blocks read out of it where the request had
//! tools), and the typed stream ([`Stream`]): `message_start`, each content block's
//! `content_block_start`, `content_block_delta` (`text_delta` or `input_json_delta`)
//! and `content_block_stop`, then `message_delta` (stop reason, usage) and
//! `message_stop`.

use crate::error::ApiError;
use crate::generate::collect;
use crate::params::Job;
use crate::run::{Run, Tagged};
use crate::sse::Chunker;
use crate::tally::{Counts, Tally};
use crate::tool_stream::{pieces_of, Piece, ToolStream};
use crate::tools;
use folio::{Event, FinishReason};
use serde::Serialize;
use serde_json::{json, Value};

/// A whole message.
#[derive(Serialize)]
pub struct Message {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: String,
    content: Vec<Value>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: Usage,
}

/// Anthropic's token counts: `input_tokens` are the prompt's tokens not read from the
/// prefix cache, `cache_read_input_tokens` the ones that were.
#[derive(Serialize, Clone, Copy, Default)]
pub struct Usage {
    input_tokens: usize,
    output_tokens: usize,
    cache_creation_input_tokens: usize,
    cache_read_input_tokens: usize,
}

fn usage(c: &Counts) -> Usage {
    let u = c.usage();
    let cached = u.prompt_tokens_details.cached_tokens;
    Usage {
        input_tokens: u.prompt_tokens - cached.min(u.prompt_tokens),
        output_tokens: u.completion_tokens,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: cached,
    }
}

/// A message id: `msg_` and a number no other answer of this server has.
fn message_id(model: &str) -> String {
    crate::answer::Head::new("msg", model, "")
        .id
        .replacen('-', "_", 1)
}

/// Anthropic's stop reason, with the stop sequence that ended the message (`stop`,
/// the engine's): a stop of the grammar (structured output) is no sequence's.
fn stop(
    finish: Option<FinishReason>,
    stop: Option<&str>,
    calls: usize,
) -> (&'static str, Option<String>) {
    match (finish, stop) {
        (Some(FinishReason::Length), _) => ("max_tokens", None),
        _ if calls > 0 => ("tool_use", None),
        (Some(FinishReason::Stop), Some(s)) => ("stop_sequence", Some(s.to_string())),
        _ => ("end_turn", None),
    }
}

/// A `tool_use` block of call `k` of message `id`.
fn tool_use(id: &str, k: usize, name: &str, arguments: &str) -> Value {
    let input = partial_input(arguments);
    json!({"type": "tool_use", "id": format!("toolu_{id}_{k}"), "name": name, "input": input})
}

/// Cuts of a call's arguments tried by [`partial_input`], from the end back.
const CUTS: usize = 256;

/// A call's `input`: its arguments as written where they are an object, else, cut
/// short (`max_tokens`), what Anthropic's SDKs make of the same text streamed as
/// `input_json_delta`s: the longest prefix that parses as an object once its open
/// string, arrays and objects are closed (`{"a":1000` is `{"a": 1000}`), found among
/// the last [`CUTS`] cuts; `{}` where none does (nothing of the object was written).
fn partial_input(arguments: &str) -> Value {
    if let Ok(v @ Value::Object(_)) = serde_json::from_str(arguments) {
        return v;
    }
    (0..=arguments.len())
        .rev()
        .filter(|&i| arguments.is_char_boundary(i))
        .take(CUTS)
        .filter_map(|i| closed(&arguments[..i]))
        .find_map(|c| match serde_json::from_str(&c) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => None,
        })
        .unwrap_or_else(|| json!({}))
}

/// `head` with its open string, arrays and objects closed, in order; `None` where
/// it ends just after a string's backslash or closes more than it opened (a cut
/// `\u` escape is closed as it is, and the parser refuses it).
fn closed(head: &str) -> Option<String> {
    let (mut open, mut in_string, mut escaped) = (Vec::new(), false, false);
    for c in head.chars() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => open.push('}'),
            '[' => open.push(']'),
            '}' | ']' => {
                open.pop()?;
            }
            _ => {}
        }
    }
    if escaped {
        return None;
    }
    let mut out = head.to_string();
    if in_string {
        out.push('"');
    }
    out.extend(open.iter().rev());
    Some(out)
}

/// The message of a run that is not streamed.
pub async fn whole(run: Run, first: Tagged, model: &str, job: &Job) -> Result<Message, ApiError> {
    let tally = collect(run, first, Tally::new(1, 1)).await?;
    let c = &tally.choices[0];
    let id = message_id(model);
    let found = job.tools.as_ref().and_then(|t| tools::extract(t, &c.text));
    let (text, calls) = match found {
        Some((calls, rest)) => (rest.unwrap_or_default(), calls),
        None => (c.text.clone(), Vec::new()),
    };
    let mut content = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for (k, call) in calls.iter().enumerate() {
        content.push(tool_use(&id, k, &call.name, &call.arguments));
    }
    let (stop_reason, stop_sequence) = stop(c.finish, c.stop.as_deref(), calls.len());
    Ok(Message {
        id,
        kind: "message",
        role: "assistant",
        model: model.to_string(),
        content,
        stop_reason: Some(stop_reason),
        stop_sequence,
        usage: usage(&tally.counts),
    })
}

/// One event of the stream: its `type` is also its SSE event name.
#[derive(Serialize)]
pub struct Chunk {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(flatten)]
    body: Value,
}

/// An event of type `kind` with `body`'s fields.
pub fn chunk(kind: &'static str, body: Value) -> Chunk {
    Chunk { kind, body }
}

/// The content block open in a stream.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    None,
    Text,
    Tool,
}

/// A streamed message's events.
pub struct Stream {
    model: String,
    id: String,
    job: Job,
    /// The answer's text and calls as they stream, where the request has tools.
    tools: Option<ToolStream>,
    counts: Counts,
    /// The open block and the next block's index.
    open: Open,
    next: usize,
    finish: Option<FinishReason>,
    /// The stop string that ended the message, where one did.
    stop: Option<String>,
    calls: usize,
}

impl Stream {
    pub fn new(model: String, job: Job) -> Self {
        Stream {
            id: message_id(&model),
            model,
            tools: job.tools.as_ref().map(|t| ToolStream::new(&t.mode)),
            job,
            counts: Counts::default(),
            open: Open::None,
            next: 0,
            finish: None,
            stop: None,
            calls: 0,
        }
    }

    /// Closes the open block, if any.
    fn close(&mut self, out: &mut Vec<Chunk>) {
        if self.open != Open::None {
            out.push(chunk("content_block_stop", json!({"index": self.next - 1})));
            self.open = Open::None;
        }
    }

    /// Opens a block of `kind` (closing the one before).
    fn begin(&mut self, kind: Open, block: Value, out: &mut Vec<Chunk>) {
        self.close(out);
        let body = json!({"index": self.next, "content_block": block});
        out.push(chunk("content_block_start", body));
        self.open = kind;
        self.next += 1;
    }

    /// The events for pieces of the answer.
    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<Chunk> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(text) if text.is_empty() => {}
                Piece::Content(text) => {
                    if self.open != Open::Text {
                        let block = json!({"type": "text", "text": ""});
                        self.begin(Open::Text, block, &mut out);
                    }
                    let delta = json!({"type": "text_delta", "text": text});
                    let body = json!({"index": self.next - 1, "delta": delta});
                    out.push(chunk("content_block_delta", body));
                }
                Piece::Begin { k, name } => {
                    let block = json!({"type": "tool_use",
                        "id": format!("toolu_{}_{k}", self.id), "name": name, "input": {}});
                    self.begin(Open::Tool, block, &mut out);
                    self.calls += 1;
                }
                Piece::Args { text, .. } => {
                    let delta = json!({"type": "input_json_delta", "partial_json": text});
                    let body = json!({"index": self.next - 1, "delta": delta});
                    out.push(chunk("content_block_delta", body));
                }
            }
        }
        out
    }
}

impl Chunker for Stream {
    type Chunk = Chunk;
    const DONE: bool = false;

    fn start(&mut self) -> Vec<Chunk> {
        let input = self.job.prompts.first().map_or(0, Vec::len);
        let message = json!({"id": self.id, "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 0}});
        vec![chunk("message_start", json!({"message": message}))]
    }

    fn event(&mut self, t: Tagged) -> Vec<Chunk> {
        self.counts.count(&t.event);
        match t.event {
            Event::Token { text, .. } => {
                let p = pieces_of(&mut self.tools, &text, false);
                self.pieces(p)
            }
            Event::Done {
                text, finish, stop, ..
            } => {
                let p = pieces_of(&mut self.tools, &text, true);
                let mut out = self.pieces(p);
                self.close(&mut out);
                self.finish = Some(finish);
                self.stop = stop;
                out
            }
            Event::PromptLogprobs(_) | Event::Error(_) => Vec::new(),
        }
    }

    fn end(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        self.close(&mut out);
        let (reason, seq) = stop(self.finish, self.stop.as_deref(), self.calls);
        let delta = json!({"stop_reason": reason, "stop_sequence": seq});
        let body = json!({"delta": delta, "usage": usage(&self.counts)});
        out.push(chunk("message_delta", body));
        out.push(chunk("message_stop", json!({})));
        out
    }

    fn name(c: &Chunk) -> Option<&'static str> {
        Some(c.kind)
    }

    fn error(&mut self, e: &ApiError) -> (Option<&'static str>, Value) {
        let body = serde_json::to_value(envelope(e)).unwrap_or_default();
        (Some("error"), body)
    }
}

/// `{"type": "error", "error": {"type", "message"}}` (also a stream's `error` event).
#[derive(Serialize)]
pub struct Envelope {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorFields,
}

#[derive(Serialize)]
struct ErrorFields {
    #[serde(rename = "type")]
    kind: &'static str,
    message: String,
}

pub fn envelope(e: &ApiError) -> Envelope {
    let kind = match e.status.as_u16() {
        400 | 413 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let message = match &e.param {
        Some(p) => format!("{p}: {}", e.message),
        None => e.message.clone(),
    };
    Envelope {
        kind: "error",
        error: ErrorFields { kind, message },
    }
}

#[cfg(test)]
mod tests {
    use super::partial_input;
    use serde_json::json;

    #[test]
    fn cut_arguments_give_the_object_written_so_far() {
        assert_eq!(partial_input(r#"{"a": 1}"#), json!({"a": 1}));
        assert_eq!(partial_input(r#"{"a":1000"#), json!({"a": 1000}));
        assert_eq!(partial_input(r#"{"a":"he\"l"#), json!({"a": "he\"l"}));
        assert_eq!(
            partial_input(r#"{"a":[1,{"b":"x"#),
            json!({"a": [1, {"b": "x"}]})
        );
        assert_eq!(partial_input(r#"{"a":1,"b"#), json!({"a": 1}));
        assert_eq!(partial_input(r#"{"a":1,"b":"#), json!({"a": 1}));
        assert_eq!(partial_input(r#"{"a":"\u00"#), json!({"a": ""}));
        assert_eq!(partial_input(r#"{"a":tr"#), json!({}));
        assert_eq!(partial_input(""), json!({}));
        assert_eq!(partial_input("[1, 2]"), json!({}));
    }
}
