//! Stored responses (`store: true`, the Responses API's default). A stored response
//! is a server context (`registry.rs`): the conversation's tokens as computed, with
//! the reply in them, so `previous_response_id` continues it by an O(1) fork instead
//! of a new prefill. That context expires as any other (`--context-ttl`), shows in
//! `GET /v1/contexts`, and is the first to go when the registry is full (it is
//! evictable). Beside it this keeps what continuing needs: the conversation as chat
//! messages and the template's text the context held before the reply. A record
//! whose context is gone is gone too (404), and is swept away at the next store.

use crate::error::ApiError;
use crate::registry::{Contexts, Entry};
use axum::http::StatusCode;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// One stored response.
pub struct Stored {
    /// The server context holding the conversation and the reply.
    pub context: String,
    /// The response as it was answered (`GET /v1/responses/{id}`).
    pub object: Value,
    /// The conversation up to the reply, as chat messages, without `instructions`
    /// (those do not carry over to a continuation).
    pub messages: Vec<Value>,
    /// The template's text of the conversation up to where the reply starts.
    pub prompt_text: String,
    /// Tokens the context held before the reply.
    pub prompt_len: usize,
}

/// The stored responses by id.
#[derive(Default)]
pub struct Responses {
    map: Mutex<HashMap<String, Arc<Stored>>>,
}

impl Responses {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Stored>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps response `id`, and forgets those whose contexts have gone.
    pub fn insert(&self, contexts: &Contexts, id: String, s: Stored) {
        let mut m = self.map();
        m.retain(|_, s| contexts.contains(&s.context));
        m.insert(id, Arc::new(s));
    }

    /// Response `id` and its context (renewed: a continuation uses it); 404 when it
    /// is unknown or its context has expired.
    pub fn get(
        &self,
        contexts: &Contexts,
        id: &str,
    ) -> Result<(Arc<Stored>, Arc<Entry>), ApiError> {
        let s = self.map().get(id).cloned().ok_or_else(|| not_found(id))?;
        match contexts.get(&s.context) {
            Ok(e) => Ok((s, e)),
            Err(_) => {
                self.map().remove(id);
                Err(not_found(id))
            }
        }
    }

    /// Response `id` as it was answered (a look does not renew its context).
    pub fn object(&self, contexts: &Contexts, id: &str) -> Result<Value, ApiError> {
        let s = self.map().get(id).cloned().ok_or_else(|| not_found(id))?;
        if !contexts.contains(&s.context) {
            self.map().remove(id);
            return Err(not_found(id));
        }
        Ok(s.object.clone())
    }

    /// Forgets response `id` and drops its context.
    pub fn remove(&self, contexts: &Contexts, id: &str) -> Result<(), ApiError> {
        let s = self.map().remove(id).ok_or_else(|| not_found(id))?;
        // Already expired: the record was all that was left.
        let _ = contexts.remove(&s.context);
        Ok(())
    }
}

fn not_found(id: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no response {id:?}: it was not stored (store: false), was deleted, or its \
             context expired (--context-ttl) or made room for newer ones (--max-contexts)"
        ),
    );
    e.code = Some("response_not_found");
    e
}
