//! `POST /v1/messages`: Anthropic's Messages API over the same engine, so tools built
//! for it can use a local model. A request is translated into a chat completion
//! request (system, messages with text, `tool_use` and `tool_result` blocks, tools and
//! `tool_choice`, `stop_sequences`, sampling fields) and checked, tokenized and run on
//! the chat path; the answer is Anthropic's message (`messages_answer.rs`), whole or
//! as its typed server-sent events. Errors use Anthropic's envelope
//! `{"type": "error", "error": {"type", "message"}}` with the chat path's statuses.
//! `POST /v1/messages/count_tokens` counts the prompt such a request would take.
//!
//! | field | handling |
//! |---|---|
//! | `model`, `metadata`, `service_tier` | accepted and ignored (one model; nothing stored) |
//! | `max_tokens` | required, as Anthropic requires it |
//! | `system` | a string or text blocks: the chat's system message |
//! | `messages` | `user` / `assistant`; content a string or blocks: `text`, `tool_use` (assistant), `tool_result` (user); `image` and `document` are a 400 (no vision); a last assistant turn of text is continued (a prefill: the answer is what follows it) |
//! | `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream` | as the chat fields |
//! | `tools`, `tool_choice` (`auto`, `any`, `tool`, `none`; `disable_parallel_tool_use`) | as OpenAI's tools and `tool_choice` (`any` = `required`) |
//! | `thinking` | `disabled`, or `enabled` with a positive `budget_tokens`: accepted; the answer has no thinking blocks (folio does not separate a model's reasoning from its answer) |
//! | `thinking` / `redacted_thinking` blocks (assistant) | an earlier turn's reasoning: the chat message's `reasoning_content`, for templates that render it |
//! | anything else | ignored, as unknown chat fields are |

use crate::body::JsonBody;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::generate::{first_event, prepare};
use crate::messages_answer::{self, Stream};
use crate::params::Route;
use crate::run::Run;
use crate::sse;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The route.
pub async fn messages(
    State(st): State<Arc<AppState>>,
    body: Result<JsonBody<Value>, ApiError>,
) -> Response {
    let r = match body {
        Ok(JsonBody(r)) => r,
        Err(e) => return error(e),
    };
    match run(&st, r).await {
        Ok(r) => r,
        Err(e) => error(e),
    }
}

async fn run(st: &Arc<AppState>, r: Value) -> Result<Response, ApiError> {
    let deadline = Deadline::start(st);
    let gen = chat_request(&r)?;
    let job = prepare(st, Route::Chat, gen, deadline).await?;
    let engine = &st.ready()?.engine;
    let (run, first) = first_event(Run::start(st, engine, &job, deadline)?).await?;
    let model = st.config.model_name.clone();
    if job.stream {
        let chunker = Stream::new(model, job);
        return Ok(sse::respond(run, first, chunker));
    }
    let answer = messages_answer::whole(run, first, &model, &job).await?;
    Ok(Json(answer).into_response())
}

/// `POST /v1/messages/count_tokens`: the tokens the request's prompt would take
/// (system, messages, tools, as the chat template renders them), `{"input_tokens"}`;
/// `max_tokens` is not needed here.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<JsonBody<Value>, ApiError>,
) -> Response {
    let deadline = Deadline::start(&st);
    let mut r = match body {
        Ok(JsonBody(r)) => r,
        Err(e) => return error(e),
    };
    // What is generated plays no part in a count.
    if let Some(o) = r.as_object_mut() {
        o.insert("max_tokens".into(), json!(1));
        o.remove("stream");
    }
    let counted = async {
        let job = prepare(&st, Route::Chat, chat_request(&r)?, deadline).await?;
        Ok::<_, ApiError>(job.prompts[0].len())
    };
    match counted.await {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error(e),
    }
}

/// Anthropic's error envelope, with the chat path's status.
pub fn error(e: ApiError) -> Response {
    let mut r = (e.status, Json(messages_answer::envelope(&e))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, s.into());
    }
    r
}

fn bad(field: &str, why: impl Into<String>) -> ApiError {
    ApiError::invalid(field, why)
}

/// The chat completion request a Messages request asks for, parsed.
pub fn chat_request(r: &Value) -> Result<crate::api::GenRequest, ApiError> {
    serde_json::from_value(to_chat(r)?).map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// The chat completion request a Messages request asks for.
fn to_chat(r: &Value) -> Result<Value, ApiError> {
    let r = r
        .as_object()
        .ok_or_else(|| bad("body", "not a JSON object"))?;
    let max_tokens = r
        .get("max_tokens")
        .ok_or_else(|| bad("max_tokens", "required"))?;
    if max_tokens.as_u64().is_none() {
        return Err(bad("max_tokens", "a whole number of tokens, 1 or more"));
    }
    thinking(r.get("thinking"))?;
    let mut messages = Vec::new();
    if let Some(s) = r.get("system") {
        messages.push(json!({"role": "system", "content": text_of("system", s)?}));
    }
    let list = r
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages", "required: a list of messages"))?;
    for (i, m) in list.iter().enumerate() {
        turn(i, m, &mut messages)?;
    }
    // A last turn of the assistant's own text is the start of the answer, which
    // continues it (Anthropic's prefill); the answer holds only what follows.
    let prefill = messages
        .last()
        .is_some_and(|m| m["role"] == "assistant" && m.get("tool_calls").is_none());
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if prefill {
        chat.insert("continue_final_message".into(), Value::Bool(true));
    }
    chat.insert("max_tokens".into(), max_tokens.clone());
    for (from, to) in [
        ("stop_sequences", "stop"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
    ] {
        if let Some(v) = r.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if chat.get("stream") == Some(&Value::Bool(true)) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(tools) = r.get("tools") {
        chat.insert("tools".into(), to_tools(tools)?);
    }
    if let Some(c) = r.get("tool_choice") {
        let (choice, parallel) = to_choice(c)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(p) = parallel {
            chat.insert("parallel_tool_calls".into(), Value::Bool(p));
        }
    }
    Ok(Value::Object(chat))
}

/// `thinking`: `{"type": "disabled"}`, or `{"type": "enabled", "budget_tokens": n}`
/// (n ≥ 1), accepted as llama.cpp and vLLM accept it: folio does not separate a
/// model's reasoning from its answer, so the answer has no thinking blocks, as
/// Anthropic's own answer has none when the model did not think.
fn thinking(t: Option<&Value>) -> Result<(), ApiError> {
    let Some(t) = t.filter(|t| !t.is_null()) else {
        return Ok(());
    };
    match t.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(()),
        Some("enabled")
            if t.get("budget_tokens")
                .and_then(Value::as_u64)
                .is_some_and(|n| n >= 1) =>
        {
            Ok(())
        }
        Some("enabled") => Err(bad("thinking.budget_tokens", "a positive number of tokens")),
        _ => Err(bad(
            "thinking",
            "{\"type\": \"enabled\", \"budget_tokens\": n} or {\"type\": \"disabled\"}",
        )),
    }
}

/// The text of a string or of a list of text blocks.
fn text_of(field: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push_str(t),
                    _ => return Err(bad(field, "only text blocks are supported here")),
                }
            }
            Ok(out)
        }
        _ => Err(bad(field, "a string or a list of text blocks")),
    }
}

/// Message `i` as chat messages: its text, an assistant's tool calls, a user's tool
/// results (each a `tool` message, before the user's own text).
fn turn(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str);
    let role = match role {
        Some(r @ ("user" | "assistant")) => r,
        _ => return Err(bad(&field, "role must be \"user\" or \"assistant\"")),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => return Err(bad(&field, "content must be a string or a list of blocks")),
    };
    let (mut text, mut calls, mut reasoning) = (String::new(), Vec::new(), String::new());
    for b in blocks {
        match (b.get("type").and_then(Value::as_str), role) {
            // An earlier turn's reasoning: the template's `reasoning_content`, for the
            // templates that render it. A redacted one carries no text to render.
            (Some("thinking"), "assistant") => match b.get("thinking") {
                Some(Value::String(t)) => reasoning.push_str(t),
                _ => return Err(bad(&field, "a thinking block without thinking")),
            },
            (Some("redacted_thinking"), "assistant") => {}
            (Some("text"), _) => match b.get("text") {
                Some(Value::String(t)) => text.push_str(t),
                _ => return Err(bad(&field, "a text block without text")),
            },
            (Some("tool_use"), "assistant") => {
                let (Some(id), Some(name)) = (b.get("id"), b.get("name")) else {
                    return Err(bad(&field, "a tool_use block needs an id and a name"));
                };
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            (Some("tool_result"), "user") => {
                let Some(id) = b.get("tool_use_id") else {
                    return Err(bad(&field, "a tool_result block needs a tool_use_id"));
                };
                let content = match b.get("content") {
                    None => String::new(),
                    Some(c) => text_of(&field, c)?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (Some(kind @ ("image" | "document")), _) => {
                return Err(bad(
                    &field,
                    format!("{kind} blocks are not supported (text only)"),
                ))
            }
            (kind, _) => {
                let kind = kind.unwrap_or("(none)");
                return Err(bad(&field, format!("a {kind} block in a {role} message")));
            }
        }
    }
    let mut m = if !calls.is_empty() {
        json!({"role": "assistant", "content": text, "tool_calls": calls})
    } else if !text.is_empty() || role == "assistant" {
        json!({"role": role, "content": text})
    } else {
        return Ok(());
    };
    if !reasoning.is_empty() {
        m["reasoning_content"] = Value::String(reasoning);
    }
    out.push(m);
    Ok(())
}

/// Anthropic's tools (`name`, `description`, `input_schema`) as OpenAI's functions.
fn to_tools(v: &Value) -> Result<Value, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("tools", "a list of tools"))?;
    let mut out = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, t) in list.iter().enumerate() {
        let field = format!("tools[{i}]");
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return Err(bad(&field, "a tool needs a name"));
        };
        if !names.insert(name) {
            return Err(bad(&field, format!("two tools are named {name:?}")));
        }
        // Anthropic's rule: a call's input is an object, so its schema is one's.
        let schema = t.get("input_schema");
        let Some(schema) = schema.filter(|s| s.get("type") == Some(&json!("object"))) else {
            return Err(bad(
                &format!("{field}.input_schema"),
                "required: a JSON schema of type \"object\" (a call's input is an object)",
            ));
        };
        let mut f = json!({"name": name, "parameters": schema});
        if let Some(d) = t.get("description") {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// Anthropic's `tool_choice` as OpenAI's, and `parallel_tool_calls` where it says.
fn to_choice(c: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = c
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|d| !d);
    let choice = match c.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match c.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => return Err(bad("tool_choice", "type \"tool\" needs a name")),
        },
        _ => return Err(bad("tool_choice", "type must be auto, any, tool or none")),
    };
    Ok((choice, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_request() {
        let r = json!({
            "model": "x", "max_tokens": 32, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "top_k": 5, "metadata": {"user_id": "u"},
            "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me see."},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "rain"},
                    {"type": "text", "text": "thanks"}]}
            ]
        });
        let chat = to_chat(&r).unwrap();
        assert_eq!(
            chat,
            json!({
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": "Let me see.", "tool_calls": [
                        {"id": "t1", "type": "function",
                         "function": {"name": "get", "arguments": "{\"city\":\"Oslo\"}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "rain"},
                    {"role": "user", "content": "thanks"}
                ],
                "max_tokens": 32, "stop": ["END"], "top_k": 5,
                "tools": [{"type": "function", "function":
                    {"name": "get", "description": "d", "parameters": {"type": "object"}}}],
                "tool_choice": "required", "parallel_tool_calls": false
            })
        );
    }

    #[test]
    fn what_folio_cannot_do_is_a_400_naming_the_field() {
        let base = |extra: Value| {
            let mut r = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            to_chat(&r)
                .err()
                .map(|e| (e.status.as_u16(), e.param.unwrap()))
        };
        let image = json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]});
        assert_eq!(base(image), Some((400, "messages[0]".into())));
        let thinking = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
        assert_eq!(base(thinking), None);
        let thinking = json!({"thinking": {"type": "enabled"}});
        assert_eq!(base(thinking), Some((400, "thinking.budget_tokens".into())));
        let thinking = json!({"thinking": {"type": "always"}});
        assert_eq!(base(thinking), Some((400, "thinking".into())));
        let choice = json!({"tool_choice": {"type": "tool"}});
        assert_eq!(base(choice), Some((400, "tool_choice".into())));
        let role = json!({"messages": [{"role": "system", "content": "x"}]});
        assert_eq!(base(role), Some((400, "messages[0]".into())));
        assert_eq!(base(json!({"thinking": {"type": "disabled"}})), None);
        // The fifth hostile probe: a bad max_tokens named as such; a tool without an
        // object schema (its input would be lost), or named twice.
        for bad_max in [json!(-1), json!("5"), json!(2.5)] {
            let got = base(json!({"max_tokens": bad_max}));
            assert_eq!(got, Some((400, "max_tokens".into())));
        }
        let tool = |t: Value| base(json!({"tools": [t]}));
        let want = Some((400, "tools[0].input_schema".into()));
        assert_eq!(tool(json!({"name": "f"})), want);
        assert_eq!(
            tool(json!({"name": "f", "input_schema": {"type": "string"}})),
            want
        );
        let object = json!({"name": "f", "input_schema": {"type": "object"}});
        assert_eq!(tool(object.clone()), None);
        let twice = base(json!({"tools": [object.clone(), object]}));
        assert_eq!(twice, Some((400, "tools[1]".into())));
        // An earlier turn's thinking goes to the template as reasoning_content.
        let history = json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"},
                {"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "yo"}]},
            {"role": "user", "content": "and?"}]});
        let mut r = json!({"max_tokens": 8});
        r.as_object_mut()
            .unwrap()
            .extend(history.as_object().unwrap().clone());
        let chat = to_chat(&r).unwrap();
        assert_eq!(
            chat["messages"][1],
            json!({"role": "assistant", "content": "yo", "reasoning_content": "hmm"})
        );
        let no_max = to_chat(&json!({"messages": []})).unwrap_err();
        assert_eq!(no_max.param.as_deref(), Some("max_tokens"));
    }
}
