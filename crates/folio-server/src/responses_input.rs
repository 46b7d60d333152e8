//! A Responses API request (`POST /v1/responses`) read into what the chat path runs:
//! the input as chat messages, the chat request's other fields, and what the answer
//! repeats. Every field of OpenAI's request schema is handled one way or another:
//!
//! | field | folio |
//! |---|---|
//! | `model` | accepted; the one model is served whatever the name |
//! | `input` | a string (one user message) or a list of items: messages (`role` `user`, `assistant`, `system`, `developer`; content a string or `input_text` / `output_text` parts), `function_call` and `function_call_output`; images, files, reasoning and item references are a 400 |
//! | `instructions` | a system message first; as OpenAI says, not carried over to a continuation |
//! | `max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls`, `stream` | implemented |
//! | `tools` (`function` tools), `tool_choice` (`auto`, `none`, `required`, a named function) | implemented, as on chat; other tool types are a 400 naming them |
//! | `text.format` (`text`, `json_object`, `json_schema`) | implemented (grammar-constrained); `text.verbosity` other than `medium` a 400 |
//! | `store` | implemented (default true): the response is kept as a context |
//! | `previous_response_id` | implemented: a fork of the stored response's context |
//! | `metadata` | kept and repeated in the answer |
//! | `stream_options` | accepted (`include_obfuscation`: there is no obfuscation padding) |
//! | `user`, `safety_identifier`, `prompt_cache_key`, `prompt_cache_retention` | accepted, ignored (abuse-monitoring ids; folio's prefix cache needs no key) |
//! | `service_tier` | `auto` and `default` accepted; others a 400 |
//! | `truncation` | `disabled` accepted; `auto` a 400 (a conversation longer than the window is an error, never cut silently) |
//! | `background` | `false` accepted; `true` a 400 |
//! | `include` | an empty list accepted; anything else a 400 |
//! | `reasoning` | `null` or `{}` accepted; an effort or summary a 400 |
//! | `top_logprobs`, `max_tool_calls`, `conversation`, `prompt`, `context_management`, `moderation`, `image`, `access_programs`, `background_options`, `prompt_cache_options` | a 400 naming the field |
//! | `seed`, `stop`, `top_k`, `min_p`, `presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logit_bias`, `ignore_eos`, `cache_salt` | folio's extensions, as on chat |
//!
//! Fields outside the schema are ignored, as on chat.

use crate::api::GenRequest;
use crate::error::ApiError;
use serde_json::{json, Map, Value};

/// A request, read.
pub struct Asked {
    /// The input as chat messages.
    pub input: Vec<Value>,
    pub instructions: Option<String>,
    /// The chat completion request's fields, `messages` aside.
    pub chat: Map<String, Value>,
    pub store: bool,
    pub stream: bool,
    pub previous: Option<String>,
    /// What the answer repeats of the request (`tools`, `text`, `metadata`...).
    pub echo: Map<String, Value>,
}

impl Asked {
    /// The chat completion request for this input after `history` (the chain's
    /// conversation so far; empty for a new one), `instructions` first.
    pub fn chat_request(&self, history: &[Value]) -> Result<GenRequest, ApiError> {
        let mut messages = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.extend(history.iter().cloned());
        messages.extend(self.input.iter().cloned());
        let mut chat = self.chat.clone();
        chat.insert("messages".into(), Value::Array(messages));
        let bytes =
            serde_json::to_vec(&Value::Object(chat)).map_err(|e| bad("input", e.to_string()))?;
        crate::body::parse(&bytes).map_err(renamed)
    }
}

/// An error of the chat path with the field named as this route's request names it
/// (`max_output_tokens`, `input`, `text.format`, `tools[i].name`...).
pub fn renamed(mut e: ApiError) -> ApiError {
    let Some(p) = e.param.take() else {
        return e;
    };
    let ours = if p == "max_tokens" || p == "max_completion_tokens" {
        "max_output_tokens".to_string()
    } else if p == "prompt" || p.starts_with("messages") {
        "input".to_string()
    } else if let Some(rest) = p.strip_prefix("response_format") {
        let rest = rest.strip_prefix(".json_schema").unwrap_or(rest);
        format!("text.format{rest}")
    } else if let Some(rest) = p.strip_prefix("tool_choice.function") {
        format!("tool_choice{rest}")
    } else if p.starts_with("tools[") {
        p.replacen(".function", "", 1)
    } else {
        p.clone()
    };
    if ours != p {
        if let Some(rest) = e.message.strip_prefix(&format!("{p}: ")) {
            e.message = format!("{ours}: {rest}");
        }
    }
    e.param = Some(ours);
    e
}

fn bad(field: impl Into<String>, why: impl Into<String>) -> ApiError {
    ApiError::invalid(field, why)
}

/// Fields refused whatever their value (`null` is the field left out).
const REFUSED: [(&str, &str); 10] = [
    (
        "top_logprobs",
        "log-probabilities are not offered on this route: use /v1/chat/completions",
    ),
    (
        "max_tool_calls",
        "not supported: limit the calls with tool_choice",
    ),
    (
        "conversation",
        "conversations are not supported: chain responses with previous_response_id",
    ),
    ("prompt", "prompt templates are not supported: send input"),
    ("context_management", "not supported"),
    (
        "moderation",
        "not supported: folio runs no moderation model",
    ),
    ("image", "not supported: no image generation"),
    ("access_programs", "not supported"),
    (
        "background_options",
        "background responses are not supported",
    ),
    (
        "prompt_cache_options",
        "not supported: folio's prefix cache is automatic",
    ),
];

/// folio's sampling extensions, passed to the chat path as they are.
const EXTENSIONS: [&str; 10] = [
    "seed",
    "stop",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "cache_salt",
];

/// Reads request `r`.
pub fn read(r: &Value) -> Result<Asked, ApiError> {
    let r = r
        .as_object()
        .ok_or_else(|| bad("body", "not a JSON object"))?;
    let get = |k: &str| r.get(k).filter(|v| !v.is_null());
    policy(&get)?;
    let input = match get("input") {
        None => return Err(bad("input", "input is required")),
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items_of(items)?,
        Some(_) => return Err(bad("input", "a string or a list of input items")),
    };
    let instructions = match get("instructions") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("instructions", "a string")),
    };
    let flag = |k: &str, default: bool| match get(k) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(k, "true or false")),
    };
    let store = flag("store", true)?;
    let stream = flag("stream", false)?;
    let previous = match get("previous_response_id") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("previous_response_id", "a response id")),
    };
    types(&get)?;
    let mut chat = Map::new();
    for (from, to) in [
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ]
    .into_iter()
    .chain(EXTENSIONS.map(|k| (k, k)))
    {
        if let Some(v) = get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    let mut echo = Map::new();
    if let Some(t) = get("tools") {
        chat.insert("tools".into(), tools_of(t)?);
        echo.insert("tools".into(), t.clone());
    }
    if let Some(c) = get("tool_choice") {
        chat.insert("tool_choice".into(), choice_of(c)?);
        echo.insert("tool_choice".into(), c.clone());
    }
    if let Some(t) = get("text") {
        if let Some(f) = text_format(t)? {
            chat.insert("response_format".into(), f);
        }
        echo.insert("text".into(), t.clone());
    }
    if let Some(m) = get("metadata") {
        if !m.is_object() {
            return Err(bad("metadata", "an object of strings"));
        }
        echo.insert("metadata".into(), m.clone());
    }
    for k in [
        "max_output_tokens",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "user",
        "safety_identifier",
        "prompt_cache_key",
    ] {
        if let Some(v) = get(k) {
            echo.insert(k.into(), v.clone());
        }
    }
    Ok(Asked {
        input,
        instructions,
        chat,
        store,
        stream,
        previous,
        echo,
    })
}

/// The types of the fields read here (the chat path checks the sampling ones again,
/// under their chat names).
fn types<'a>(get: &impl Fn(&str) -> Option<&'a Value>) -> Result<(), ApiError> {
    if let Some(v) = get("max_output_tokens") {
        if !v.is_u64() {
            return Err(bad("max_output_tokens", "a non-negative integer"));
        }
    }
    for k in ["temperature", "top_p"] {
        if get(k).is_some_and(|v| !v.is_number()) {
            return Err(bad(k, "a number"));
        }
    }
    for (k, ok) in [
        (
            "parallel_tool_calls",
            Value::is_boolean as fn(&Value) -> bool,
        ),
        ("text", Value::is_object),
        ("metadata", Value::is_object),
        ("cache_salt", Value::is_string),
        ("user", Value::is_string),
    ] {
        if get(k).is_some_and(|v| !ok(v)) {
            return Err(bad(k, "of the wrong type"));
        }
    }
    Ok(())
}

/// The fields accepted only with some values, and the ones refused.
fn policy<'a>(get: &impl Fn(&str) -> Option<&'a Value>) -> Result<(), ApiError> {
    for (k, why) in REFUSED {
        if get(k).is_some() {
            return Err(bad(k, why));
        }
    }
    let is = |k: &str, ok: &[Value]| get(k).is_none_or(|v| ok.contains(v));
    if !is("service_tier", &[json!("auto"), json!("default")]) {
        return Err(bad("service_tier", "one tier is served: auto or default"));
    }
    if !is("truncation", &[json!("disabled")]) {
        return Err(bad(
            "truncation",
            "only \"disabled\": a conversation longer than the window is an error",
        ));
    }
    if !is("background", &[json!(false)]) {
        return Err(bad("background", "background responses are not supported"));
    }
    if !is("include", &[json!([])]) {
        return Err(bad("include", "no extra output data is offered"));
    }
    let reasoning_empty = get("reasoning").is_none_or(|v| {
        v.as_object()
            .is_some_and(|o| o.values().all(Value::is_null))
    });
    if !reasoning_empty {
        return Err(bad(
            "reasoning",
            "folio does not control a model's reasoning",
        ));
    }
    Ok(())
}

/// The input items as chat messages; consecutive function calls make one assistant
/// message with several tool calls.
fn items_of(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        let kind = match item.get("type") {
            None | Some(Value::Null) => None,
            Some(Value::String(k)) => Some(k.as_str()),
            Some(_) => return Err(bad(format!("{field}.type"), "a string")),
        };
        match kind {
            None | Some("message") => out.push(message_of(&field, item)?),
            Some("function_call") => {
                let s = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{field}.{k}"), "required: a string"))
                };
                let call = json!({"id": s("call_id")?, "type": "function",
                    "function": {"name": s("name")?, "arguments": s("arguments")?}});
                let last = out.last_mut().filter(|m| {
                    m["role"] == "assistant" && m.get("tool_calls").is_some() && m["content"].is_null()
                });
                match last.and_then(|m| m["tool_calls"].as_array_mut()) {
                    Some(calls) => calls.push(call),
                    None => out.push(
                        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                    ),
                }
            }
            Some("function_call_output") => {
                let id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{field}.call_id"), "required: a string"))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => parts_text(&format!("{field}.output"), v)?,
                    _ => return Err(bad(format!("{field}.output"), "required: a string")),
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            Some(other) => {
                return Err(bad(
                    format!("{field}.type"),
                    format!("input item type {other:?} is not supported: messages, function_call and function_call_output are"),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(bad("input", "the input is empty"));
    }
    Ok(out)
}

/// A message item as a chat message.
fn message_of(field: &str, item: &Value) -> Result<Value, ApiError> {
    let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
        bad(
            format!("{field}.role"),
            "required: user, assistant, system or developer",
        )
    })?;
    if !matches!(role, "user" | "assistant" | "system" | "developer") {
        return Err(bad(
            format!("{field}.role"),
            format!("role {role:?}: user, assistant, system or developer"),
        ));
    }
    let content = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Array(_)) => parts_text(&format!("{field}.content"), v)?,
        _ => {
            return Err(bad(
                format!("{field}.content"),
                "required: a string or a list of content parts",
            ))
        }
    };
    Ok(json!({"role": role, "content": content}))
}

/// The text of a list of text parts (`input_text`, `output_text`, `text`).
fn parts_text(field: &str, v: &Value) -> Result<String, ApiError> {
    let mut out = String::new();
    for (k, p) in v.as_array().into_iter().flatten().enumerate() {
        let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, p.get("text")) {
            ("input_text" | "output_text" | "text", Some(Value::String(t))) => out.push_str(t),
            // An earlier answer's refusal, replayed: its text is what was said.
            ("refusal", _) => match p.get("refusal") {
                Some(Value::String(t)) => out.push_str(t),
                _ => return Err(bad(format!("{field}[{k}].refusal"), "a string")),
            },
            ("input_image" | "input_file" | "input_audio", _) => {
                return Err(bad(
                    format!("{field}[{k}]"),
                    format!("{kind} is not supported: the model reads text only"),
                ))
            }
            _ => {
                return Err(bad(
                    format!("{field}[{k}]"),
                    "a content part is {\"type\": \"input_text\", \"text\": ...}",
                ))
            }
        }
    }
    Ok(out)
}

/// Responses API tools (`{"type": "function", "name", ...}`) as chat tools.
fn tools_of(t: &Value) -> Result<Value, ApiError> {
    let list = t
        .as_array()
        .ok_or_else(|| bad("tools", "a list of tools"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                let other = other.map_or("(none)".to_string(), |t| format!("{t:?}"));
                return Err(bad(
                    format!("tools[{i}].type"),
                    format!("tool type {other}: only \"function\" tools are supported"),
                ));
            }
        }
        if !tool.get("name").is_some_and(Value::is_string) {
            return Err(bad(format!("tools[{i}].name"), "a function needs a name"));
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = tool.get(k).filter(|v| !v.is_null()) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// A Responses API `tool_choice` as chat's.
fn choice_of(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name")) {
            (Some("function"), Some(Value::String(name))) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            _ => Err(bad(
                "tool_choice",
                "auto, none, required, or {\"type\": \"function\", \"name\": ...}",
            )),
        },
        _ => Err(bad("tool_choice", "a string or an object")),
    }
}

/// `text.format` as chat's `response_format` (none for plain text).
fn text_format(t: &Value) -> Result<Option<Value>, ApiError> {
    if let Some(v) = t.get("verbosity").filter(|v| !v.is_null()) {
        if v != "medium" {
            return Err(bad(
                "text.verbosity",
                "only \"medium\": folio has no length control of that kind",
            ));
        }
    }
    let Some(f) = t.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = f
                .get("schema")
                .ok_or_else(|| bad("text.format.schema", "required for json_schema"))?;
            let mut js = json!({"schema": schema});
            for k in ["name", "strict"] {
                if let Some(v) = f.get(k) {
                    js[k] = v.clone();
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(bad("text.format.type", "text, json_object or json_schema")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_input_is_one_user_message() {
        let a = read(&json!({"input": "hi", "instructions": "be brief"})).unwrap();
        assert_eq!(a.input, vec![json!({"role": "user", "content": "hi"})]);
        assert_eq!(a.instructions.as_deref(), Some("be brief"));
        assert!(a.store && !a.stream && a.previous.is_none());
    }

    #[test]
    fn items_become_chat_messages_with_calls_merged() {
        let a = read(&json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"a\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]}))
        .unwrap();
        assert_eq!(a.input.len(), 3);
        assert_eq!(a.input[1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            a.input[1]["tool_calls"][1]["function"]["arguments"],
            "{\"a\":1}"
        );
        assert_eq!(
            a.input[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"})
        );
    }

    #[test]
    fn tools_choice_and_format_take_chat_shapes() {
        let a = read(&json!({"input": "x",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "max_output_tokens": 9}))
        .unwrap();
        assert_eq!(a.chat["tools"][0]["function"]["name"], "f");
        assert_eq!(a.chat["tool_choice"]["function"]["name"], "f");
        assert_eq!(a.chat["response_format"]["json_schema"]["name"], "s");
        assert_eq!(a.chat["max_completion_tokens"], 9);
    }

    #[test]
    fn refused_and_bad_fields_are_named() {
        for (body, param) in [
            (json!({}), "input"),
            (json!({"input": 3}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": "x", "top_logprobs": 2}), "top_logprobs"),
            (json!({"input": "x", "conversation": "c"}), "conversation"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (json!({"input": "x", "include": ["x"]}), "include"),
            (
                json!({"input": "x", "reasoning": {"effort": "high"}}),
                "reasoning",
            ),
            (
                json!({"input": "x", "service_tier": "flex"}),
                "service_tier",
            ),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": "x", "text": {"verbosity": "low"}}),
                "text.verbosity",
            ),
            (json!({"input": [{"type": "reasoning"}]}), "input[0].type"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
        ] {
            let e = read(&body)
                .err()
                .unwrap_or_else(|| panic!("{body} was accepted"));
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        let ok = json!({"input": "x", "truncation": "disabled", "background": false,
            "include": [], "service_tier": "auto", "reasoning": {}, "user": "u",
            "store": false, "top_logprobs": null,
            "stream_options": {"include_obfuscation": false}});
        assert!(read(&ok).is_ok(), "{ok}");
    }
}
