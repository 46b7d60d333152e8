//! The two generation routes, `/v1/completions` and `/v1/chat/completions`: check
//! and tokenize the request, start it, wait for its first event (so an error found
//! before any output is a status, not a broken stream), then answer at once or as a
//! stream.

use crate::answer::{
    chat_logprob, completion_logprobs, finish_str, usage, Counts, Head, Offsets, Tally,
};
use crate::api::GenRequest;
use crate::body::JsonBody;
use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::params::{self, Job, Route};
use crate::run::{Run, Tagged};
use crate::sse::{self, Chunker};
use crate::state::AppState;
use crate::tool_stream::{Piece, ToolStream};
use crate::tools;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::tokenizer::Tokenizer;
use folio::{Engine, Event, FinishReason, TokenLogprob};
use serde_json::{json, Value};
use std::sync::Arc;

type St = State<Arc<AppState>>;

pub async fn completions(
    State(st): St,
    JsonBody(r): JsonBody<GenRequest>,
) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    let job = prepare(&st, Route::Completions, r, deadline).await?;
    let head = Head::new("cmpl", &st.config.model_name);
    if job.req.max_tokens == 0 && job.req.prompt_logprobs.is_none() {
        return Ok(echo_only(&head, &job));
    }
    let (run, first) = start(&st, &job, deadline).await?;
    answer_completion(st.ready()?.engine.clone(), head, job, run, first).await
}

pub async fn chat(State(st): St, JsonBody(r): JsonBody<GenRequest>) -> Result<Response, ApiError> {
    let deadline = Deadline::start(&st);
    let job = prepare(&st, Route::Chat, r, deadline).await?;
    let head = Head::new("chatcmpl", &st.config.model_name);
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
    let chunks = Completions {
        engine,
        offsets: vec![Offsets::default(); job.choices()],
        counts: Counts::default(),
        head,
        job,
    };
    if chunks.job.stream {
        return Ok(sse::respond(run, first, chunks));
    }
    let tally = collect(
        run,
        first,
        Tally::new(chunks.job.prompts.len(), chunks.job.req.n),
    )
    .await?;
    let tok = &chunks.engine.model().tokenizer;
    Ok(Json(chunks_body(tok, &chunks.head, &chunks.job, &tally)).into_response())
}

/// A started chat completion's answer: streamed or whole.
pub async fn answer_chat(
    engine: Engine,
    head: Head,
    job: Job,
    run: Run,
    first: Tagged,
) -> Result<Response, ApiError> {
    let chunks = Chat {
        engine,
        tools: match &job.tools {
            Some(t) => (0..job.choices())
                .map(|_| ToolStream::new(&t.mode))
                .collect(),
            None => Vec::new(),
        },
        counts: Counts::default(),
        head,
        job,
    };
    if chunks.job.stream {
        return Ok(sse::respond(run, first, chunks));
    }
    let tally = collect(run, first, Tally::new(1, chunks.job.req.n)).await?;
    let tok = &chunks.engine.model().tokenizer;
    let choices: Vec<Value> = tally
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = chunks.job.logprobs.map(|_| {
                let content: Vec<Value> = c
                    .ids
                    .iter()
                    .zip(&c.logprobs)
                    .filter_map(|(&id, lp)| lp.as_ref().map(|lp| chat_logprob(tok, id, lp)))
                    .collect();
                json!({ "content": content })
            });
            let found = chunks
                .job
                .tools
                .as_ref()
                .and_then(|t| tools::extract(t, &c.text));
            match found {
                Some((calls, rest)) => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": rest,
                                "tool_calls": tools::calls_json(&calls, &chunks.head.id, i)},
                    "logprobs": logprobs,
                    // Cut short by max_tokens, a call's arguments may be incomplete.
                    "finish_reason": c.finish.map_or("tool_calls", call_finish),
                }),
                None => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": logprobs,
                    "finish_reason": c.finish.map(finish_str),
                }),
            }
        })
        .collect();
    let body = chunks.head.object(
        "chat.completion",
        json!({"choices": choices, "usage": tally.usage()}),
    );
    Ok(Json(body).into_response())
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
            l.grammars.as_ref(),
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
async fn collect(mut run: Run, first: Tagged, mut tally: Tally) -> Result<Tally, ApiError> {
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

/// The prompt's tokens with their log-probabilities (the first has none).
fn prompt_tokens<'a>(
    ids: &[u32],
    lps: Option<&'a Vec<TokenLogprob>>,
) -> Vec<(u32, Option<&'a TokenLogprob>)> {
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            (
                id,
                i.checked_sub(1).and_then(|j| lps.and_then(|l| l.get(j))),
            )
        })
        .collect()
}

/// `echo` with nothing to generate and no log-probabilities: the prompts themselves,
/// whole or as a stream.
fn echo_only(head: &Head, job: &Job) -> Response {
    let n = job.req.n;
    let choice = |i: usize| json!({"index": i, "text": job.prompt_texts[i / n], "logprobs": null, "finish_reason": "length"});
    let prompt: usize = job.prompts.iter().map(Vec::len).sum();
    let usage = usage(prompt, 0, 0);
    if job.stream {
        let mut chunks: Vec<Value> = (0..job.choices())
            .map(|i| chunk(head, "text_completion", job.include_usage, choice(i)))
            .collect();
        if job.include_usage {
            chunks.push(head.object("text_completion", json!({"choices": [], "usage": usage})));
        }
        return sse::fixed(&chunks);
    }
    let choices: Vec<Value> = (0..job.choices()).map(choice).collect();
    Json(head.object(
        "text_completion",
        json!({"choices": choices, "usage": usage}),
    ))
    .into_response()
}

/// The body of a completion that is not streamed.
fn chunks_body(tok: &Tokenizer, head: &Head, job: &Job, tally: &Tally) -> Value {
    let n = job.req.n;
    let choices: Vec<Value> = tally
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let p = i / n;
            let mut text = String::new();
            let mut toks = Vec::new();
            let echoed = if job.echo { job.prompts[p].len() } else { 0 };
            if job.echo {
                text.push_str(&job.prompt_texts[p]);
                toks = prompt_tokens(&job.prompts[p], tally.prompt_logprobs[p].as_ref());
            }
            text.push_str(&c.text);
            toks.extend(c.ids.iter().zip(&c.logprobs).map(|(&id, lp)| (id, lp.as_ref())));
            let logprobs = job.logprobs.map(|_| completion_logprobs(tok, &toks, echoed, &mut Offsets::default()));
            json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": c.finish.map(finish_str)})
        })
        .collect();
    head.object(
        "text_completion",
        json!({"choices": choices, "usage": tally.usage()}),
    )
}

/// A streamed completion's chunks.
struct Completions {
    engine: Engine,
    head: Head,
    job: Job,
    /// Characters sent so far per choice (the logprobs' `text_offset`).
    offsets: Vec<Offsets>,
    counts: Counts,
}

impl Completions {
    fn chunk(&self, choice: Value) -> Value {
        chunk(
            &self.head,
            "text_completion",
            self.job.include_usage,
            choice,
        )
    }
}

/// One streamed chunk holding `choice` (with `usage: null` when a usage chunk ends
/// the stream, as OpenAI sends it).
fn chunk(head: &Head, object: &str, include_usage: bool, choice: Value) -> Value {
    let mut v = head.object(object, json!({"choices": [choice]}));
    if include_usage {
        v["usage"] = Value::Null;
    }
    v
}

impl Chunker for Completions {
    fn start(&mut self) -> Vec<Value> {
        if !self.job.echo || self.job.req.prompt_logprobs.is_some() {
            return Vec::new(); // an echo with log-probabilities waits for them
        }
        let n = self.job.req.n;
        (0..self.job.choices())
            .map(|i| {
                let text = &self.job.prompt_texts[i / n];
                self.offsets[i].advance(text.as_bytes());
                self.chunk(
                    json!({"index": i, "text": text, "logprobs": null, "finish_reason": null}),
                )
            })
            .collect()
    }

    fn event(&mut self, t: Tagged) -> Vec<Value> {
        self.counts.count(&t.event);
        let engine = self.engine.clone();
        let tok = &engine.model().tokenizer;
        let n = self.job.req.n;
        match t.event {
            Event::Token {
                index,
                id,
                text,
                logprob,
            } => {
                let i = t.prompt * n + index;
                let logprobs = self.job.logprobs.map(|_| {
                    completion_logprobs(tok, &[(id, logprob.as_ref())], 0, &mut self.offsets[i])
                });
                if text.is_empty() && logprobs.is_none() {
                    return Vec::new();
                }
                vec![self.chunk(
                    json!({"index": i, "text": text, "logprobs": logprobs, "finish_reason": null}),
                )]
            }
            Event::Done {
                index,
                text,
                finish,
                ..
            } => {
                let i = t.prompt * n + index;
                vec![self.chunk(json!({"index": i, "text": text, "logprobs": null, "finish_reason": finish_str(finish)}))]
            }
            Event::PromptLogprobs(lps) => {
                let p = t.prompt;
                (0..n)
                    .map(|k| {
                        let i = p * n + k;
                        let toks = prompt_tokens(&self.job.prompts[p], Some(&lps));
                        let lp = completion_logprobs(tok, &toks, toks.len(), &mut self.offsets[i]);
                        let text = &self.job.prompt_texts[p];
                        self.chunk(json!({"index": i, "text": text, "logprobs": lp, "finish_reason": null}))
                    })
                    .collect()
            }
            Event::Error(_) => Vec::new(),
        }
    }

    fn end(&mut self) -> Vec<Value> {
        usage_chunk(
            &self.head,
            "text_completion",
            self.job.include_usage,
            &self.counts,
        )
    }
}

fn usage_chunk(head: &Head, object: &str, include: bool, counts: &Counts) -> Vec<Value> {
    if !include {
        return Vec::new();
    }
    vec![head.object(object, json!({"choices": [], "usage": counts.usage()}))]
}

/// The finish reason of an output that holds tool calls: `length` when max_tokens cut
/// it short (a call's arguments may be incomplete), else `tool_calls`.
fn call_finish(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::Eos | FinishReason::Stop => "tool_calls",
    }
}

/// A streamed chat completion's chunks.
struct Chat {
    engine: Engine,
    /// Per choice, the answer's content and calls as they stream (none without tools).
    tools: Vec<ToolStream>,
    head: Head,
    job: Job,
    counts: Counts,
}

impl Chat {
    fn chunk(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let choice =
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish});
        chunk(
            &self.head,
            "chat.completion.chunk",
            self.job.include_usage,
            choice,
        )
    }
}

impl Chat {
    /// The chunks for pieces of a choice's answer with tools.
    fn tool_chunks(&self, index: usize, pieces: Vec<Piece>) -> Vec<Value> {
        pieces
            .into_iter()
            .map(|p| {
                let delta = match p {
                    Piece::Content(text) => json!({"content": text}),
                    Piece::Begin { k, name } => json!({"tool_calls": [{"index": k,
                        "id": format!("call_{}_{index}_{k}", self.head.id),
                        "type": "function", "function": {"name": name, "arguments": ""}}]}),
                    Piece::Args { k, text } => {
                        json!({"tool_calls": [{"index": k, "function": {"arguments": text}}]})
                    }
                };
                self.chunk(index, delta, Value::Null, None)
            })
            .collect()
    }
}

impl Chunker for Chat {
    fn start(&mut self) -> Vec<Value> {
        (0..self.job.choices())
            .map(|i| {
                // With tools, content stays null unless text comes (OpenAI's shape).
                let delta = if self.tools.is_empty() {
                    json!({"role": "assistant", "content": ""})
                } else {
                    json!({"role": "assistant", "content": null})
                };
                self.chunk(i, delta, Value::Null, None)
            })
            .collect()
    }

    fn event(&mut self, t: Tagged) -> Vec<Value> {
        self.counts.count(&t.event);
        match t.event {
            Event::Token {
                index,
                id,
                text,
                logprob,
            } => {
                if let Some(s) = self.tools.get_mut(index) {
                    let pieces = s.push(&text);
                    return self.tool_chunks(index, pieces);
                }
                let lp = match (&logprob, self.job.logprobs) {
                    (Some(lp), Some(_)) => {
                        json!({"content": [chat_logprob(&self.engine.model().tokenizer, id, lp)]})
                    }
                    _ => Value::Null,
                };
                if text.is_empty() && lp.is_null() {
                    return Vec::new();
                }
                vec![self.chunk(index, json!({"content": text}), lp, None)]
            }
            Event::Done {
                index,
                text,
                finish,
                ..
            } => {
                if let Some(s) = self.tools.get_mut(index) {
                    let mut pieces = s.push(&text);
                    pieces.extend(s.finish());
                    let finish = match s.calls() {
                        0 => finish_str(finish),
                        _ => call_finish(finish),
                    };
                    let mut out = self.tool_chunks(index, pieces);
                    out.push(self.chunk(index, json!({}), Value::Null, Some(finish)));
                    return out;
                }
                let mut out = Vec::new();
                if !text.is_empty() {
                    out.push(self.chunk(index, json!({"content": text}), Value::Null, None));
                }
                out.push(self.chunk(index, json!({}), Value::Null, Some(finish_str(finish))));
                out
            }
            Event::PromptLogprobs(_) | Event::Error(_) => Vec::new(),
        }
    }

    fn end(&mut self) -> Vec<Value> {
        usage_chunk(
            &self.head,
            "chat.completion.chunk",
            self.job.include_usage,
            &self.counts,
        )
    }
}
