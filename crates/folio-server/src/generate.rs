//! The two generation routes, `/v1/completions` and `/v1/chat/completions`: check
//! and tokenize the request, start it, wait for its first event (so an error found
//! before any output is a status, not a broken stream), then answer at once or as a
//! stream (the answers' shapes are `completion.rs`'s and `chat.rs`'s). A chat whose
//! `model` is `"inferlet:NAME"` runs that program instead (`inferlets.rs`).

use crate::answer::Head;
use crate::api::GenRequest;
use crate::body::{JsonBody, RawBody};
use crate::chat::{self, Chat};
use crate::completion::{self, echo_only, Completions};
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::params::{self, Job, Route};
use crate::run::{Run, Tagged};
use crate::sse;
use crate::state::AppState;
use crate::tally::Tally;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::{Engine, Event};
use std::sync::Arc;

type St = State<Arc<AppState>>;

pub async fn completions(
    State(st): St,
    JsonBody(r): JsonBody<GenRequest>,
) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    let job = prepare(&st, Route::Completions, r, deadline).await?;
    let head = Head::new(
        "cmpl",
        &st.config.model_name,
        &st.ready()?.system_fingerprint,
    );
    if job.req.max_tokens == 0 && job.req.prompt_logprobs.is_none() {
        return Ok(echo_only(&head, &job));
    }
    let (run, first) = start(&st, &job, deadline).await?;
    answer_completion(st.ready()?.engine.clone(), head, job, run, first).await
}

/// The `model` field alone, to find `"inferlet:NAME"` before the full parse.
#[derive(serde::Deserialize)]
struct ModelOnly {
    model: Option<String>,
}

/// `/v1/chat/completions`: a chat with the model, or, when `model` is
/// `"inferlet:NAME"`, a run of that program with the request as its input.
pub async fn chat(State(st): St, RawBody(body): RawBody) -> Result<Response, ApiError> {
    let model = serde_json::from_slice::<ModelOnly>(&body)
        .ok()
        .and_then(|m| m.model);
    if let Some(name) = model.as_deref().and_then(|m| m.strip_prefix("inferlet:")) {
        let name = name.to_string();
        return crate::inferlets::chat(&st, &name, &body).await;
    }
    let r: GenRequest = crate::body::parse(&body)?;
    let deadline = Deadline::start(&st);
    let job = prepare(&st, Route::Chat, r, deadline).await?;
    let head = Head::new(
        "chatcmpl",
        &st.config.model_name,
        &st.ready()?.system_fingerprint,
    );
    let (run, first) = start(&st, &job, deadline).await?;
    answer_chat(st.ready()?.engine.clone(), head, job, run, first).await
}

/// A started completion's answer: streamed or whole.
pub async fn answer_completion(
    engine: Engine,
    head: Head,
    job: Job,
    run: Run,
    first: Tagged,
) -> Result<Response, ApiError> {
    if job.stream {
        return Ok(sse::respond(
            run,
            first,
            Completions::new(engine, head, job),
        ));
    }
    let tally = collect(run, first, Tally::new(job.prompts.len(), job.req.n)).await?;
    let tok = &engine.model().tokenizer;
    Ok(Json(completion::whole(tok, &head, &job, &tally)).into_response())
}

/// A started chat completion's answer: streamed or whole.
pub async fn answer_chat(
    engine: Engine,
    head: Head,
    job: Job,
    run: Run,
    first: Tagged,
) -> Result<Response, ApiError> {
    if job.stream {
        return Ok(sse::respond(run, first, Chat::new(engine, head, job)));
    }
    let tally = collect(run, first, Tally::new(1, job.req.n)).await?;
    let tok = &engine.model().tokenizer;
    Ok(Json(chat::whole(tok, &head, &job, &tally)).into_response())
}

/// Checks and tokenizes the request, and compiles its grammar, off the async
/// threads (any of them can take milliseconds). When the request goes away first
/// (the client hangs up, which drops this future, or the deadline passes), the
/// grammar's compile is told to stop ([`folio::grammar::CompileCancel`]); what it
/// cannot stop is bounded by the grammar caps. A panic in the check is logged and
/// answered with a short 500.
pub async fn prepare(
    st: &Arc<AppState>,
    route: Route,
    r: GenRequest,
    deadline: Deadline,
) -> Result<Job, ApiError> {
    st.ready()?;
    let st2 = st.clone();
    let mut cancel = CancelOnDrop {
        cancel: Arc::new(folio::grammar::CompileCancel::default()),
        armed: true,
    };
    let cancel2 = cancel.cancel.clone();
    let work = tokio::task::spawn_blocking(move || {
        let l = st2.ready()?;
        params::job_cancellable(
            route,
            r,
            l.engine.model(),
            l.template.as_ref(),
            l.engine.grammars(),
            (l.engine.window(), st2.config.max_tokens),
            &cancel2,
        )
    });
    let joined = deadline.within(st, work).await?;
    cancel.armed = false;
    joined.map_err(|e| {
        tracing::error!("checking a request failed: {e}");
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal error while checking the request",
        )
    })?
}

/// Cancels a grammar compile when dropped armed: when [`prepare`] is dropped or
/// returns before its check finished.
struct CancelOnDrop {
    cancel: Arc<folio::grammar::CompileCancel>,
    /// Off once the check has finished: nothing left to cancel.
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.cancel.cancel();
        }
    }
}

/// Submits the job and waits for its first event; an error there is the answer.
async fn start(
    st: &Arc<AppState>,
    job: &Job,
    deadline: Deadline,
) -> Result<(Run, Tagged), ApiError> {
    let engine = &st.ready()?.engine;
    first_event(Run::start(st, engine, job, deadline)?).await
}

/// Waits for a run's first event; an error there is the answer.
pub async fn first_event(mut run: Run) -> Result<(Run, Tagged), ApiError> {
    match run.next().await {
        Some(Tagged {
            event: Event::Error(e),
            ..
        }) => Err(e.into()),
        Some(t) => Ok((run, t)),
        None => Err(folio::EngineError::Closed.into()),
    }
}

/// Gathers every event of a run that is not streamed.
pub async fn collect(mut run: Run, first: Tagged, mut tally: Tally) -> Result<Tally, ApiError> {
    let mut next = Some(first);
    while let Some(t) = next {
        if let Event::Error(e) = t.event {
            return Err(e.into());
        }
        tally.add(&t);
        next = run.next().await;
    }
    Ok(tally)
}
