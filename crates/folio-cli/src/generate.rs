//! `folio generate`: one completion through the engine (the same request path, sampling,
//! stop and finish rules as every other caller), streamed to stdout, or one JSON object.

use crate::opts::{ModelArgs, SamplingArgs};
use anyhow::{Context as _, Result};
use folio::tokenizer::Message;
use folio::{Engine, EngineError, Event, FinishReason, Prompt, Stream, Usage};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The prompt; read from standard input when absent.
    pub prompt: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// Print TTFT, prefill and decode speed to stderr.
    #[arg(long)]
    pub stats: bool,
    /// Print one JSON object (ids, text, finish reason, stats) instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Save the sequence (prompt and completion) as a snapshot of this name; with
    /// `--snapshot-dir` it persists, and later runs whose prompt starts with it reuse
    /// its pages.
    #[arg(long, value_name = "NAME", requires = "snapshot_dir")]
    pub save_snapshot: Option<String>,
}

/// One streamed sample, as it ended.
#[derive(Debug, Default)]
pub struct Outcome {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    /// From the request to its first token.
    pub ttft: Duration,
    /// From the first token to the last.
    pub decode: Duration,
    /// Why the sample ended early, if it failed (what came before stays valid).
    pub error: Option<EngineError>,
    /// The caller asked it to stop (Ctrl-C in chat): the stream was dropped.
    pub interrupted: bool,
}

impl Outcome {
    pub fn prefill_tok_s(&self) -> f64 {
        let computed = self.usage.prompt_tokens - self.usage.cached_tokens;
        computed as f64 / self.ttft.as_secs_f64().max(1e-9)
    }

    /// Tokens per second after the first (each needs one decode step).
    pub fn decode_tok_s(&self) -> f64 {
        self.ids.len().saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Reads `stream` to its end, passing each piece of final text to `on_text`. A failed
/// `on_text` (a closed stdout, a full disk) is returned at once, and `stop()` turning
/// true ends the read; either drops the stream, which cancels the request. An engine
/// error ends the outcome with what came before it. `started` is when the request was
/// sent.
pub fn consume(
    stream: Stream,
    started: Instant,
    stop: &dyn Fn() -> bool,
    on_text: &mut dyn FnMut(&str) -> std::io::Result<()>,
) -> std::io::Result<Outcome> {
    let mut o = Outcome::default();
    let mut first = None;
    for ev in stream {
        if stop() {
            o.interrupted = true;
            return Ok(o);
        }
        match ev {
            Event::Token { id, text, .. } => {
                let now = Instant::now();
                if first.is_none() {
                    o.ttft = now - started;
                    first = Some(now);
                }
                o.decode = now - first.unwrap_or(now);
                o.ids.push(id);
                on_text(&text)?;
                o.text.push_str(&text);
            }
            Event::Done {
                text,
                finish,
                usage,
                ..
            } => {
                on_text(&text)?;
                o.text.push_str(&text);
                o.finish = Some(finish);
                o.usage = usage;
            }
            Event::Error(e) => {
                o.error = Some(e);
                return Ok(o);
            }
            Event::PromptLogprobs(_) => {} // never asked for here
        }
    }
    if o.finish.is_none() {
        o.error = Some(EngineError::Closed);
    }
    Ok(o)
}

pub fn run(a: Args) -> Result<()> {
    let prompt = match a.prompt {
        Some(p) => p,
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            s
        }
    };
    let (model, profile) = a.model.load_profiled()?;
    let text = if a.chat {
        model
            .tokenizer
            .chat_template()?
            .render(&[Message::new("user", &prompt)], true)?
    } else {
        prompt
    };
    let ids = model.tokenizer.try_encode(&text, true)?;
    // Checked before any work: a bad name would only fail after the whole generation.
    if let Some(name) = &a.save_snapshot {
        folio::kv::check_snapshot_name(name)?;
    }
    let config = a.model.engine_config(&model, 2)?;
    let engine = Engine::new(model, config)?;
    let req = a.sampling.request(Prompt::Tokens(ids.clone()));
    let seed = req.sampling.seed;
    // A context holds the sequence afterwards, so it can be saved as a snapshot.
    let ctx = engine.context(None)?;
    let started = Instant::now();
    let mut out = std::io::stdout().lock();
    let json = a.json;
    let result = match ctx.generate(req) {
        Ok(stream) => consume(stream, started, &|| false, &mut |piece| {
            if json || piece.is_empty() {
                return Ok(());
            }
            out.write_all(piece.as_bytes())?;
            out.flush()
        })?,
        // Refused before it started: still one JSON object with the error.
        Err(e) => Outcome {
            error: Some(e),
            ..Outcome::default()
        },
    };
    let mut error = result.error.clone().map(anyhow::Error::from);
    if error.is_none() {
        if let Some(name) = &a.save_snapshot {
            error = ctx.save(name).err().map(Into::into);
        }
    }
    let window = engine.window();
    if a.json {
        // Always one object: what was generated, and the error if there was one.
        let v = serde_json::json!({
            "prompt_ids": ids,
            "generated_ids": result.ids,
            "text": result.text,
            "finish_reason": result.finish.map(FinishReason::as_str),
            "seed": seed,
            "stats": stats_json(&result),
            "error": error.as_ref().map(|e| format!("{e:#}")),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
    }
    out.flush()?;
    if result.finish == Some(FinishReason::Length) && ids.len() + result.ids.len() >= window {
        eprintln!("(stopped: the context window of {window} tokens is full; --ctx sets it)");
    }
    if a.stats {
        eprintln!("{}", stats_line(&result));
    }
    crate::opts::print_profile(&a.model, profile.as_ref());
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub fn stats_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": o.usage.prompt_tokens,
        "prefix_hit_tokens": o.usage.cached_tokens,
        "prefilled_tokens": o.usage.prompt_tokens - o.usage.cached_tokens,
        "generated_tokens": o.ids.len(),
        "ttft_ms": o.ttft.as_secs_f64() * 1e3,
        "prefill_tok_s": o.prefill_tok_s(),
        "decode_tok_s": o.decode_tok_s(),
        "drafted_tokens": o.usage.drafted_tokens,
        "accepted_tokens": o.usage.accepted_tokens,
    })
}

pub fn stats_line(o: &Outcome) -> String {
    format!(
        "prompt {} tokens ({} from cache, {} prefilled) | TTFT {:.1} ms | prefill {:.1} tok/s | decode {:.1} tok/s over {} tokens | drafted {}, accepted {}",
        o.usage.prompt_tokens,
        o.usage.cached_tokens,
        o.usage.prompt_tokens - o.usage.cached_tokens,
        o.ttft.as_secs_f64() * 1e3,
        o.prefill_tok_s(),
        o.decode_tok_s(),
        o.ids.len(),
        o.usage.drafted_tokens,
        o.usage.accepted_tokens
    )
}
