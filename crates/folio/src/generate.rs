//! One completion on one sequence: prefill (reusing whatever prefix the cache already
//! holds), then sample token by token until EOS, a stop string, `max_tokens` or a full
//! context. Text is streamed through a callback; a stop string is never emitted, not
//! even in part.

use crate::error::RunError;
use crate::model::{KvCache, Logits, Model, Sampler, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    Eos,
    /// A stop string appeared.
    Stop,
    /// `max_tokens` were generated or the context is full.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V were already in the cache (not recomputed).
    pub prefix_hit_tokens: usize,
    /// Prompt tokens that were computed.
    pub prefilled_tokens: usize,
    pub generated_tokens: usize,
    /// From the call to the first sampled token.
    pub ttft: Duration,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

impl Stats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prefilled_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Tokens per second after the first (each needs one decode step).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct Output {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    pub stats: Stats,
}

/// Generates a continuation of `prompt` into `cache`. Tokens the cache already holds
/// as a prefix of `prompt` are reused; the rest of the cache is dropped first. Every
/// piece of text is passed to `on_text` as soon as it is final.
pub fn generate<C: KvCache + ?Sized>(
    model: &Model,
    cache: &mut C,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Output, RunError> {
    let start = Instant::now();
    if prompt.is_empty() {
        return Err(RunError::EmptyPrompt);
    }
    if prompt.len() >= cache.capacity() {
        return Err(RunError::PromptTooLong {
            len: prompt.len(),
            capacity: cache.capacity(),
        });
    }
    // Reuse the longest cached prefix (never the last prompt token: its logits are
    // needed to sample from).
    let common = cache.reuse_prefix(prompt);
    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        prefix_hit_tokens: common,
        prefilled_tokens: prompt.len() - common,
        ..Default::default()
    };
    let mut logits = model.forward(cache, &prompt[common..], Logits::Last)?;
    stats.prefill_time = start.elapsed();

    let mut sampler = Sampler::new(params.sampling.clone());
    let mut history = prompt.to_vec();
    let mut ids = Vec::new();
    let mut out = TextOut::new(&params.stop);
    let tok = &model.tokenizer;
    let decode_start = Instant::now();
    let finish = loop {
        if ids.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let id = sampler.sample(&logits, &history);
        if ids.is_empty() {
            stats.ttft = start.elapsed();
        }
        ids.push(id);
        history.push(id);
        if tok.is_eog(id) && !params.ignore_eos {
            break FinishReason::Eos;
        }
        let (delta, stopped) = out.push(tok, id);
        if !delta.is_empty() {
            on_text(&delta);
        }
        if stopped {
            break FinishReason::Stop;
        }
        if ids.len() >= params.max_tokens || cache.len() + 1 > cache.capacity() {
            break FinishReason::Length;
        }
        logits = model.forward(cache, &[id], Logits::Last)?;
    };
    if finish != FinishReason::Stop {
        let tail = out.finish();
        if !tail.is_empty() {
            on_text(&tail);
        }
    }
    let text = out.text().to_string();
    stats.generated_tokens = ids.len();
    stats.decode_time = decode_start.elapsed();
    Ok(Output {
        ids,
        text,
        finish,
        stats,
    })
}

/// Generated text as it may be shown: the streaming UTF-8 decoder plus stop strings.
/// Text that could still turn into a stop string is held back; a stop string and
/// everything after it is never released.
pub struct TextOut {
    decoder: StreamDecoder,
    text: String,
    emitted: usize,
    stops: Vec<String>,
}

impl TextOut {
    pub fn new(stops: &[String]) -> Self {
        Self {
            decoder: StreamDecoder::default(),
            text: String::new(),
            emitted: 0,
            stops: stops.to_vec(),
        }
    }

    /// Adds token `id`: returns the text that became final (possibly empty) and whether
    /// a stop string appeared (the text then ends before it).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> (String, bool) {
        self.text.push_str(&self.decoder.push(tok, id));
        if let Some(at) = find_stop(&self.text, &self.stops, self.emitted) {
            self.text.truncate(at);
            let delta = self.text[self.emitted.min(at)..].to_string();
            self.emitted = at;
            return (delta, true);
        }
        let safe = self.text.len() - held_back(&self.text, &self.stops);
        if safe > self.emitted {
            let delta = self.text[self.emitted..safe].to_string();
            self.emitted = safe;
            return (delta, false);
        }
        (String::new(), false)
    }

    /// At the end without a stop: everything not yet released.
    pub fn finish(&mut self) -> String {
        self.text.push_str(&self.decoder.finish());
        let delta = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        delta
    }

    /// The stop strings.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// The text released so far.
    pub fn text(&self) -> &str {
        &self.text[..self.emitted]
    }
}

/// The byte offset of the first stop string that ends after `from`.
fn find_stop(text: &str, stops: &[String], from: usize) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let start = floor_char(text, from.saturating_sub(s.len()));
            text[start..].find(s.as_str()).map(|i| start + i)
        })
        .min()
}

/// How many bytes at the end of `text` could be the start of a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut keep = 0;
    for s in stops {
        for n in (1..s.len().min(text.len() + 1)).rev() {
            if n > keep
                && text.is_char_boundary(text.len() - n)
                && s.starts_with(&text[text.len() - n..])
            {
                keep = n;
                break;
            }
        }
    }
    keep
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_found_and_held_back() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(find_stop("abc EN", &stops, 0), None);
        assert_eq!(held_back("abc EN", &stops), 2);
        assert_eq!(find_stop("abc END", &stops, 4), Some(4));
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(find_stop("é\n\n", &stops, 2), Some(2));
    }
}
