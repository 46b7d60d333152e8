//! The OpenAI answer shapes both generation routes share: the `id`/`created`/`model`
//! head, `usage` (with `prompt_tokens_details.cached_tokens`, always), finish
//! reasons, and the two log-probability formats (chat's `content` list and the legacy
//! completions' parallel arrays). [`Tally`] gathers a run's events for an answer
//! that is not streamed, and counts usage for one that is.

use crate::run::Tagged;
use folio::tokenizer::Tokenizer;
use folio::{Event, FinishReason, TokenLogprob};
use serde_json::{json, Value};

/// What every answer object starts with.
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    pub fn new(prefix: &str, model: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let created = crate::clock::unix_now();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self {
            id: format!("{prefix}-{created:x}{n:08x}"),
            created,
            model: model.to_string(),
        }
    }

    /// `{"id", "object", "created", "model"}` plus `rest`'s fields.
    pub fn object(&self, object: &str, rest: Value) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
        });
        if let (Some(m), Value::Object(r)) = (v.as_object_mut(), rest) {
            m.extend(r);
        }
        v
    }
}

pub fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// A token's text (lossy where it is part of a UTF-8 sequence).
pub fn piece(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&tok.token_bytes(id)).into_owned()
}

/// Chat's log-probability entry of one token.
pub fn chat_logprob(tok: &Tokenizer, id: u32, lp: &TokenLogprob) -> Value {
    let entry = |id: u32, logprob: f32| json!({"token": piece(tok, id), "logprob": logprob, "bytes": tok.token_bytes(id)});
    let mut e = entry(id, lp.logprob);
    e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
    e
}

/// Character offsets into a choice's text, token by token: bytes that end inside a
/// UTF-8 sequence wait for the rest, so every token of one character starts at it.
#[derive(Debug, Clone, Default)]
pub struct Offsets {
    chars: usize,
    partial: Vec<u8>,
}

impl Offsets {
    /// Where text with these bytes starts; then moves past them.
    pub fn advance(&mut self, bytes: &[u8]) -> usize {
        let at = self.chars;
        self.partial.extend_from_slice(bytes);
        match std::str::from_utf8(&self.partial) {
            Ok(s) => {
                self.chars += s.chars().count();
                self.partial.clear();
            }
            Err(e) if e.error_len().is_some() => {
                // Invalid bytes: counted as the replacement characters the text shows.
                self.chars += String::from_utf8_lossy(&self.partial).chars().count();
                self.partial.clear();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.partial[..valid]);
                self.chars += s.chars().count();
                self.partial.drain(..valid);
            }
        }
        at
    }
}

/// The legacy completions' log-probabilities: parallel arrays over tokens, with
/// character offsets into the choice's text (`offsets` carries on from earlier
/// chunks). The first `echoed` tokens are the prompt's, shown as the echoed text has
/// them (special tokens as their text). A token without a figure (a prompt's first)
/// has nulls.
pub fn completion_logprobs(
    tok: &Tokenizer,
    tokens: &[(u32, Option<&TokenLogprob>)],
    echoed: usize,
    offsets: &mut Offsets,
) -> Value {
    let (mut pieces, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
    for (i, &(id, lp)) in tokens.iter().enumerate() {
        let mut bytes = tok.token_bytes(id);
        if i < echoed && bytes.is_empty() {
            // A control token: the echoed prompt shows its text.
            bytes = tok.decode_special(&[id]).into_bytes();
        }
        offs.push(offsets.advance(&bytes));
        pieces.push(String::from_utf8_lossy(&bytes).into_owned());
        lps.push(lp.map(|l| l.logprob));
        tops.push(lp.map(|l| {
            l.top
                .iter()
                .map(|&(t, v)| (piece(tok, t), json!(v)))
                .collect::<serde_json::Map<_, _>>()
        }));
    }
    json!({"tokens": pieces, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
}

/// One choice as it builds up.
#[derive(Default)]
pub struct Choice {
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<Option<TokenLogprob>>,
    pub finish: Option<FinishReason>,
}

/// A run's token counts: prompts once each (sample 0 reports them), completions of
/// every sample.
#[derive(Default)]
pub struct Counts {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

impl Counts {
    pub fn count(&mut self, ev: &Event) {
        if let Event::Done { index, usage, .. } = ev {
            self.completion_tokens += usage.completion_tokens;
            if *index == 0 {
                self.prompt_tokens += usage.prompt_tokens;
                self.cached_tokens += usage.cached_tokens;
            }
        }
    }

    pub fn usage(&self) -> Value {
        usage(
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
        )
    }
}

/// A run's events gathered for an answer that is not streamed: the choices (`n` per
/// prompt, choice `p * n + i`), the prompts' own log-probabilities, and the counts.
pub struct Tally {
    pub n: usize,
    pub choices: Vec<Choice>,
    pub prompt_logprobs: Vec<Option<Vec<TokenLogprob>>>,
    pub counts: Counts,
}

impl Tally {
    pub fn new(prompts: usize, n: usize) -> Self {
        Self {
            n,
            choices: (0..prompts * n).map(|_| Choice::default()).collect(),
            prompt_logprobs: vec![None; prompts],
            counts: Counts::default(),
        }
    }

    /// Takes one event (errors are the caller's to handle).
    pub fn add(&mut self, t: &Tagged) {
        self.counts.count(&t.event);
        match &t.event {
            Event::Token {
                index,
                id,
                text,
                logprob,
            } => {
                let c = &mut self.choices[t.prompt * self.n + index];
                c.text.push_str(text);
                c.ids.push(*id);
                c.logprobs.push(logprob.clone());
            }
            Event::Done {
                index,
                text,
                finish,
                ..
            } => {
                let c = &mut self.choices[t.prompt * self.n + index];
                c.text.push_str(text);
                c.finish = Some(*finish);
            }
            Event::PromptLogprobs(lp) => self.prompt_logprobs[t.prompt] = Some(lp.clone()),
            Event::Error(_) => {}
        }
    }

    pub fn usage(&self) -> Value {
        self.counts.usage()
    }
}

pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}
