//! The legacy completions' answer (`/v1/completions`, and a context's generation
//! when it holds no messages): the whole body from a run's [`Tally`], the streamed
//! chunks ([`Completions`]), and `echo` with nothing to generate. Choice `p * n + i`
//! is prompt `p`'s sample `i`; with `echo` each choice's text starts with its prompt.

use crate::answer::{
    completion_logprobs, finish_str, usage, usage_chunk, Choices, CompletionLogprobs, Head, Object,
    Offsets, TextChoice,
};
use crate::params::Job;
use crate::run::Tagged;
use crate::sse::{self, Chunker};
use crate::tally::{Counts, Tally};
use axum::response::{IntoResponse, Response};
use axum::Json;
use folio::tokenizer::Tokenizer;
use folio::{Engine, Event, TokenLogprob};

const OBJECT: &str = "text_completion";

/// A completion answer or chunk.
pub type Answer = Object<Choices<TextChoice>>;

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
pub fn echo_only(head: &Head, job: &Job) -> Response {
    let n = job.req.n;
    let choice = |i: usize| TextChoice {
        index: i,
        text: job.prompt_texts[i / n].clone(),
        logprobs: None,
        finish_reason: Some("length"),
    };
    let prompt: usize = job.prompts.iter().map(Vec::len).sum();
    let usage = usage(prompt, 0, 0);
    if job.stream {
        let mut chunks: Vec<Answer> = (0..job.choices())
            .map(|i| head.object(OBJECT, Choices::chunk(choice(i), job.include_usage)))
            .collect();
        chunks.extend(usage_chunk(head, OBJECT, job.include_usage, usage));
        return sse::fixed(&chunks);
    }
    let choices = (0..job.choices()).map(choice).collect();
    Json(head.object(OBJECT, Choices::whole(choices, usage))).into_response()
}

/// The body of a completion that is not streamed.
pub fn whole(tok: &Tokenizer, head: &Head, job: &Job, tally: &Tally) -> Answer {
    let n = job.req.n;
    let choices = tally
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
            toks.extend(
                c.ids
                    .iter()
                    .zip(&c.logprobs)
                    .map(|(&id, lp)| (id, lp.as_ref())),
            );
            let logprobs = job
                .logprobs
                .map(|_| completion_logprobs(tok, &toks, echoed, &mut Offsets::default()));
            TextChoice {
                index: i,
                text,
                logprobs,
                finish_reason: c.finish.map(finish_str),
            }
        })
        .collect();
    head.object(OBJECT, Choices::whole(choices, tally.usage()))
}

/// A streamed completion's chunks.
pub struct Completions {
    engine: Engine,
    head: Head,
    job: Job,
    /// Characters sent so far per choice (the logprobs' `text_offset`).
    offsets: Vec<Offsets>,
    counts: Counts,
}

impl Completions {
    pub fn new(engine: Engine, head: Head, job: Job) -> Self {
        Self {
            engine,
            offsets: vec![Offsets::default(); job.choices()],
            counts: Counts::default(),
            head,
            job,
        }
    }

    fn chunk(
        &self,
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> Answer {
        let choice = TextChoice {
            index,
            text,
            logprobs,
            finish_reason,
        };
        self.head
            .object(OBJECT, Choices::chunk(choice, self.job.include_usage))
    }
}

impl Chunker for Completions {
    type Chunk = Answer;

    fn start(&mut self) -> Vec<Answer> {
        if !self.job.echo || self.job.req.prompt_logprobs.is_some() {
            return Vec::new(); // an echo with log-probabilities waits for them
        }
        let n = self.job.req.n;
        (0..self.job.choices())
            .map(|i| {
                let text = self.job.prompt_texts[i / n].clone();
                self.offsets[i].advance(text.as_bytes());
                self.chunk(i, text, None, None)
            })
            .collect()
    }

    fn event(&mut self, t: Tagged) -> Vec<Answer> {
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
                vec![self.chunk(i, text, logprobs, None)]
            }
            Event::Done {
                index,
                text,
                finish,
                ..
            } => {
                let i = t.prompt * n + index;
                vec![self.chunk(i, text, None, Some(finish_str(finish)))]
            }
            Event::PromptLogprobs(lps) => {
                let p = t.prompt;
                (0..n)
                    .map(|k| {
                        let i = p * n + k;
                        let toks = prompt_tokens(&self.job.prompts[p], Some(&lps));
                        let lp = completion_logprobs(tok, &toks, toks.len(), &mut self.offsets[i]);
                        let text = self.job.prompt_texts[p].clone();
                        self.chunk(i, text, Some(lp), None)
                    })
                    .collect()
            }
            Event::Error(_) => Vec::new(),
        }
    }

    fn end(&mut self) -> Vec<Answer> {
        usage_chunk(
            &self.head,
            OBJECT,
            self.job.include_usage,
            self.counts.usage(),
        )
    }
}
