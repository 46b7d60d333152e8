//! Tool calls on `/v1/chat/completions`. With `tool_choice` `required` or a named
//! function the output is constrained by a grammar to a valid call of the tools'
//! JSON schemas, so it works on any model: a named function's output is its
//! arguments; `required` is `{"name", "arguments"}` (a list of them with
//! `parallel_tool_calls`). With `auto` the chat template renders the tools and the
//! model's own Hermes-style `<tool_call>{"name", "arguments"}</tool_call>` blocks are
//! parsed out of its text. The answer carries OpenAI's `tool_calls` and
//! `finish_reason: "tool_calls"`. Streamed, a named call's arguments and `required`
//! calls (`CallStream`: each name once whole, then its arguments) go out as they are
//! generated; `auto` output is held and parsed at the end.

use crate::api::{FunctionDef, GenRequest, ToolChoice};
use crate::error::ApiError;
use folio::grammar::GrammarSpec;
use serde_json::{json, Value};

/// How the model is to call tools.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Must call this function: the output is its arguments.
    Named(String),
    /// Must call one of the tools (several with `parallel`).
    Required { parallel: bool },
    /// May call them, in its own syntax.
    Auto,
}

/// The tools of a request and how they are to be called.
#[derive(Debug, Clone)]
pub struct Tools {
    pub mode: Mode,
    pub defs: Vec<FunctionDef>,
}

/// One call found in an output.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON string (OpenAI's shape).
    pub arguments: String,
}

/// Reads `tools` / `tool_choice` / `parallel_tool_calls`; returns the tools (none
/// when absent or `tool_choice` is `none`) and the grammar a forced call needs.
pub fn plan(r: &mut GenRequest) -> Result<Option<(Tools, Option<GrammarSpec>)>, ApiError> {
    let defs: Vec<FunctionDef> = match r.tools.take() {
        None => {
            if r.tool_choice.is_some()
                && !matches!(&r.tool_choice, Some(ToolChoice::Mode(m)) if m == "none")
            {
                return Err(ApiError::invalid("tool_choice", "tool_choice needs tools"));
            }
            return Ok(None);
        }
        Some(t) => t
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if t.kind != "function" {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].type"),
                        format!(
                            "tool type {:?}: only \"function\" tools are supported",
                            t.kind
                        ),
                    ));
                }
                if t.function.name.is_empty() {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].function.name"),
                        "a function needs a name",
                    ));
                }
                Ok(t.function)
            })
            .collect::<Result<_, _>>()?,
    };
    if defs.is_empty() {
        return Ok(None);
    }
    let parallel = r.parallel_tool_calls.unwrap_or(true);
    let mode = match r.tool_choice.take() {
        None => Mode::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => Mode::Auto,
            "required" => Mode::Required { parallel },
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice {other:?}: use none, auto, required or a named function"),
                ))
            }
        },
        Some(ToolChoice::Named { function }) => {
            if !defs.iter().any(|d| d.name == function.name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice names {:?}, which is not among the tools",
                        function.name
                    ),
                ));
            }
            Mode::Named(function.name)
        }
    };
    let params = |d: &FunctionDef| {
        d.parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object"}))
    };
    let grammar = match &mode {
        Mode::Auto => None,
        Mode::Named(name) => {
            let schema = defs
                .iter()
                .find(|d| &d.name == name)
                .map_or_else(|| json!({"type": "object"}), params);
            Some(GrammarSpec::JsonSchema(schema))
        }
        Mode::Required { parallel } => {
            let one: Vec<Value> = defs
                .iter()
                .map(|d| {
                    json!({"type": "object",
                           "properties": {"name": {"const": d.name}, "arguments": params(d)},
                           "required": ["name", "arguments"], "additionalProperties": false})
                })
                .collect();
            let call = json!({"anyOf": one});
            Some(GrammarSpec::JsonSchema(if *parallel {
                json!({"type": "array", "items": call, "minItems": 1})
            } else {
                call
            }))
        }
    };
    Ok(Some((Tools { mode, defs }, grammar)))
}

/// The tools as the chat template sees them (`tools` in its context).
pub fn template_tools(t: &Tools) -> Value {
    Value::Array(
        t.defs
            .iter()
            .map(|d| json!({"type": "function", "function": d}))
            .collect(),
    )
}

fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").cloned().unwrap_or(json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(Call { name, arguments })
}

/// The calls in a finished output, and the text left beside them (None when the
/// output is no call at all).
pub fn extract(t: &Tools, text: &str) -> Option<(Vec<Call>, Option<String>)> {
    match &t.mode {
        Mode::Named(name) => Some((
            vec![Call {
                name: name.clone(),
                arguments: text.trim().to_string(),
            }],
            None,
        )),
        Mode::Required { .. } => {
            let v: Value = serde_json::from_str(text.trim()).ok()?;
            let calls: Vec<Call> = match &v {
                Value::Array(a) => a.iter().filter_map(call_of).collect(),
                other => call_of(other).into_iter().collect(),
            };
            (!calls.is_empty()).then_some((calls, None))
        }
        Mode::Auto => {
            let (mut calls, mut rest, mut s) = (Vec::new(), String::new(), text);
            while let Some(start) = s.find("<tool_call>") {
                rest.push_str(&s[..start]);
                let body = &s[start + "<tool_call>".len()..];
                let (inner, after) = match body.find("</tool_call>") {
                    Some(end) => (&body[..end], &body[end + "</tool_call>".len()..]),
                    None => (body, ""),
                };
                match serde_json::from_str::<Value>(inner.trim())
                    .ok()
                    .as_ref()
                    .and_then(call_of)
                {
                    Some(c) => calls.push(c),
                    None => rest.push_str(&s[start..s.len() - after.len()]),
                }
                s = after;
            }
            rest.push_str(s);
            if calls.is_empty() {
                return None;
            }
            let rest = rest.trim();
            Some((calls, (!rest.is_empty()).then(|| rest.to_string())))
        }
    }
}

/// OpenAI's `tool_calls` list; ids are `call_<answer id>_<choice>_<k>`.
pub fn calls_json(calls: &[Call], id: &str, choice: usize) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                json!({"id": format!("call_{id}_{choice}_{k}"), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

/// What the streamed output of a `required` call has revealed.
#[derive(Debug, Clone, PartialEq)]
pub enum Reveal {
    /// Call `k` has begun: its name is whole.
    Begin { k: usize, name: String },
    /// More of call `k`'s arguments, as raw JSON text.
    Args { k: usize, text: String },
}

/// Follows the grammar-constrained JSON of `required` calls (`{"name", "arguments"}`,
/// or a list of them) as it streams, so each call's name goes out once it is whole and
/// its arguments as they are generated. The grammar guarantees the shape; this only
/// tracks strings and nesting.
#[derive(Debug, Default)]
pub struct CallStream {
    /// Nesting depth of objects and arrays outside the arguments.
    depth: usize,
    /// The depth inside a call object (1 for one call, 2 in a list); 0 until known.
    call_depth: usize,
    calls: usize,
    /// A string at call level (a key or the name) being read, raw.
    string: Option<String>,
    escape: bool,
    /// The last key read at call level.
    key: String,
    /// Inside the arguments value: its own depth, and whether in a string there.
    args: Option<(usize, bool)>,
    /// After `"arguments":`, waiting for the value's first character.
    args_next: bool,
}

impl CallStream {
    /// Feeds more output; returns what it reveals, in order.
    pub fn push(&mut self, text: &str) -> Vec<Reveal> {
        let mut out: Vec<Reveal> = Vec::new();
        let mut args = String::new();
        for ch in text.chars() {
            if let Some((depth, in_str)) = self.args.as_mut() {
                let ends = match (*in_str, ch) {
                    (true, _) if self.escape => {
                        self.escape = false;
                        false
                    }
                    (true, '\\') => {
                        self.escape = true;
                        false
                    }
                    (true, '"') => {
                        *in_str = false;
                        *depth == 0
                    }
                    (true, _) => false,
                    (false, '"') => {
                        *in_str = true;
                        false
                    }
                    (false, '{' | '[') => {
                        *depth += 1;
                        false
                    }
                    (false, '}' | ']') if *depth == 0 => {
                        // A bare value ends where its call object does.
                        self.args = None;
                        Self::flush(&mut out, self.calls, &mut args);
                        self.close();
                        continue;
                    }
                    (false, '}' | ']') => {
                        *depth -= 1;
                        *depth == 0
                    }
                    (false, ',') if *depth == 0 => {
                        self.args = None;
                        Self::flush(&mut out, self.calls, &mut args);
                        continue;
                    }
                    _ => false,
                };
                args.push(ch);
                if ends {
                    self.args = None;
                    Self::flush(&mut out, self.calls, &mut args);
                }
                continue;
            }
            if let Some(raw) = self.string.as_mut() {
                raw.push(ch);
                if self.escape {
                    self.escape = false;
                } else if ch == '\\' {
                    self.escape = true;
                } else if ch == '"' {
                    let raw = self.string.take().unwrap_or_default();
                    let value: String = serde_json::from_str(&raw).unwrap_or_default();
                    if self.key == "name" {
                        out.push(Reveal::Begin {
                            k: self.calls,
                            name: value,
                        });
                        self.key.clear();
                    } else {
                        self.key = value;
                    }
                }
                continue;
            }
            if self.args_next && !ch.is_whitespace() {
                self.args_next = false;
                self.args = Some((0, false));
                // Re-read this character as the value's first.
                out.extend(self.push(&ch.to_string()));
                continue;
            }
            match ch {
                '{' | '[' => {
                    self.depth += 1;
                    if self.call_depth == 0 {
                        self.call_depth = if ch == '[' { 2 } else { 1 };
                    }
                }
                '}' | ']' => self.close(),
                '"' if self.depth == self.call_depth => self.string = Some("\"".into()),
                ':' if self.depth == self.call_depth && self.key == "arguments" => {
                    self.args_next = true;
                    self.key.clear();
                }
                _ => {}
            }
        }
        Self::flush(&mut out, self.calls, &mut args);
        out
    }

    /// A `}` or `]` outside the arguments: a call object ends at call level.
    fn close(&mut self) {
        if self.depth == self.call_depth {
            self.calls += 1;
        }
        self.depth = self.depth.saturating_sub(1);
    }

    fn flush(out: &mut Vec<Reveal>, k: usize, args: &mut String) {
        if !args.is_empty() {
            out.push(Reveal::Args {
                k,
                text: std::mem::take(args),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(mode: Mode) -> Tools {
        Tools {
            mode,
            defs: vec![FunctionDef {
                name: "get_weather".into(),
                description: None,
                parameters: None,
            }],
        }
    }

    #[test]
    fn hermes_blocks_are_parsed_out_of_text() {
        let t = tools(Mode::Auto);
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (calls, rest) = extract(&t, text).unwrap();
        assert_eq!(
            calls,
            [Call {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            }]
        );
        assert_eq!(rest.as_deref(), Some("Let me check."));
        assert!(extract(&t, "no calls here").is_none());
        assert!(extract(&t, "<tool_call>not json</tool_call>").is_none());
    }

    /// Streamed in pieces of any size, the calls' names and arguments add up to what
    /// `extract` finds in the whole output.
    #[test]
    fn required_calls_stream_as_they_are_generated() {
        let t = tools(Mode::Required { parallel: true });
        for text in [
            r#"{"name":"get_weather","arguments":{"city":"Pa\"ris}","n":[1,{"a":2}]}}"#,
            r#"[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_weather","arguments":{}}]"#,
            r#"{"name": "get_weather", "arguments": 42}"#,
            r#"[ {"arguments": "x,}", "name": "get_weather"} ]"#,
        ] {
            let (want, _) = extract(&t, text).unwrap();
            for size in [1, 2, 3, 7, 1000] {
                let mut s = CallStream::default();
                let chars: Vec<char> = text.chars().collect();
                let mut got: Vec<Call> = Vec::new();
                let mut args: Vec<String> = Vec::new();
                for piece in chars.chunks(size) {
                    for r in s.push(&piece.iter().collect::<String>()) {
                        match r {
                            Reveal::Begin { k, name } => {
                                assert_eq!(k, got.len(), "{text}");
                                got.push(Call {
                                    name,
                                    arguments: String::new(),
                                });
                            }
                            Reveal::Args { k, text } => {
                                args.resize(args.len().max(k + 1), String::new());
                                args[k].push_str(&text);
                            }
                        }
                    }
                }
                assert_eq!(got.len(), want.len(), "{text} in pieces of {size}");
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.name, w.name);
                    let a: Value = serde_json::from_str(&args[k]).unwrap();
                    let b: Value = serde_json::from_str(&w.arguments).unwrap_or(json!(w.arguments));
                    assert_eq!(a, b, "{text} in pieces of {size}: call {k}");
                }
            }
        }
    }

    #[test]
    fn required_calls_parse_one_or_a_list() {
        let t = tools(Mode::Required { parallel: true });
        let (calls, _) = extract(
            &t,
            r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}]"#,
        )
        .unwrap();
        assert_eq!(calls.len(), 1);
        let (calls, _) = extract(&t, r#"{"name": "get_weather", "arguments": {}}"#).unwrap();
        assert_eq!(calls[0].arguments, "{}");
    }
}
