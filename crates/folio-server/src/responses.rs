//! The Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.
//! A request is read into chat messages (`responses_input.rs`), checked and
//! tokenized on the chat path, and generated into a context, so that the response can
//! be kept (`store`, default true) as that context: the conversation's tokens with
//! the reply in them (`responses_store.rs`). One neither kept nor continuing another
//! runs as a chat completion, in no context.
//!
//! `previous_response_id` continues a stored response by forking its context (O(1):
//! the pages are shared) and appending only what the conversation adds: the
//! template's text of the whole conversation (the previous messages, the reply as the
//! model wrote it, the new input) normally begins with exactly the text the context
//! holds, and only the rest is tokenized and computed; the usage's `cached_tokens`
//! says so. When it does not (new `instructions`, a template that rewrites earlier
//! turns), the fork is cut back to the longest prefix its tokens share with the
//! conversation's and the rest computed: the same answer, less reuse. A stored
//! response's `cache_salt` is its chain's; a continuation may not change it.

use crate::body::JsonBody;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::generate::{collect, first_event, prepare};
use crate::offload::blocking;
use crate::params::{check_salt, Route};
use crate::registry::Entry;
use crate::responses_answer::{self, Keep, Shape, Stream};
use crate::responses_input::{self, renamed, Asked};
use crate::responses_store::Stored;
use crate::run::Run;
use crate::sse;
use crate::state::AppState;
use crate::tally::Tally;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::Context;
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<AppState>>;

/// Where a continuation starts: the forked context and what it holds.
struct Fork {
    ctx: Context,
    tokens: Vec<u32>,
    /// The template's text of what the context holds.
    held: String,
    salt: Option<String>,
    /// The stored response's context (the fork's parent).
    parent: String,
}

pub async fn create(State(st): St, JsonBody(r): JsonBody<Value>) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    let asked = responses_input::read(&r)?;
    let engine = st.engine()?;
    let salt = asked.chat.get("cache_salt").and_then(Value::as_str);
    check_salt(salt)?;
    let salt = salt.map(str::to_string);
    let (fork, history) = match &asked.previous {
        Some(prev) => {
            let (fork, history) = continuation(&st, prev).await?;
            if salt.is_some() && salt != fork.salt {
                return Err(ApiError::invalid(
                    "cache_salt",
                    "a continuation keeps its chain's cache_salt",
                ));
            }
            (Some(fork), history)
        }
        None => (None, Vec::new()),
    };
    let gen = asked.chat_request(&history)?;
    let mut job = prepare(&st, Route::Chat, gen, deadline)
        .await
        .map_err(renamed)?;
    let text = job.prompt_texts[0].clone();
    let ids = std::mem::take(&mut job.prompts[0]);
    let tok = &engine.model().tokenizer;
    // A response neither kept nor continuing one needs no context: it runs as a chat
    // completion does, outside the contexts' share of the pool (in a context it would
    // stop where other clients' contexts leave no room, as if at max_output_tokens).
    if !asked.store && fork.is_none() {
        job.prompts[0] = ids;
        let run = Run::start(&st, &engine, &job, deadline).map_err(renamed)?;
        let prompt_len = job.prompts[0].len();
        return answer(&st, run, job, asked, history, text, prompt_len, None).await;
    }
    let (ctx, before, salt, parent) = match fork {
        Some(f) => {
            let (before, delta) = match text.strip_prefix(f.held.as_str()) {
                Some(rest) => {
                    let delta = tok
                        .try_encode(rest, false)
                        .map_err(folio::EngineError::from)?;
                    (f.tokens.len(), delta)
                }
                None => {
                    let common = f
                        .tokens
                        .iter()
                        .zip(&ids)
                        .take_while(|(a, b)| a == b)
                        .count();
                    (common, ids[common..].to_vec())
                }
            };
            job.prompts[0] = delta;
            let ctx = f.ctx;
            // `truncate(n)` drops the last n tokens: what is past the shared prefix.
            let drop = f.tokens.len() - before;
            let ctx = blocking(move || {
                if drop > 0 {
                    ctx.truncate(drop)?;
                }
                Ok(ctx)
            })
            .await?;
            (ctx, before, f.salt, Some(f.parent))
        }
        None => {
            job.prompts[0] = ids;
            let (e2, s2) = (engine.clone(), salt.clone());
            let ctx = blocking(move || Ok(e2.context(s2.map(String::into_bytes))?)).await?;
            (ctx, 0, salt, None)
        }
    };
    let prompt_len = before + job.prompts[0].len();
    // A context's generation stops where the contexts' share of the pool leaves no
    // room: an asked max_output_tokens that does not fit is refused before any work
    // (and before the registry makes room for it), not cut short.
    let wanted = asked
        .chat
        .contains_key("max_completion_tokens")
        .then_some(job.req.max_tokens);
    let (new_tokens, continuing) = (job.prompts[0].len(), asked.previous.is_some());
    let ctx = blocking(move || {
        if let Some(want) = wanted {
            let room = ctx.room(new_tokens)?;
            if room < want {
                return Err(no_room(room, want, continuing));
            }
        }
        Ok(ctx)
    })
    .await?;
    let mut entry = Entry::new(ctx, salt, parent, false);
    entry.evictable = true;
    let entry = Arc::new(entry);
    let pending = Pending {
        st: st.clone(),
        context: match asked.store {
            true => Some(
                st.contexts
                    .insert_shared(st.config.max_contexts, entry.clone())?,
            ),
            false => None,
        },
    };
    let (st2, e2) = (st.clone(), entry.clone());
    let run = blocking(move || {
        let mut run = Run::start_context(&st2, &e2.ctx, &job, false, deadline)?;
        run.hold(e2);
        Ok((run, job))
    })
    .await;
    let (run, job) = run.map_err(renamed)?;
    answer(
        &st,
        run,
        job,
        asked,
        history,
        text,
        prompt_len,
        Some(pending),
    )
    .await
}

/// Answers a started response, whole or streamed, and keeps it where it is stored
/// (`pending`: its context, registered).
#[allow(clippy::too_many_arguments)]
async fn answer(
    st: &Arc<AppState>,
    run: Run,
    job: crate::params::Job,
    asked: Asked,
    history: Vec<Value>,
    text: String,
    prompt_len: usize,
    pending: Option<Pending>,
) -> Result<Response, ApiError> {
    let (run, first) = first_event(run).await.map_err(renamed)?;
    let l = st.ready()?;
    let head = crate::answer::Head::new("resp", &st.config.model_name, &l.system_fingerprint);
    let Asked {
        input,
        instructions,
        store,
        stream,
        previous,
        echo,
        ..
    } = asked;
    let shape = Shape {
        id: response_id().unwrap_or_else(|| head.id.replacen('-', "_", 1)),
        created: head.created,
        model: head.model,
        system_fingerprint: head.system_fingerprint,
        instructions,
        previous,
        store,
        echo,
    };
    let keep = pending.filter(|_| store).map(|pending| {
        let mut messages = history;
        messages.extend(input);
        keeper(pending, shape.id.clone(), messages, text, prompt_len)
    });
    if stream {
        return Ok(sse::respond(run, first, Stream::new(shape, &job, keep)));
    }
    let tally = collect(run, first, Tally::new(1, 1)).await?;
    let object = responses_answer::whole(&shape, &job, &tally);
    if let Some(keep) = keep {
        keep(&object);
    }
    Ok(Json(object).into_response())
}

/// The 429 of a response whose context has room for `room` output tokens, where
/// max_output_tokens asks for `want`.
fn no_room(room: usize, want: usize, continuing: bool) -> ApiError {
    let mut message = format!(
        "contexts and snapshots leave room for {room} output tokens in this response's context and max_output_tokens asks for {want}: delete stored responses, contexts or snapshots, or ask for fewer"
    );
    if !continuing {
        message.push_str(", or set store to false (a response not stored needs no room)");
    }
    let mut err = ApiError::new(axum::http::StatusCode::TOO_MANY_REQUESTS, message);
    err.param = Some("max_output_tokens".into());
    err.retry_after = Some(5);
    err
}

/// A new response id: `resp_` and 128 random bits. The id is what reads a stored
/// response back and continues it, so it must not be guessable from another's (a
/// count or a clock would be). `None` where the system has no randomness to give.
fn response_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    match getrandom::fill(&mut bytes) {
        Ok(()) => Some(format!(
            "resp_{}",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )),
        Err(e) => {
            tracing::warn!("no random bytes for a response id ({e}): a counted id is used");
            None
        }
    }
}

/// Forks stored response `prev`'s context; returns the fork and the conversation it
/// holds as chat messages, the reply included as the model wrote it.
async fn continuation(st: &Arc<AppState>, prev: &str) -> Result<(Fork, Vec<Value>), ApiError> {
    let (stored, parent) = st.responses.get(&st.contexts, prev)?;
    let salt = parent.salt.clone();
    let (ctx, tokens) = blocking(move || {
        let ctx = parent.ctx.fork()?;
        let tokens = ctx.tokens()?;
        Ok((ctx, tokens))
    })
    .await?;
    let engine = st.engine()?;
    let tok = &engine.model().tokenizer;
    let reply = tokens.get(stored.prompt_len..).unwrap_or_default();
    let shown: Vec<u32> = reply.iter().copied().filter(|&t| !tok.is_eog(t)).collect();
    let mut history = stored.messages.clone();
    history.push(json!({"role": "assistant", "content": tok.decode(&shown)}));
    let held = format!("{}{}", stored.prompt_text, tok.decode_special(reply));
    let fork = Fork {
        ctx,
        tokens,
        held,
        salt,
        parent: stored.context.clone(),
    };
    Ok((fork, history))
}

/// A stored response's context, registered before it generates (so a full registry
/// is a 429 before any work): dropped unkept (the run failed, or the client went
/// away), it leaves the registry again.
struct Pending {
    st: Arc<AppState>,
    context: Option<String>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(c) = self.context.take() {
            let _ = self.st.contexts.remove(&c);
        }
    }
}

/// What stores a finished response: the record beside its context.
fn keeper(
    mut pending: Pending,
    id: String,
    messages: Vec<Value>,
    prompt_text: String,
    prompt_len: usize,
) -> Keep {
    Box::new(move |object: &Value| {
        let Some(context) = pending.context.take() else {
            return;
        };
        let stored = Stored {
            context,
            object: object.clone(),
            messages,
            prompt_text,
            prompt_len,
        };
        pending
            .st
            .responses
            .insert(&pending.st.contexts, id, stored);
    })
}

pub async fn get(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(st.responses.object(&st.contexts, &id)?).into_response())
}

pub async fn delete(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    st.responses.remove(&st.contexts, &id)?;
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}
