//! The OpenAI answer shapes both generation routes share, as typed structs: the
//! `id`/`object`/`created`/`model`/`system_fingerprint` head ([`Object`]), `choices` with `usage` (with
//! `prompt_tokens_details.cached_tokens`, always), finish reasons, chat's messages,
//! deltas and tool calls, and the two log-probability formats (chat's `content` list
//! and the legacy completions' parallel arrays); and [`List`], the `/v1/*` list
//! shape. Fields serialize in declaration order, which is the wire order; a field
//! that is `null` on the wire is an `Option` without `skip_serializing_if`, one that
//! is left out has it.

use folio::tokenizer::Tokenizer;
use folio::{FinishReason, TokenLogprob};
use serde::Serialize;
use serde_json::{Map, Value};

/// What every answer object starts with.
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// `fp_` and the model fingerprint's first 12 hex digits ([`system_fingerprint`]).
    pub system_fingerprint: String,
}

/// OpenAI's `system_fingerprint` for a model of fingerprint `fp`: `fp_` and its
/// first 12 hex digits (6 bytes).
pub fn system_fingerprint(fp: &[u8; 16]) -> String {
    let hex: String = fp[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("fp_{hex}")
}

impl Head {
    pub fn new(prefix: &str, model: &str, system_fingerprint: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let created = crate::clock::unix_now();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self {
            id: format!("{prefix}-{created:x}{n:08x}"),
            created,
            model: model.to_string(),
            system_fingerprint: system_fingerprint.to_string(),
        }
    }

    /// `{"id", "object", "created", "model", "system_fingerprint"}` then `body`'s
    /// fields.
    pub fn object<B>(&self, object: &'static str, body: B) -> Object<B> {
        Object {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.system_fingerprint.clone(),
            body,
        }
    }
}

/// An answer object or a stream chunk: the head, then the body's fields.
#[derive(Serialize)]
pub struct Object<B> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    #[serde(flatten)]
    pub body: B,
}

/// `choices`, then `usage`.
#[derive(Serialize)]
pub struct Choices<C> {
    pub choices: Vec<C>,
    /// Left out (`None`: a stream chunk when no usage chunk ends the stream), `null`
    /// (`Some(None)`: a stream chunk when one does, as OpenAI sends it), or the counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

impl<C> Choices<C> {
    /// A whole answer's body.
    pub fn whole(choices: Vec<C>, usage: Usage) -> Self {
        Self {
            choices,
            usage: Some(Some(usage)),
        }
    }

    /// One streamed chunk holding `choice` (with `usage: null` when a usage chunk ends
    /// the stream).
    pub fn chunk(choice: C, include_usage: bool) -> Self {
        Self {
            choices: vec![choice],
            usage: include_usage.then_some(None),
        }
    }

    /// The last chunk of a stream with `include_usage`: no choice, the counts.
    pub fn usage_only(usage: Usage) -> Self {
        Self::whole(Vec::new(), usage)
    }
}

/// A stream's end: the usage chunk when `include_usage` asked for one, else nothing.
pub fn usage_chunk<C>(
    head: &Head,
    object: &'static str,
    include: bool,
    usage: Usage,
) -> Vec<Object<Choices<C>>> {
    if !include {
        return Vec::new();
    }
    vec![head.object(object, Choices::usage_only(usage))]
}

/// Token counts.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptDetails,
    /// OpenAI's predicted outputs (present when the request gave a `prediction`): the
    /// prediction's tokens the output took (as verified drafts), and the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionDetails>,
    /// folio's: tokens speculative decoding drafted and accepted, from any source
    /// (present when any was drafted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<Speculative>,
}

#[derive(Serialize, Debug, Clone, Copy)]
pub struct CompletionDetails {
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

#[derive(Serialize, Debug, Clone, Copy)]
pub struct Speculative {
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
}

impl Usage {
    /// With the drafted and accepted tokens of speculative decoding (none: unchanged).
    pub fn with_drafts(mut self, drafted: usize, accepted: usize) -> Self {
        if drafted > 0 {
            self.speculative = Some(Speculative {
                drafted_tokens: drafted,
                accepted_tokens: accepted,
            });
        }
        self
    }

    /// With OpenAI's predicted-output figures, when the request gave a prediction of
    /// `predicted` tokens, `accepted` of which the output took.
    pub fn with_prediction(mut self, predicted: usize, accepted: usize) -> Self {
        if predicted > 0 {
            self.completion_tokens_details = Some(CompletionDetails {
                accepted_prediction_tokens: accepted,
                rejected_prediction_tokens: predicted.saturating_sub(accepted),
            });
        }
        self
    }
}

#[derive(Serialize, Debug, Clone, Copy)]
pub struct PromptDetails {
    pub cached_tokens: usize,
}

pub fn usage(prompt: usize, completion: usize, cached: usize) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptDetails {
            cached_tokens: cached,
        },
        completion_tokens_details: None,
        speculative: None,
    }
}

/// `{"object": "list", "data": [...]}`.
#[derive(Serialize)]
pub struct List<T> {
    pub object: &'static str,
    pub data: Vec<T>,
}

impl<T> List<T> {
    pub fn new(data: Vec<T>) -> Self {
        Self {
            object: "list",
            data,
        }
    }
}

/// `/v1/embeddings`' answer.
#[derive(Serialize)]
pub struct Embeddings {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

/// One input's embedding, at its place in the request (`index`).
#[derive(Serialize)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingValue,
}

/// An embedding as floats, or as base64 of their little-endian float32 bytes.
#[derive(Serialize)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Float(Vec<f32>),
    Base64(String),
}

/// An embedding's usage: its input tokens (nothing is generated).
#[derive(Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// A legacy completion's choice, whole or as a chunk.
#[derive(Serialize)]
pub struct TextChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A chat completion's choice, whole.
#[derive(Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: Message,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The assistant's message; `tool_calls` only when it made calls (its content is
/// then `null` when no text is left).
#[derive(Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One call in a message.
#[derive(Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A chat completion's choice as a chunk.
#[derive(Serialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// What a chat chunk adds; every field is left out when it adds nothing (`{}` ends
/// a choice).
#[derive(Serialize, Default)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// Left out, `null` (`Some(None)`: the role chunk of an answer with tools), or
    /// text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

impl Delta {
    /// Text for the content.
    pub fn content(text: String) -> Self {
        Self {
            content: Some(Some(text)),
            ..Self::default()
        }
    }

    /// One call's piece.
    pub fn call(call: ToolCallDelta) -> Self {
        Self {
            tool_calls: Some(vec![call]),
            ..Self::default()
        }
    }
}

/// A piece of call `index`: its beginning (`id`, `type`, the name and empty
/// arguments), then more of its arguments (the rest left out).
#[derive(Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

pub fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// A token's text (lossy where it is part of a UTF-8 sequence).
pub fn piece(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&tok.token_bytes(id)).into_owned()
}

/// Chat's log-probabilities: one entry per token.
#[derive(Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprob>,
}

/// Chat's log-probability entry of one token; the entries of its alternatives have
/// no `top_logprobs` of their own. Figures are the engine's `f32` widened to `f64`,
/// the digits the answers have always carried.
#[derive(Serialize)]
pub struct ChatLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<ChatLogprob>>,
}

/// Chat's log-probability entry of one token.
pub fn chat_logprob(tok: &Tokenizer, id: u32, lp: &TokenLogprob) -> ChatLogprob {
    let entry = |id: u32, logprob: f32| ChatLogprob {
        token: piece(tok, id),
        logprob: f64::from(logprob),
        bytes: tok.token_bytes(id),
        top_logprobs: None,
    };
    ChatLogprob {
        top_logprobs: Some(lp.top.iter().map(|&(t, l)| entry(t, l)).collect()),
        ..entry(id, lp.logprob)
    }
}

/// Character offsets into a choice's text, token by token: bytes that end inside a
/// UTF-8 sequence wait for the rest, so every token of one character starts at it.
#[derive(Debug, Clone, Default)]
pub struct Offsets {
    chars: usize,
    partial: Vec<u8>,
}

impl Offsets {
    /// Where text with these bytes starts; then moves past them.
    pub fn advance(&mut self, bytes: &[u8]) -> usize {
        let at = self.chars;
        self.partial.extend_from_slice(bytes);
        match std::str::from_utf8(&self.partial) {
            Ok(s) => {
                self.chars += s.chars().count();
                self.partial.clear();
            }
            Err(e) if e.error_len().is_some() => {
                // Invalid bytes: counted as the replacement characters the text shows.
                self.chars += String::from_utf8_lossy(&self.partial).chars().count();
                self.partial.clear();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.partial[..valid]);
                self.chars += s.chars().count();
                self.partial.drain(..valid);
            }
        }
        at
    }
}

/// The legacy completions' log-probabilities: parallel arrays over tokens. A token
/// without a figure (a prompt's first) has nulls. `top_logprobs` maps each
/// alternative's text to its figure: a map keyed by token text (two alternatives
/// with the same text are one key, as they always were).
#[derive(Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f64>>,
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    pub text_offset: Vec<usize>,
}

/// The legacy completions' log-probabilities, with character offsets into the
/// choice's text (`offsets` carries on from earlier chunks). The first `echoed`
/// tokens are the prompt's, shown as the echoed text has them (special tokens as
/// their text).
pub fn completion_logprobs(
    tok: &Tokenizer,
    tokens: &[(u32, Option<&TokenLogprob>)],
    echoed: usize,
    offsets: &mut Offsets,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs {
        tokens: Vec::with_capacity(tokens.len()),
        token_logprobs: Vec::with_capacity(tokens.len()),
        top_logprobs: Vec::with_capacity(tokens.len()),
        text_offset: Vec::with_capacity(tokens.len()),
    };
    for (i, &(id, lp)) in tokens.iter().enumerate() {
        let mut bytes = tok.token_bytes(id);
        if i < echoed && bytes.is_empty() {
            // A control token: the echoed prompt shows its text.
            bytes = tok.decode_special(&[id]).into_bytes();
        }
        out.text_offset.push(offsets.advance(&bytes));
        out.tokens
            .push(String::from_utf8_lossy(&bytes).into_owned());
        out.token_logprobs.push(lp.map(|l| f64::from(l.logprob)));
        out.top_logprobs.push(lp.map(|l| {
            l.top
                .iter()
                .map(|&(t, v)| (piece(tok, t), Value::from(f64::from(v))))
                .collect()
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The typed shapes write the bytes the `json!` answers they replaced wrote
    /// (same keys, same order, `null`s where they were, figures with the same digits).
    #[test]
    fn typed_shapes_write_the_old_bytes() {
        let head = Head {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            system_fingerprint: "fp_0123456789ab".into(),
        };
        let lp: f32 = -1.234_567_8;
        let chunk = head.object(
            "chat.completion.chunk",
            Choices::chunk(
                ChunkChoice {
                    index: 0,
                    delta: Delta::content("hi".into()),
                    logprobs: Some(ChatLogprobs {
                        content: vec![ChatLogprob {
                            token: "hi".into(),
                            logprob: f64::from(lp),
                            bytes: vec![104, 105],
                            top_logprobs: Some(Vec::new()),
                        }],
                    }),
                    finish_reason: None,
                },
                true,
            ),
        );
        let mut old = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m", "system_fingerprint": "fp_0123456789ab",
            "choices": [{"index": 0, "delta": {"content": "hi"},
                "logprobs": {"content": [{"token": "hi", "logprob": lp, "bytes": [104, 105], "top_logprobs": []}]},
                "finish_reason": null}]});
        old["usage"] = Value::Null;
        assert_eq!(serde_json::to_string(&chunk).unwrap(), old.to_string());
        let role = Delta {
            role: Some("assistant"),
            content: Some(None),
            ..Delta::default()
        };
        assert_eq!(
            serde_json::to_string(&role).unwrap(),
            json!({"role": "assistant", "content": null}).to_string()
        );
        assert_eq!(serde_json::to_string(&Delta::default()).unwrap(), "{}");
        let whole = head.object(
            "text_completion",
            Choices::whole(
                vec![TextChoice {
                    index: 1,
                    text: "x".into(),
                    logprobs: None,
                    finish_reason: Some("length"),
                }],
                usage(3, 2, 1),
            ),
        );
        let old = json!({"id": "chatcmpl-1", "object": "text_completion", "created": 7, "model": "m", "system_fingerprint": "fp_0123456789ab",
            "choices": [{"index": 1, "text": "x", "logprobs": null, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                      "prompt_tokens_details": {"cached_tokens": 1}}});
        assert_eq!(serde_json::to_string(&whole).unwrap(), old.to_string());
        let no_usage = head.object("x", Choices::chunk(1, false));
        assert!(!serde_json::to_string(&no_usage).unwrap().contains("usage"));
    }
}
