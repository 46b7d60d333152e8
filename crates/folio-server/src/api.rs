//! The OpenAI request bodies as sent on the wire: one [`GenRequest`] for both
//! `/v1/completions` and `/v1/chat/completions` (each route takes the fields it
//! knows), with the extensions llama.cpp's and vLLM's users send (`top_k`, `min_p`,
//! `repetition_penalty` / `repeat_penalty`, `ignore_eos`, `cache_salt`), and every
//! other field of OpenAI's two request schemas, so that none is dropped unseen.
//! Only the shapes live here; [`crate::params`] turns them into a
//! [`folio::Request`] and says, field by field, what folio does with each.

use serde::Deserialize;

/// A completion or chat completion request.
#[derive(Debug, Deserialize, Default)]
pub struct GenRequest {
    /// Checked for its type only: the server serves one model, whatever the name.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// Completions: the prompt(s).
    pub prompt: Option<PromptInput>,
    /// Chat: the conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Chat (vLLM's name): the last message, an assistant's, is continued (its text
    /// the start of the answer, the turn left open) rather than answered.
    pub continue_final_message: Option<bool>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<u64>,
    pub stop: Option<StopInput>,
    pub seed: Option<serde_json::Number>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// vLLM's name; llama.cpp's `repeat_penalty` is taken too.
    pub repetition_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    /// folio's: `false` keeps this request out of speculative decoding (the output is
    /// the same either way).
    pub speculative: Option<bool>,
    /// Chat: a boolean; completions: how many alternatives per token.
    pub logprobs: Option<LogprobsInput>,
    /// Chat: alternatives per token (with `logprobs: true`).
    pub top_logprobs: Option<u64>,
    /// Completions: the prompt comes back in front of the text (with `logprobs`, its
    /// tokens' log-probabilities too).
    pub echo: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Requests with different salts never share KV pages.
    pub cache_salt: Option<String>,
    /// OpenAI's structured output: `{"type": "text" | "json_object" | "json_schema"}`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM's and llama.cpp's ways of saying the same (and more).
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub json_schema: Option<serde_json::Value>,
    /// Chat: functions the model may call, and how it must.
    pub tools: Option<Vec<ToolDef>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// Token id (as a string) → bias in -100..=100, added to the logits.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    // The rest of OpenAI's request fields: accepted and ignored, or refused with a
    // 400 naming them (the table is in `crate::params`).
    #[allow(dead_code)] // Accepted and ignored: checked for its type only.
    pub user: Option<String>,
    #[allow(dead_code)] // Accepted and ignored: checked for its type only.
    pub safety_identifier: Option<String>,
    #[allow(dead_code)] // Accepted and ignored: checked for its type only.
    pub prompt_cache_key: Option<String>,
    #[allow(dead_code)] // Accepted and ignored: checked for its type only.
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub service_tier: Option<String>,
    pub store: Option<bool>,
    /// OpenAI's predicted outputs: `{"type": "content", "content": text or text parts}`.
    pub prediction: Option<serde_json::Map<String, serde_json::Value>>,
    pub reasoning_effort: Option<String>,
    pub verbosity: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub audio: Option<serde_json::Value>,
    pub web_search_options: Option<serde_json::Value>,
    pub functions: Option<serde_json::Value>,
    pub function_call: Option<serde_json::Value>,
    pub best_of: Option<u64>,
    pub suffix: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ToolDef {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Deserialize, serde::Serialize, Clone)]
pub struct FunctionDef {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
}

/// `"none" | "auto" | "required"`, or `{"type": "function", "function": {"name"}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named { function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    /// Checked for its type only.
    #[allow(dead_code)]
    pub name: Option<String>,
    pub schema: Option<serde_json::Value>,
    /// Checked for its type only: the schema is always enforced.
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs` (one of its fields).
#[derive(Debug, Deserialize)]
pub struct StructuredOutputs {
    pub json: Option<serde_json::Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    pub grammar: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(untagged)]
pub enum LogprobsInput {
    Flag(bool),
    Count(u64),
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// One chat message. `content` may be a string, a list of parts, or absent. Its other
/// fields (`tool_calls` on an assistant message, `tool_call_id` and `name` on a tool
/// result) go to the chat template as they are.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: only text parts carry anything this server can use.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// `/tokenize`: llama.cpp's `content` or vLLM's `prompt`, or chat `messages`.
#[derive(Debug, Deserialize, Default)]
pub struct TokenizeRequest {
    pub content: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    /// Add the BOS the model wants (default true; false for chat messages).
    pub add_special: Option<bool>,
    /// With `messages`: end with the template's start of the assistant's turn
    /// (default true, as vLLM's).
    pub add_generation_prompt: Option<bool>,
    /// With `messages` (vLLM's): the last message, an assistant's, left open to be
    /// continued, as chat completions' field of that name renders it.
    pub continue_final_message: Option<bool>,
    /// Also return each token's text.
    pub with_pieces: Option<bool>,
}

/// `/detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}
