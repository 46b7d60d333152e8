//! Tool calls on `/v1/chat/completions`. With `tool_choice` `required` or a named
//! function the output is constrained by a grammar to a valid call of the tools'
//! JSON schemas, so it works on any model: a named function's output is its
//! arguments; `required` is `{"name", "arguments"}` (a list of them with
//! `parallel_tool_calls`). With `auto` the chat template renders the tools and the
//! model's own Hermes-style `<tool_call>{"name", "arguments"}</tool_call>` blocks are
//! parsed out of its text. The answer carries OpenAI's `tool_calls` and
//! `finish_reason: "tool_calls"`. [`extract`] decides the answer of a whole output;
//! streamed, `tool_stream` gives exactly the same answer in pieces (its module doc
//! has the canonical forms of arguments and content).

use crate::answer::{FunctionCall, ToolCall};
use crate::api::{FunctionDef, GenRequest, ToolChoice};
use crate::error::ApiError;
use crate::tool_call::{Call, Mode};
use crate::tool_stream::{block_call, calls_of, minify, CallStream, CLOSE, OPEN};
use folio::grammar::GrammarSpec;
use serde_json::{json, Value};

/// The tools of a request and how they are to be called.
#[derive(Debug, Clone)]
pub struct Tools {
    pub mode: Mode,
    pub defs: Vec<FunctionDef>,
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

/// The answer in a finished output: its calls, and its content. `None` when it holds
/// no call: the content is then the whole output, as it is. With calls the content is
/// the text outside them without its trailing whitespace, `None` when that is empty.
/// The canonical forms are in `tool_stream`'s module doc; that module streams exactly
/// this answer.
///
/// - Named function: one call, whose arguments are the whole output ([`minify`]d).
/// - `required`: the calls [`CallStream`] reads in the output (those whose name was
///   generated: a cut output keeps its begun calls, `finish_reason` says `length`).
/// - `auto`: each `<tool_call>` block, from its tag to the first `</tool_call>` after
///   it (or the end of the output), is a call if [`block_call`] finds one in it, and
///   content (tags and all) if not.
pub fn extract(t: &Tools, text: &str) -> Option<(Vec<Call>, Option<String>)> {
    let (calls, rest) = match &t.mode {
        Mode::Named(name) => {
            let call = Call {
                name: name.clone(),
                arguments: minify(text),
            };
            return Some((vec![call], None));
        }
        Mode::Required { .. } => (calls_of(CallStream::default().push(text)), String::new()),
        Mode::Auto => {
            let (mut calls, mut rest, mut s) = (Vec::new(), String::new(), text);
            while let Some(start) = s.find(OPEN) {
                rest.push_str(&s[..start]);
                let body = &s[start + OPEN.len()..];
                let (inner, after) = match body.find(CLOSE) {
                    Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
                    None => (body, ""),
                };
                match block_call(inner) {
                    Some(c) => calls.push(c),
                    None => rest.push_str(&s[start..s.len() - after.len()]),
                }
                s = after;
            }
            rest.push_str(s);
            (calls, rest)
        }
    };
    if calls.is_empty() {
        return None;
    }
    let rest = rest.trim_end();
    Some((calls, (!rest.is_empty()).then(|| rest.to_string())))
}

/// OpenAI's `tool_calls` list; ids are `call_<answer id>_<choice>_<k>`.
pub fn tool_calls(calls: &[Call], id: &str, choice: usize) -> Vec<ToolCall> {
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| ToolCall {
            id: format!("call_{id}_{choice}_{k}"),
            kind: "function",
            function: FunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One tool, `get_weather`, called as `mode` says.
    pub(crate) fn tools(mode: Mode) -> Tools {
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
