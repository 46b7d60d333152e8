//! The routes' request-body checks, reachable without a server or an engine, for the
//! fuzz targets in `fuzz/` (not an API: hidden from the docs, free to change). Each
//! route does here exactly what its handler does with a body before any work is
//! queued: parse it, then check it and tokenize its prompt (and compile its grammar),
//! with the same functions the handlers call. Every route that reads a body is here;
//! fork, snapshot load and delete take none (their ids and names come in the path).

use crate::api::{DetokenizeRequest, GenRequest, TokenizeRequest};
use crate::body::parse;
use crate::context_edit::{Append, Truncate};
use crate::context_generate::GenerateExtra;
use crate::contexts::CreateContext;
use crate::embeddings::embed_job;
use crate::error::ApiError;
use crate::messages::chat_request;
use crate::misc::{detokenize_request, tokenize_request};
use crate::params::{job, Route};
use crate::responses_input::read;
use crate::snapshots::Save;
use folio::grammar::GrammarTable;
use folio::tokenizer::ChatTemplate;
use folio::Model;

/// A route that takes a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRoute {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/contexts`
    ContextCreate,
    /// `POST /v1/contexts/{id}/append`
    ContextAppend,
    /// `POST /v1/contexts/{id}/truncate`
    ContextTruncate,
    /// `POST /v1/contexts/{id}/generate`
    ContextGenerate,
    /// `POST /v1/snapshots`
    SnapshotSave,
    /// `POST /tokenize`
    Tokenize,
    /// `POST /detokenize`
    Detokenize,
    /// `POST /v1/messages`
    Messages,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/embeddings`
    Embeddings,
}

impl BodyRoute {
    /// Every route, in a fixed order (a fuzz input's first byte picks one).
    pub const ALL: [BodyRoute; 12] = [
        BodyRoute::Completions,
        BodyRoute::Chat,
        BodyRoute::ContextCreate,
        BodyRoute::ContextAppend,
        BodyRoute::ContextTruncate,
        BodyRoute::ContextGenerate,
        BodyRoute::SnapshotSave,
        BodyRoute::Tokenize,
        BodyRoute::Detokenize,
        BodyRoute::Messages,
        BodyRoute::Responses,
        BodyRoute::Embeddings,
    ];
}

/// What the server loaded beside the engine: the model, its chat template and grammar
/// table (either may be missing, as in the server), the window and the `max_tokens`
/// cap (`--max-tokens-cap`).
pub struct Loaded<'a> {
    pub model: &'a Model,
    pub template: Option<&'a ChatTemplate>,
    pub grammars: GrammarTable<'a>,
    pub window: usize,
    pub max_tokens_cap: usize,
}

/// Parses and checks `body` as `route` would; `Ok` where the route would go on to run
/// it. How many prompts' tokens a generation route (or the embeddings route) would
/// run is returned (0 for the others).
pub fn check_body(route: BodyRoute, body: &[u8], l: &Loaded) -> Result<usize, ApiError> {
    let gen = |route: Route, r: GenRequest| {
        job(
            route,
            r,
            l.model,
            l.template,
            l.grammars,
            l.window,
            l.max_tokens_cap,
        )
        .map(|j| j.prompts.iter().map(Vec::len).sum())
    };
    match route {
        BodyRoute::Completions => gen(Route::Completions, parse(body)?),
        BodyRoute::Chat => gen(Route::Chat, parse(body)?),
        BodyRoute::ContextGenerate => {
            let _: GenerateExtra = parse(body)?;
            gen(Route::Context, parse(body)?)
        }
        BodyRoute::ContextCreate => CreateContext::from_body(body).map(|_| 0),
        BodyRoute::ContextAppend => parse::<Append>(body)?.checked().map(|_| 0),
        BodyRoute::ContextTruncate => parse::<Truncate>(body).map(|_| 0),
        BodyRoute::SnapshotSave => parse::<Save>(body)?.check().map(|_| 0),
        BodyRoute::Tokenize => {
            tokenize_request(&parse::<TokenizeRequest>(body)?, l.model, l.template).map(|_| 0)
        }
        BodyRoute::Detokenize => {
            detokenize_request(&parse::<DetokenizeRequest>(body)?, l.model).map(|_| 0)
        }
        BodyRoute::Messages => gen(Route::Chat, chat_request(&parse(body)?)?),
        // A continuation's history comes from the stored response, not the body.
        BodyRoute::Responses => gen(Route::Chat, read(&parse(body)?)?.chat_request(&[])?),
        BodyRoute::Embeddings => {
            embed_job(parse(body)?, l.model, l.window).map(|j| j.inputs.iter().map(Vec::len).sum())
        }
    }
}
