//! [`Run`]: one HTTP request's engine requests (one per prompt), their events on an
//! async channel, and their end. Dropping a `Run` before its samples finished (the
//! client went away, streaming or not: the handler's future or the response body is
//! dropped) cancels every engine request at once, so their pages go back before the
//! next step. A run that outlives its [`Deadline`] (`--request-timeout`, counted from
//! the handler's start, queue included) ends with [`EngineError::TimedOut`] and is
//! cancelled the same way. Request metrics are
//! recorded here, as the events pass.
//!
//! The channel is bounded ([`capacity`]): the engine thread never waits on a client,
//! so when a run's channel is full (a streaming client that stopped reading) its
//! requests are cancelled instead: a client that does not read stops its own
//! request, and what one request can hold in memory is bounded. A run answered whole
//! is read by the server itself, which never stops; its channel holds every event its
//! samples can send, so a reader kept waiting on a busy machine costs nothing but
//! that wait (what it buffers is what the answer holds anyway).

use crate::deadline::Deadline;
use crate::error::ApiError;
use crate::params::Job;
use crate::state::AppState;
use folio::{Context, Engine, EngineError, Event, Prompt};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{channel, Receiver};

/// Hands one event to the run's channel; false when the run is gone.
type Sink = Box<dyn Fn(Event) -> bool + Send + Sync>;

/// An engine event and which prompt of the request it belongs to.
pub struct Tagged {
    pub prompt: usize,
    pub event: Event,
}

pub struct Run {
    state: Arc<AppState>,
    engine: Engine,
    ids: Vec<u64>,
    rx: Receiver<Tagged>,
    /// Set when an event found the channel full (the client stopped reading).
    overflowed: Arc<AtomicBool>,
    started: Instant,
    /// When the run is stopped (`--request-timeout`), and the limit.
    deadline: Option<(tokio::time::Instant, std::time::Duration)>,
    /// Holds one place in the queue until the first event arrives.
    queued: bool,
    first: Option<Instant>,
    /// When the previous token of sample 0 of prompt 0 came (time per output token).
    last: Option<Instant>,
    /// Samples still running.
    open: usize,
    ended: bool,
    /// Kept until the run is dropped (a context's in-use mark).
    _held: Option<Box<dyn Send + Sync>>,
}

impl Run {
    /// Submits one engine request per prompt of `job`. 503 when `--max-queue`
    /// requests already wait for their first token.
    pub fn start(
        state: &Arc<AppState>,
        engine: &Engine,
        job: &Job,
        deadline: Deadline,
    ) -> Result<Run, ApiError> {
        let cap = capacity(job.choices(), job.req.max_tokens, job.stream);
        Self::begin(state, engine, job.choices(), cap, deadline, |sink, ids| {
            for (p, prompt) in job.prompts.iter().enumerate() {
                let mut req = job.req.clone();
                req.prompt = Prompt::Tokens(prompt.clone());
                ids.push(engine.submit_with(req, sink(p))?);
            }
            Ok(())
        })
    }

    /// Starts `job` as a generation of context `ctx` (a chat reply with `chat`). It
    /// waits for the engine thread: call it off the async threads.
    pub fn start_context(
        state: &Arc<AppState>,
        ctx: &Context,
        job: &Job,
        chat: bool,
        deadline: Deadline,
    ) -> Result<Run, ApiError> {
        let cap = capacity(1, job.req.max_tokens, job.stream);
        Self::begin(state, ctx.engine(), 1, cap, deadline, |sink, ids| {
            let mut req = job.req.clone();
            req.prompt = Prompt::Tokens(job.prompts[0].clone());
            ids.push(ctx.generate_with(req, chat, sink(0))?);
            Ok(())
        })
    }

    /// Takes a place in the queue and runs `submit`, which gets a maker of event sinks
    /// (one per prompt) and records the engine's request ids. On failure the run drops
    /// and cancels what was submitted.
    fn begin(
        state: &Arc<AppState>,
        engine: &Engine,
        choices: usize,
        capacity: usize,
        deadline: Deadline,
        submit: impl FnOnce(&dyn Fn(usize) -> Sink, &mut Vec<u64>) -> Result<(), EngineError>,
    ) -> Result<Run, ApiError> {
        let max = state.config.max_queue;
        if state
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max).then_some(q + 1)
            })
            .is_err()
        {
            return Err(ApiError::unavailable(
                format!("the server is busy: {max} requests are already waiting (--max-queue)"),
                1,
            ));
        }
        let (tx, rx) = channel(capacity);
        let overflowed = Arc::new(AtomicBool::new(false));
        let mut run = Run {
            overflowed: overflowed.clone(),
            state: state.clone(),
            engine: engine.clone(),
            ids: Vec::new(),
            rx,
            started: Instant::now(),
            deadline: deadline.get().map(|(at, limit)| (at.into(), limit)),
            queued: true,
            first: None,
            last: None,
            open: choices,
            ended: false,
            _held: None,
        };
        let sink = |p: usize| -> Sink {
            let (tx, overflowed, state) = (tx.clone(), overflowed.clone(), state.clone());
            Box::new(
                move |event| match tx.try_send(Tagged { prompt: p, event }) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) => {
                        if !overflowed.swap(true, Ordering::Relaxed) {
                            state.metrics.unread.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                "a client stopped reading its stream: its request is cancelled"
                            );
                        }
                        false
                    }
                    Err(TrySendError::Closed(_)) => false,
                },
            )
        };
        if let Err(e) = submit(&sink, &mut run.ids) {
            run.ended = true; // refused: nothing ran, nothing to count as cancelled
            for &id in &run.ids {
                run.engine.cancel(id);
            }
            return Err(e.into());
        }
        Ok(run)
    }

    /// Keeps `x` until the run is dropped: its answer sent, or its client gone.
    pub fn hold(&mut self, x: impl Send + Sync + 'static) {
        self._held = Some(Box::new(x));
    }

    /// Whether the run was cancelled because its client stopped reading.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    fn leave_queue(&mut self) {
        if std::mem::take(&mut self.queued) {
            self.state.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The next event, or `None` once every sample is done or one failed. The
    /// stream of a run whose engine stopped ends with an error event.
    pub async fn next(&mut self) -> Option<Tagged> {
        if self.ended {
            return None;
        }
        let got = match self.deadline {
            Some((at, limit)) => tokio::time::timeout_at(at, self.rx.recv())
                .await
                .map_err(|_| limit),
            None => Ok(self.rx.recv().await),
        };
        let t = match got {
            Ok(Some(t)) => t,
            Ok(None) => Tagged {
                prompt: 0,
                event: Event::Error(EngineError::Closed),
            },
            Err(limit) => {
                tracing::warn!("a request ran past --request-timeout ({limit:?}): stopped");
                self.state.metrics.timed_out.fetch_add(1, Ordering::Relaxed);
                Tagged {
                    prompt: 0,
                    event: Event::Error(EngineError::TimedOut { limit }),
                }
            }
        };
        self.leave_queue();
        let m = &self.state.metrics;
        let now = Instant::now();
        match &t.event {
            Event::Token { index, .. } => {
                if self.first.is_none() {
                    self.first = Some(now);
                    m.ttft.observe(now - self.started);
                }
                if t.prompt == 0 && *index == 0 {
                    if let Some(prev) = self.last {
                        m.per_token.observe(now - prev);
                    }
                    self.last = Some(now);
                }
            }
            Event::Done {
                index,
                finish,
                usage,
                queued,
                ..
            } => {
                m.finished(*finish);
                if *index == 0 {
                    m.queue.observe(*queued);
                    let p = usage.prompt_tokens as u64;
                    m.prompt_tokens.fetch_add(p, Ordering::Relaxed);
                    m.prefix_queries.fetch_add(p, Ordering::Relaxed);
                    m.prefix_hits
                        .fetch_add(usage.cached_tokens as u64, Ordering::Relaxed);
                }
                self.open -= 1;
                if self.open == 0 {
                    self.ended = true;
                    m.e2e.observe(now - self.started);
                }
            }
            Event::Error(_) => {
                self.ended = true;
                m.failed.fetch_add(1, Ordering::Relaxed);
                for &id in &self.ids {
                    self.engine.cancel(id);
                }
            }
            Event::PromptLogprobs(_) => {}
        }
        Some(t)
    }
}

/// Events a run may buffer for its client. Streamed: a few steps' worth for each of
/// its samples (one event per sample per step), so a client that reads keeps up, and
/// one that stops reading is cut off within a few hundred tokens. Answered whole:
/// every event its `choices` samples of at most `max_tokens` tokens can send (a
/// token's each, the prompt's log-probabilities, the end), never fewer.
/// (Within tokio's bound on a channel's size; a request's window and choices keep it
/// far below.)
pub fn capacity(choices: usize, max_tokens: usize, stream: bool) -> usize {
    let steps = 256 + 8 * choices;
    match stream {
        true => steps,
        false => steps
            .max(choices.saturating_mul(max_tokens.saturating_add(2)))
            .min(1 << 30),
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.leave_queue();
        if !self.ended {
            for &id in &self.ids {
                self.engine.cancel(id);
            }
            self.state.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::capacity;

    #[test]
    fn a_run_answered_whole_holds_every_event_and_a_stream_a_few_steps() {
        // 16 samples of 1000 tokens: each a token event per step, then its end.
        assert!(capacity(16, 1000, false) >= 16 * 1001);
        assert_eq!(capacity(16, 1000, true), 256 + 8 * 16);
        assert_eq!(capacity(1, 4, false), 264);
        // Never past what a channel may hold.
        let _ = tokio::sync::mpsc::channel::<u8>(capacity(usize::MAX / 16, usize::MAX, false));
    }
}
