//! The Responses API's answer (`/v1/responses`): the response object ([`Shape`]:
//! what every form of it repeats of the request), its output items (an assistant
//! `message` with one `output_text` part, then a `function_call` item per call read
//! out of the text where the request had tools), whole from a run's [`Tally`], or as
//! the typed stream ([`Stream`]): `response.created`, `response.in_progress`, per item
//! `response.output_item.added`, its deltas (`response.content_part.added`,
//! `response.output_text.delta` / `.done`, `response.content_part.done`, or
//! `response.function_call_arguments.delta` / `.done`) and
//! `response.output_item.done`, then `response.completed` (or
//! `response.incomplete` when `max_output_tokens` cut it). Every event carries its
//! `sequence_number`; its `type` is also its SSE event name.

use crate::error::ApiError;
use crate::messages_answer::{chunk, Chunk};
use crate::params::Job;
use crate::run::Tagged;
use crate::sse::Chunker;
use crate::tally::{Counts, Tally};
use crate::tool_call::Call;
use crate::tool_stream::{pieces_of, Piece, ToolStream};
use crate::tools;
use folio::{Event, FinishReason};
use serde_json::{json, Map, Value};

/// What the response object repeats of its request, and its names.
pub struct Shape {
    /// `resp_…`; its items' ids share the suffix.
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub instructions: Option<String>,
    pub previous: Option<String>,
    pub store: bool,
    /// The request's fields the answer repeats (`tools`, `text`, `metadata`...).
    pub echo: Map<String, Value>,
}

/// Called once with the finished response object (it stores it).
pub type Keep = Box<dyn FnOnce(&Value) + Send>;

impl Shape {
    fn suffix(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.suffix())
    }

    fn call_ids(&self, k: usize) -> (String, String) {
        let s = self.suffix();
        (format!("fc_{s}_{k}"), format!("call_{s}_{k}"))
    }

    fn echoed(&self, k: &str, default: Value) -> Value {
        self.echo.get(k).cloned().unwrap_or(default)
    }

    /// The response object: `status`, its output, and usage once it is known.
    pub fn object(
        &self,
        finish: Option<FinishReason>,
        output: Vec<Value>,
        c: Option<&Counts>,
    ) -> Value {
        let (status, incomplete) = match (c, finish) {
            (None, _) => ("in_progress", Value::Null),
            (Some(_), Some(FinishReason::Length)) => {
                ("incomplete", json!({"reason": "max_output_tokens"}))
            }
            (Some(_), _) => ("completed", Value::Null),
        };
        let usage = c.map_or(Value::Null, |c| {
            let u = c.usage();
            json!({"input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.total_tokens})
        });
        let completed_at = c.map(|_| crate::clock::unix_now());
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": completed_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.echoed("max_output_tokens", Value::Null),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.echoed("parallel_tool_calls", json!(true)),
            "previous_response_id": self.previous,
            "reasoning": {"effort": null, "summary": null},
            "store": self.store,
            "temperature": self.echoed("temperature", json!(1.0)),
            "text": self.echoed("text", json!({"format": {"type": "text"}})),
            "tool_choice": self.echoed("tool_choice", json!("auto")),
            "tools": self.echoed("tools", json!([])),
            "top_p": self.echoed("top_p", json!(1.0)),
            "truncation": "disabled",
            "usage": usage,
            "user": self.echoed("user", Value::Null),
            "safety_identifier": self.echoed("safety_identifier", Value::Null),
            "prompt_cache_key": self.echoed("prompt_cache_key", Value::Null),
            "metadata": self.echoed("metadata", json!({})),
            "service_tier": "default",
            "background": false,
            "system_fingerprint": self.system_fingerprint,
        })
    }

    fn message(&self, text: &str, status: &str) -> Value {
        json!({"type": "message", "id": self.message_id(), "status": status,
            "role": "assistant", "content": [text_part(text)]})
    }

    fn call(&self, k: usize, name: &str, arguments: &str, status: &str) -> Value {
        let (id, call_id) = self.call_ids(k);
        json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status})
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn item_status(finish: Option<FinishReason>) -> &'static str {
    match finish {
        Some(FinishReason::Length) => "incomplete",
        _ => "completed",
    }
}

/// The response of a run that is not streamed.
pub fn whole(shape: &Shape, job: &Job, tally: &Tally) -> Value {
    let c = &tally.choices[0];
    let found = job.tools.as_ref().and_then(|t| tools::extract(t, &c.text));
    let (text, calls): (String, Vec<Call>) = match found {
        Some((calls, rest)) => (rest.unwrap_or_default(), calls),
        None => (c.text.clone(), Vec::new()),
    };
    let status = item_status(c.finish);
    let mut output = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        output.push(shape.message(&text, status));
    }
    for (k, call) in calls.iter().enumerate() {
        output.push(shape.call(k, &call.name, &call.arguments, "completed"));
    }
    shape.object(c.finish, output, Some(&tally.counts))
}

/// The item open in a stream.
enum Open {
    Text(String),
    Call {
        k: usize,
        name: String,
        args: String,
    },
}

/// A streamed response's events.
pub struct Stream {
    shape: Shape,
    /// The answer's text and calls as they stream, where the request has tools.
    tools: Option<ToolStream>,
    counts: Counts,
    /// Finished items, and the open one.
    output: Vec<Value>,
    open: Option<Open>,
    seq: u64,
    finish: Option<FinishReason>,
    keep: Option<Keep>,
}

impl Stream {
    pub fn new(shape: Shape, job: &Job, keep: Option<Keep>) -> Self {
        Stream {
            shape,
            tools: job.tools.as_ref().map(|t| ToolStream::new(&t.mode)),
            counts: Counts::default(),
            output: Vec::new(),
            open: None,
            seq: 0,
            finish: None,
            keep,
        }
    }

    /// An event of `kind` with the next sequence number.
    fn ev(&mut self, kind: &'static str, mut body: Value) -> Chunk {
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        chunk(kind, body)
    }

    /// Closes the open item, if any.
    fn close(&mut self, out: &mut Vec<Chunk>) {
        let index = self.output.len();
        let status = item_status(self.finish);
        let item = match self.open.take() {
            None => return,
            Some(Open::Text(text)) => {
                let id = self.shape.message_id();
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                out.push(self.ev("response.output_text.done", done));
                let mut part = at;
                part["part"] = text_part(&text);
                out.push(self.ev("response.content_part.done", part));
                self.shape.message(&text, status)
            }
            Some(Open::Call { k, name, args }) => {
                let (id, _) = self.shape.call_ids(k);
                let body = json!({"item_id": id, "output_index": index, "name": name,
                    "arguments": args});
                out.push(self.ev("response.function_call_arguments.done", body));
                self.shape.call(k, &name, &args, "completed")
            }
        };
        let body = json!({"output_index": index, "item": item});
        out.push(self.ev("response.output_item.done", body));
        self.output.push(item);
    }

    /// Opens a message item.
    fn open_text(&mut self, out: &mut Vec<Chunk>) {
        self.close(out);
        let index = self.output.len();
        let mut item = self.shape.message("", "in_progress");
        item["content"] = json!([]);
        let id = self.shape.message_id();
        out.push(self.ev(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        let body = json!({"item_id": id, "output_index": index, "content_index": 0,
            "part": text_part("")});
        out.push(self.ev("response.content_part.added", body));
        self.open = Some(Open::Text(String::new()));
    }

    /// The events for pieces of the answer.
    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<Chunk> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(text) if text.is_empty() => {}
                Piece::Content(text) => {
                    if !matches!(self.open, Some(Open::Text(_))) {
                        self.open_text(&mut out);
                    }
                    if let Some(Open::Text(t)) = &mut self.open {
                        t.push_str(&text);
                    }
                    let body = json!({"item_id": self.shape.message_id(),
                        "output_index": self.output.len(), "content_index": 0,
                        "delta": text, "logprobs": []});
                    out.push(self.ev("response.output_text.delta", body));
                }
                Piece::Begin { k, name } => {
                    self.close(&mut out);
                    let item = self.shape.call(k, &name, "", "in_progress");
                    let body = json!({"output_index": self.output.len(), "item": item});
                    out.push(self.ev("response.output_item.added", body));
                    self.open = Some(Open::Call {
                        k,
                        name,
                        args: String::new(),
                    });
                }
                Piece::Args { k, text } => {
                    if let Some(Open::Call { args, .. }) = &mut self.open {
                        args.push_str(&text);
                    }
                    let (id, _) = self.shape.call_ids(k);
                    let body = json!({"item_id": id, "output_index": self.output.len(),
                        "delta": text});
                    out.push(self.ev("response.function_call_arguments.delta", body));
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
        let r = self.shape.object(None, Vec::new(), None);
        vec![
            self.ev("response.created", json!({"response": r.clone()})),
            self.ev("response.in_progress", json!({"response": r})),
        ]
    }

    fn event(&mut self, t: Tagged) -> Vec<Chunk> {
        self.counts.count(&t.event);
        match t.event {
            Event::Token { text, .. } => {
                let p = pieces_of(&mut self.tools, &text, false);
                self.pieces(p)
            }
            Event::Done { text, finish, .. } => {
                self.finish = Some(finish);
                let p = pieces_of(&mut self.tools, &text, true);
                self.pieces(p)
            }
            Event::PromptLogprobs(_) | Event::Error(_) => Vec::new(),
        }
    }

    fn end(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        if self.output.is_empty() && self.open.is_none() {
            // No text and no call: an empty message, as the whole answer has.
            self.open_text(&mut out);
        }
        self.close(&mut out);
        let r = self
            .shape
            .object(self.finish, self.output.clone(), Some(&self.counts));
        if let Some(keep) = self.keep.take() {
            keep(&r);
        }
        let kind = match r["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        out.push(self.ev(kind, json!({"response": r})));
        out
    }

    fn name(c: &Chunk) -> Option<&'static str> {
        Some(c.kind)
    }

    fn error(&mut self, e: &ApiError) -> (Option<&'static str>, Value) {
        let body = json!({"type": "error", "code": e.code, "message": e.message,
            "param": e.param, "sequence_number": self.seq});
        self.seq += 1;
        (Some("error"), body)
    }
}
