//! `POST /v1/contexts/{id}/generate`: generation into a context, with the
//! chat-completion sampling fields and `stream`; it answers as a chat completion when
//! the context holds messages (or `chat` says so), else as a completion. The context
//! is marked in use while it runs (the reaper skips it).

use crate::answer::Head;
use crate::api::GenRequest;
use crate::body::RawBody;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::generate::{answer_chat, answer_completion, first_event, prepare};
use crate::offload::blocking;
use crate::params::Route;
use crate::registry::InUse;
use crate::run::Run;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::response::Response;
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Generation body: the chat-completion sampling fields, `stream`, an optional
/// `prompt` appended first, and `chat` (reply as the assistant; default: whether the
/// context holds messages).
#[derive(Deserialize)]
pub struct GenerateExtra {
    pub chat: Option<bool>,
}

pub async fn generate(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    let extra: GenerateExtra = crate::body::parse(&body)?;
    let r: GenRequest = crate::body::parse(&body)?;
    let e = st.contexts.get(&id)?;
    e.editable(&id)?;
    let job = prepare(&st, Route::Context, r, deadline).await?;
    let chat = extra.chat.unwrap_or(e.chat.load(Ordering::Relaxed));
    let engine = st.engine()?;
    let st2 = st.clone();
    let run = blocking(move || {
        let mut run = Run::start_context(&st2, &e.ctx, &job, chat, deadline)?;
        run.hold(InUse(e));
        Ok((run, job))
    })
    .await;
    let (run, job) = run?;
    let (run, first) = first_event(run).await?;
    let prefix = if chat { "chatcmpl" } else { "cmpl" };
    let head = Head::new(
        prefix,
        &st.config.model_name,
        &st.ready()?.system_fingerprint,
    );
    if chat {
        answer_chat(engine, head, job, run, first).await
    } else {
        answer_completion(engine, head, job, run, first).await
    }
}
