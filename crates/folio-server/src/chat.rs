//! The chat completions' answer (`/v1/chat/completions`, and a context's generation
//! when it holds messages): the whole body from a run's [`Tally`] (tool calls read
//! out of each choice's text), and the streamed chunks ([`Chat`]: a role chunk, then
//! content, or with tools the pieces `tool_stream` reads, then a finish chunk).

use crate::answer::{
    chat_logprob, finish_str, usage_chunk, ChatChoice, ChatLogprobs, Choices, ChunkChoice, Delta,
    FunctionDelta, Head, Message, Object, ToolCallDelta,
};
use crate::params::Job;
use crate::run::Tagged;
use crate::sse::Chunker;
use crate::tally::{Counts, Tally};
use crate::tool_stream::{Piece, ToolStream};
use crate::tools;
use folio::tokenizer::Tokenizer;
use folio::{Engine, Event, FinishReason};

const OBJECT: &str = "chat.completion";
const CHUNK: &str = "chat.completion.chunk";

/// A chat completion that is not streamed.
pub type Answer = Object<Choices<ChatChoice>>;

/// A streamed chat completion's chunk.
pub type Chunk = Object<Choices<ChunkChoice>>;

/// The finish reason of an output that holds tool calls: `length` when max_tokens cut
/// it short (a call's arguments may be incomplete), else `tool_calls`.
fn call_finish(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        FinishReason::Eos | FinishReason::Stop => "tool_calls",
    }
}

/// The body of a chat completion that is not streamed.
pub fn whole(tok: &Tokenizer, head: &Head, job: &Job, tally: &Tally) -> Answer {
    let choices = tally
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = job.logprobs.map(|_| ChatLogprobs {
                content: c
                    .ids
                    .iter()
                    .zip(&c.logprobs)
                    .filter_map(|(&id, lp)| lp.as_ref().map(|lp| chat_logprob(tok, id, lp)))
                    .collect(),
            });
            let found = job.tools.as_ref().and_then(|t| tools::extract(t, &c.text));
            let (message, finish_reason) = match found {
                Some((calls, rest)) => (
                    Message {
                        role: "assistant",
                        content: rest,
                        tool_calls: Some(tools::tool_calls(&calls, &head.id, i)),
                    },
                    // Cut short by max_tokens, a call's arguments may be incomplete.
                    Some(c.finish.map_or("tool_calls", call_finish)),
                ),
                None => (
                    Message {
                        role: "assistant",
                        content: Some(c.text.clone()),
                        tool_calls: None,
                    },
                    c.finish.map(finish_str),
                ),
            };
            ChatChoice {
                index: i,
                message,
                logprobs,
                finish_reason,
            }
        })
        .collect();
    head.object(OBJECT, Choices::whole(choices, tally.usage()))
}

/// A streamed chat completion's chunks.
pub struct Chat {
    engine: Engine,
    /// Per choice, the answer's content and calls as they stream (none without tools).
    tools: Vec<ToolStream>,
    head: Head,
    job: Job,
    counts: Counts,
}

impl Chat {
    pub fn new(engine: Engine, head: Head, job: Job) -> Self {
        Self {
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
        }
    }

    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Chunk {
        let choice = ChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish,
        };
        self.head
            .object(CHUNK, Choices::chunk(choice, self.job.include_usage))
    }

    /// The chunks for pieces of a choice's answer with tools.
    fn tool_chunks(&self, index: usize, pieces: Vec<Piece>) -> Vec<Chunk> {
        pieces
            .into_iter()
            .map(|p| {
                let delta = match p {
                    Piece::Content(text) => Delta::content(text),
                    Piece::Begin { k, name } => Delta::call(ToolCallDelta {
                        index: k,
                        id: Some(format!("call_{}_{index}_{k}", self.head.id)),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    }),
                    Piece::Args { k, text } => Delta::call(ToolCallDelta {
                        index: k,
                        id: None,
                        kind: None,
                        function: FunctionDelta {
                            name: None,
                            arguments: text,
                        },
                    }),
                };
                self.chunk(index, delta, None, None)
            })
            .collect()
    }

    /// A choice's last chunks: the rest of its text (or, with tools, of its pieces),
    /// then `{}` with the finish reason.
    fn done(&mut self, index: usize, text: String, finish: FinishReason) -> Vec<Chunk> {
        if let Some(s) = self.tools.get_mut(index) {
            let mut pieces = s.push(&text);
            pieces.extend(s.finish());
            let finish = match s.calls() {
                0 => finish_str(finish),
                _ => call_finish(finish),
            };
            let mut out = self.tool_chunks(index, pieces);
            out.push(self.chunk(index, Delta::default(), None, Some(finish)));
            return out;
        }
        let mut out = Vec::new();
        if !text.is_empty() {
            out.push(self.chunk(index, Delta::content(text), None, None));
        }
        out.push(self.chunk(index, Delta::default(), None, Some(finish_str(finish))));
        out
    }
}

impl Chunker for Chat {
    type Chunk = Chunk;

    fn start(&mut self) -> Vec<Chunk> {
        (0..self.job.choices())
            .map(|i| {
                // With tools, content stays null unless text comes (OpenAI's shape).
                let content = if self.tools.is_empty() {
                    Some(String::new())
                } else {
                    None
                };
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(content),
                    tool_calls: None,
                };
                self.chunk(i, delta, None, None)
            })
            .collect()
    }

    fn event(&mut self, t: Tagged) -> Vec<Chunk> {
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
                    (Some(lp), Some(_)) => Some(ChatLogprobs {
                        content: vec![chat_logprob(&self.engine.model().tokenizer, id, lp)],
                    }),
                    _ => None,
                };
                if text.is_empty() && lp.is_none() {
                    return Vec::new();
                }
                vec![self.chunk(index, Delta::content(text), lp, None)]
            }
            Event::Done {
                index,
                text,
                finish,
                ..
            } => self.done(index, text, finish),
            Event::PromptLogprobs(_) | Event::Error(_) => Vec::new(),
        }
    }

    fn end(&mut self) -> Vec<Chunk> {
        usage_chunk(
            &self.head,
            CHUNK,
            self.job.include_usage,
            self.counts.usage(),
        )
    }
}
