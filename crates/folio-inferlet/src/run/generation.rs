//! A run's generations: one or several contexts' generations started on the engine
//! and waited for together, within the run's deadline and cancellation, each
//! token's piece streamed to the caller when asked ([`RunState::generations`]).

use super::{guest_error, Answer, Chunk, CtxEntry, RunState, Stop};
use crate::bindings::folio::inferlet::types;
use folio::{EngineError, Event, FinishReason, Request};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};
use wasmtime::component::Resource;

impl RunState {
    /// Runs a generation on `ctx` to its end, within the run's deadline and
    /// cancellation; streams each piece to the caller when `stream`.
    pub(super) fn generation(
        &mut self,
        ctx: &Resource<CtxEntry>,
        req: Request,
        chat: bool,
        stream: bool,
    ) -> Answer<Outcome> {
        let mut all = self.generations(vec![(ctx, req, chat, stream)])?;
        Ok(all.pop().expect("one job, one answer"))
    }

    /// Runs generations on several contexts at once (the engine batches them, as
    /// it does a request's `n` samples), each to its end, within the run's deadline
    /// and cancellation. One job's failure (a busy context) is its own answer; the
    /// run stopping cancels them all.
    pub(super) fn generations(
        &mut self,
        jobs: Vec<(&Resource<CtxEntry>, Request, bool, bool)>,
    ) -> wasmtime::Result<Vec<Result<Outcome, types::Error>>> {
        let (tx, rx) = channel::<(usize, Event)>();
        let mut runs: Vec<Running> = Vec::with_capacity(jobs.len());
        for (i, (ctx, req, chat, stream)) in jobs.into_iter().enumerate() {
            let tx = tx.clone();
            let started = self
                .entry(ctx)?
                .ctx
                .generate_with(req, chat, move |ev| tx.send((i, ev)).is_ok());
            runs.push(Running::new(started.map_err(|e| guest_error(&e)), stream));
        }
        drop(tx);
        let cancel_all = |runs: &[Running], engine: &folio::Engine| {
            for r in runs.iter().filter(|r| r.result.is_none()) {
                engine.cancel(r.rid);
            }
        };
        while runs.iter().any(|r| r.result.is_none()) {
            let wait = self
                .deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
            let (i, ev) = match rx.recv_timeout(wait) {
                // Checked on every event too: while tokens keep coming the wait never
                // times out (the 2026-12-08 probe: a hang-up went unseen for 16 s).
                Ok(x) => match self.still_wanted() {
                    Ok(()) => x,
                    Err(stop) => {
                        cancel_all(&runs, &self.engine);
                        return Err(stop);
                    }
                },
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(stop) = self.still_wanted() {
                        cancel_all(&runs, &self.engine);
                        return Err(stop);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    for r in runs.iter_mut().filter(|r| r.result.is_none()) {
                        r.result = Some(Err(guest_error(&EngineError::Closed)));
                    }
                    break;
                }
            };
            let piece = match ev {
                Event::Token {
                    id, text, logprob, ..
                } => {
                    let r = &mut runs[i];
                    r.out.tokens.push(id);
                    if let Some(lp) = &logprob {
                        r.out.logprobs.push(lp.logprob);
                    }
                    r.probs.push(logprob);
                    r.out.text.push_str(&text);
                    text
                }
                Event::PromptLogprobs(lp) => {
                    runs[i].prompt = lp;
                    String::new()
                }
                Event::Done {
                    text,
                    finish,
                    usage,
                    ..
                } => {
                    let u = &mut self.usage;
                    u.prompt_tokens += usage.prompt_tokens;
                    u.cached_tokens += usage.cached_tokens;
                    u.completion_tokens += usage.completion_tokens;
                    let r = &mut runs[i];
                    r.out.text.push_str(&text);
                    r.out.finish = match finish {
                        FinishReason::Eos => types::Finish::Eos,
                        FinishReason::Stop => types::Finish::Stop,
                        FinishReason::Length => types::Finish::Length,
                    };
                    r.finish();
                    text
                }
                Event::Error(EngineError::TimedOut { .. }) => {
                    cancel_all(&runs, &self.engine);
                    return Err(self.halt(Stop::TimedOut));
                }
                Event::Error(e) => {
                    runs[i].result = Some(Err(guest_error(&e)));
                    String::new()
                }
            };
            if runs[i].stream && !piece.is_empty() {
                let n = piece.len();
                if let Err(e) = self.send(Chunk::Text(piece), n) {
                    cancel_all(&runs, &self.engine);
                    return Err(e);
                }
            }
        }
        Ok(runs
            .into_iter()
            .map(|r| r.result.expect("every job ended"))
            .collect())
    }
}

/// A finished generation: the guest's record, each token's log-probability (with
/// its alternatives when asked for), and the prompt's when scored.
pub(super) type Outcome = (
    types::Generation,
    Vec<Option<folio::TokenLogprob>>,
    Vec<folio::TokenLogprob>,
);

/// One generation of [`RunState::generations`] while it runs.
struct Running {
    rid: u64,
    stream: bool,
    out: types::Generation,
    probs: Vec<Option<folio::TokenLogprob>>,
    prompt: Vec<folio::TokenLogprob>,
    /// Set when it has ended (or never started).
    result: Option<Result<Outcome, types::Error>>,
}

impl Running {
    fn new(started: Result<u64, types::Error>, stream: bool) -> Self {
        let (rid, result) = match started {
            Ok(rid) => (rid, None),
            Err(e) => (0, Some(Err(e))),
        };
        Self {
            rid,
            stream,
            out: types::Generation {
                text: String::new(),
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: types::Finish::Length,
            },
            probs: Vec::new(),
            prompt: Vec::new(),
            result,
        }
    }

    fn finish(&mut self) {
        let out = std::mem::replace(
            &mut self.out,
            types::Generation {
                text: String::new(),
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: types::Finish::Length,
            },
        );
        let probs = std::mem::take(&mut self.probs);
        let prompt = std::mem::take(&mut self.prompt);
        self.result = Some(Ok((out, probs, prompt)));
    }
}
