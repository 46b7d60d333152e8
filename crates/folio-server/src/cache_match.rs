//! `POST /v1/cache/match`: how many leading tokens of a prompt this replica's prefix
//! cache holds, read without computing or reserving anything, for a router choosing the
//! replica a request goes to (issue 41). The body names the prompt as `/tokenize` does
//! (`prompt` or `content` text, or chat `messages` rendered with the model's template),
//! or as `tokens`, and optionally the `cache_salt` the request will carry: a salted
//! request only ever shares its own tenant's pages, and the answer counts those.
//!
//! The count is what the pool holds; a request then reports as cached that many tokens
//! but never its last one, whose logits it computes. The count is a snapshot: pages may
//! be evicted or added before the request arrives.
//! `tiers` splits it: `memory`, the tokens before the first page only the disk tier
//! holds (`--kv-disk`), and `disk`, those from there on (read back when the request
//! comes).

use crate::api::{ChatMessage, TokenizeRequest};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::misc::tokenize_request;
use crate::offload::blocking;
use crate::params::check_salt;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The request: one of `prompt`, `content`, `messages` or `tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheMatchRequest {
    prompt: Option<String>,
    content: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    tokens: Option<Vec<u32>>,
    /// Add the BOS the model wants to text (default true; false for messages).
    add_special: Option<bool>,
    cache_salt: Option<String>,
}

/// The answer.
#[derive(Serialize)]
struct CacheMatch {
    object: &'static str,
    /// The prompt's length in tokens.
    prompt_tokens: usize,
    /// Leading tokens the cache holds (all tiers).
    cached_tokens: usize,
    /// Per tier.
    tiers: Tiers,
}

#[derive(Serialize)]
struct Tiers {
    memory: usize,
    disk: usize,
}

pub async fn cache_match(
    State(st): State<Arc<AppState>>,
    JsonBody(r): JsonBody<CacheMatchRequest>,
) -> Result<Response, ApiError> {
    let l = st.ready()?;
    check_salt(r.cache_salt.as_deref())?;
    let given = [
        r.prompt.is_some(),
        r.content.is_some(),
        r.messages.is_some(),
        r.tokens.is_some(),
    ];
    if given.iter().filter(|&&g| g).count() != 1 {
        return Err(ApiError::invalid(
            "prompt",
            "give exactly one of prompt, content, messages or tokens",
        ));
    }
    let vocab = l.engine.model().tokenizer.vocab_size();
    let tokens = match r.tokens {
        Some(t) => {
            if let Some(&bad) = t.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "tokens",
                    format!("token {bad} is not in the vocabulary ({vocab} tokens)"),
                ));
            }
            t
        }
        None => {
            let text = TokenizeRequest {
                content: r.content,
                prompt: r.prompt,
                messages: r.messages,
                add_special: r.add_special,
                ..Default::default()
            };
            let st2 = st.clone();
            blocking(move || {
                let l = st2.ready()?;
                tokenize_request(&text, l.engine.model(), l.template.as_ref())
            })
            .await?
        }
    };
    let salt = r.cache_salt.map(String::into_bytes);
    let n = tokens.len();
    let engine = l.engine.clone();
    let (memory, disk) = blocking(move || Ok(engine.cached_prefix_tiers(tokens, salt)?)).await?;
    Ok(Json(CacheMatch {
        object: "cache.match",
        prompt_tokens: n,
        cached_tokens: memory + disk,
        tiers: Tiers { memory, disk },
    })
    .into_response())
}
