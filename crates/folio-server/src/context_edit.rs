//! The routes that change a context in place or branch it:
//! `POST /v1/contexts/{id}/append` (text, tokens or chat messages), `/fork` (a new
//! context sharing every page, O(1)) and `/truncate` (roll back to a length). Each
//! answers with the context's figures.

use crate::api::ChatMessage;
use crate::body::JsonBody;
use crate::contexts::{info, register};
use crate::error::ApiError;
use crate::offload::blocking;
use crate::params::message_text;
use crate::registry::Entry;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::Role;
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

type St = State<Arc<AppState>>;

#[derive(Deserialize)]
pub struct Append {
    pub text: Option<String>,
    pub tokens: Option<Vec<u32>>,
    pub messages: Option<Vec<ChatMessage>>,
}

/// What an [`Append`] adds, checked whole before any of it is appended.
pub enum Appended {
    Text(String),
    Tokens(Vec<u32>),
    Messages(Vec<(Role, String)>),
}

impl Append {
    /// Exactly one of text, tokens and messages, each message's role and text checked.
    pub fn checked(self) -> Result<Appended, ApiError> {
        match (self.text, self.tokens, self.messages) {
            (Some(t), None, None) => Ok(Appended::Text(t)),
            (None, Some(t), None) => Ok(Appended::Tokens(t)),
            (None, None, Some(msgs)) => msgs
                .iter()
                .enumerate()
                .map(|(i, m)| Ok((role(&m.role, i)?, message_text(&m.content, i)?)))
                .collect::<Result<_, ApiError>>()
                .map(Appended::Messages),
            _ => Err(ApiError::invalid(
                "text",
                "give exactly one of text, tokens and messages",
            )),
        }
    }
}

fn role(r: &str, i: usize) -> Result<Role, ApiError> {
    match r {
        "system" | "developer" => Ok(Role::System),
        "user" => Ok(Role::User),
        "assistant" => Ok(Role::Assistant),
        other => Err(ApiError::invalid(
            format!("messages[{i}].role"),
            format!("role {other:?}: a context takes system, user and assistant messages"),
        )),
    }
}

pub async fn append(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(a): JsonBody<Append>,
) -> Result<Response, ApiError> {
    st.engine()?;
    let e = st.contexts.get(&id)?;
    e.editable(&id)?;
    let a = a.checked()?;
    let v = blocking(move || {
        match a {
            Appended::Text(t) => e.ctx.append_text(&t)?,
            Appended::Tokens(t) => e.ctx.append_tokens(&t)?,
            Appended::Messages(parsed) => {
                for (r, t) in parsed {
                    e.ctx.message(r, &t)?;
                }
                e.chat.store(true, Ordering::Relaxed);
            }
        }
        info(&id, &e)
    })
    .await?;
    Ok(Json(v).into_response())
}

pub async fn fork(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    st.engine()?;
    let e = st.contexts.get(&id)?;
    let st2 = st.clone();
    let v = blocking(move || {
        let child = e.ctx.fork()?;
        let chat = e.chat.load(Ordering::Relaxed);
        register(&st2, Entry::new(child, e.salt.clone(), Some(id), chat))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

#[derive(Deserialize)]
pub struct Truncate {
    pub tokens: usize,
}

pub async fn truncate(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(t): JsonBody<Truncate>,
) -> Result<Response, ApiError> {
    st.engine()?;
    let e = st.contexts.get(&id)?;
    e.editable(&id)?;
    let v = blocking(move || {
        e.ctx.truncate(t.tokens)?;
        info(&id, &e)
    })
    .await?;
    Ok(Json(v).into_response())
}
