//! `POST /v1/embeddings` (and llama.cpp's alias `/embeddings`): OpenAI's embeddings
//! API. Each input's embedding is the model's last hidden state (after the final
//! norm: the LM head's input), pooled over its tokens.
//!
//! | field | folio |
//! |---|---|
//! | `input` | a string, a list of strings, a list of token ids, or a list of lists of ids; at most [`MAX_INPUTS`] inputs and [`MAX_REQUEST_TOKENS`] tokens in all, none empty, each within the window. Text is tokenized as a prompt is (a BOS first where the model puts one) |
//! | `model` | accepted; the one model is served whatever the name |
//! | `encoding_format` | `"float"` (the default) or `"base64"`: the little-endian float32 bytes in base64, as OpenAI sends them |
//! | `dimensions` | accepted when equal to the model's hidden size (or absent); any other a 400: folio does not shorten embeddings |
//! | `user` | accepted, ignored |
//! | `pooling` (folio) | `"mean"` (the default), `"last"` or `"cls"` (the first token's state; only where the tokenizer puts a BOS/CLS token first, and token-id inputs must start with it) |
//! | `normalize` (folio) | scale each vector to unit L2 norm; default true |
//!
//! Every check runs before any model work, with the field named in the 400. Each
//! input runs on the engine as a sequence of its own ([`folio::Engine::submit_embedding`]):
//! the scheduler batches it with the other requests; the handler waits off the async
//! threads, and a request that goes away (or runs past `--request-timeout`) cancels
//! what it queued. While it waits it holds one of the `--max-queue` places.

use crate::answer::{Embedding, EmbeddingUsage, EmbeddingValue, Embeddings};
use crate::api::PromptInput;
use crate::body::JsonBody;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::offload::blocking;
use crate::params::MAX_REQUEST_TOKENS;
use crate::state::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::engine::pooling;
use folio::{Engine, EngineError, Model, Pooling, Prompt};
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The most inputs one request embeds (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// The request body.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub input: Option<PromptInput>,
    /// Checked for its type only: the server serves one model, whatever the name.
    #[allow(dead_code)]
    pub model: Option<String>,
    pub encoding_format: Option<String>,
    pub dimensions: Option<u64>,
    /// Checked for its type only (an end-user id for OpenAI's abuse monitoring).
    #[allow(dead_code)]
    pub user: Option<String>,
    pub pooling: Option<String>,
    pub normalize: Option<bool>,
}

/// A checked request: every input's tokens and how to answer.
#[derive(Debug)]
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
    pub normalize: bool,
    pub base64: bool,
}

/// An engine error about an input, with `input` as its field (the engine names a
/// prompt's).
fn input_error(e: EngineError) -> ApiError {
    let mut a = ApiError::from(e);
    if matches!(a.param.as_deref(), Some("prompt" | "max_tokens")) {
        a.param = Some("input".into());
    }
    a
}

/// Checks `r` and tokenizes its inputs for `model` under `window` (the most tokens
/// one sequence holds).
pub fn embed_job(r: EmbeddingsRequest, model: &Model, window: usize) -> Result<EmbedJob, ApiError> {
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format is \"float\" or \"base64\", not {other:?}"),
            ))
        }
    };
    let dim = model.config.dim;
    if let Some(d) = r.dimensions.filter(|&d| d != dim as u64) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("this model's embeddings have {dim} dimensions; folio does not shorten them (asked for {d})"),
        ));
    }
    let pooling = match r.pooling.as_deref() {
        None => Pooling::default(),
        Some(p) => Pooling::parse(p).ok_or_else(|| {
            ApiError::invalid(
                "pooling",
                format!("pooling is one of {:?}, not {p:?}", Pooling::NAMES),
            )
        })?,
    };
    let Some(input) = r.input else {
        return Err(ApiError::invalid("input", "input is required"));
    };
    let count = match &input {
        PromptInput::Text(_) | PromptInput::Tokens(_) => 1,
        PromptInput::Texts(t) => t.len(),
        PromptInput::TokenLists(l) => l.len(),
    };
    if count == 0 {
        return Err(ApiError::invalid("input", "the input list is empty"));
    }
    if count > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!("{count} inputs; one request embeds at most {MAX_INPUTS}"),
        ));
    }
    let many = matches!(input, PromptInput::Texts(_) | PromptInput::TokenLists(_));
    let prompts: Vec<Prompt> = match input {
        PromptInput::Text(t) => vec![Prompt::Text(t)],
        PromptInput::Texts(ts) => ts.into_iter().map(Prompt::Text).collect(),
        PromptInput::Tokens(ids) => vec![Prompt::Tokens(ids)],
        PromptInput::TokenLists(ls) => ls.into_iter().map(Prompt::Tokens).collect(),
    };
    let which = |i: usize| {
        if many {
            format!("input {i}")
        } else {
            "the input".into()
        }
    };
    let cls = pooling::cls_token(&model.tokenizer);
    let mut inputs = Vec::with_capacity(prompts.len());
    let mut total = 0usize;
    for (i, p) in prompts.iter().enumerate() {
        let ids = p.tokens(model).map_err(input_error)?;
        if ids.is_empty() {
            return Err(ApiError::invalid("input", format!("{} is empty", which(i))));
        }
        // Nothing is generated after it: a whole window fits.
        if ids.len() > window {
            let mut e = input_error(EngineError::PromptTooLong {
                len: ids.len(),
                window,
            });
            e.message = format!(
                "{} has {} tokens; the context window holds {window}",
                which(i),
                ids.len()
            );
            return Err(e);
        }
        total += ids.len();
        if total > MAX_REQUEST_TOKENS {
            return Err(ApiError::invalid(
                "input",
                format!("the inputs hold more than {MAX_REQUEST_TOKENS} tokens in all; one request takes at most that: send them in several requests"),
            ));
        }
        pooling::check(cls, &ids, pooling)?;
        inputs.push(ids);
    }
    Ok(EmbedJob {
        inputs,
        pooling,
        normalize: r.normalize.unwrap_or(true),
        base64,
    })
}

/// A place among the requests waiting on the engine (`--max-queue`), given back when
/// dropped.
struct Queued(Arc<AppState>);

impl Queued {
    /// A place, or 503 when `--max-queue` requests already wait.
    fn take(st: &Arc<AppState>) -> Result<Self, ApiError> {
        let max = st.config.max_queue;
        st.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max).then_some(q + 1)
            })
            .map_err(|_| {
                ApiError::unavailable(
                    format!("the server is busy: {max} requests are already waiting (--max-queue)"),
                    1,
                )
            })?;
        Ok(Self(st.clone()))
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Cancels the engine requests it names when dropped (a client gone, a deadline
/// passed); cancelling a finished one does nothing.
struct CancelOnDrop {
    engine: Engine,
    ids: Vec<u64>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        for &id in &self.ids {
            self.engine.cancel(id);
        }
    }
}

pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    JsonBody(r): JsonBody<EmbeddingsRequest>,
) -> Result<Response, ApiError> {
    st.ready()?;
    let deadline = Deadline::start(&st);
    // Tokenizing up to the body limit's worth of text: off the async threads.
    let st2 = st.clone();
    let job = deadline
        .within(
            &st,
            blocking(move || {
                let l = st2.ready()?;
                embed_job(r, l.engine.model(), l.engine.window())
            }),
        )
        .await??;
    let engine = st.engine()?;
    let _queued = Queued::take(&st)?;
    let tokens: usize = job.inputs.iter().map(Vec::len).sum();
    let (how, normalize, base64) = (job.pooling, job.normalize, job.base64);
    let handles = job
        .inputs
        .into_iter()
        .map(|t| engine.submit_embedding(t))
        .collect::<Result<Vec<_>, _>>()?;
    let _cancel = CancelOnDrop {
        engine: engine.clone(),
        ids: handles.iter().map(folio::Embedding::id).collect(),
    };
    let work = blocking(move || {
        handles
            .into_iter()
            .map(|h| h.wait_pooled(how, normalize).map_err(input_error))
            .collect::<Result<Vec<_>, _>>()
    });
    let vectors = deadline.within(&st, work).await??;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| Embedding {
            object: "embedding",
            index,
            embedding: if base64 {
                EmbeddingValue::Base64(base64_f32(&v))
            } else {
                EmbeddingValue::Float(v)
            },
        })
        .collect();
    let answer = Embeddings {
        object: "list",
        data,
        model: st.config.model_name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    };
    Ok(Json(answer).into_response())
}

/// `v`'s little-endian float32 bytes in standard base64 (with padding), as OpenAI
/// sends `encoding_format: "base64"`.
pub fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 is 00 00 80 3f.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[]), "");
        // 8 bytes: two padding characters; 12 bytes: none.
        assert_eq!(base64_f32(&[0.0, -2.0]), "AAAAAAAAAMA=");
        assert_eq!(base64_f32(&[0.0; 3]), "AAAAAAAAAAAAAAAA");
    }
}
