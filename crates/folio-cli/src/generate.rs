//! `folio generate`: one completion, streamed to stdout, or one JSON object.

use crate::opts::{ModelArgs, SamplingArgs};
use anyhow::{Context, Result};
use folio::generate::{generate, Stats};
use folio::tokenizer::Message;
use std::io::{Read, Write};

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
    let model = a.model.load()?;
    let text = if a.chat {
        model
            .tokenizer
            .chat_template()?
            .render(&[Message::new("user", &prompt)], true)?
    } else {
        prompt
    };
    let ids = model.tokenizer.encode(&text, true);
    let mut cache = a.model.cache(&model)?;
    let params = a.sampling.params();
    let mut out = std::io::stdout().lock();
    let mut io_err = None;
    let result = cache.with(|c| {
        generate(&model, c, &ids, &params, &mut |piece| {
            if !a.json && io_err.is_none() {
                if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                    io_err = Some(e);
                }
            }
        })
    })?;
    if let Some(e) = io_err {
        return Err(e.into());
    }
    if let Some(name) = &a.save_snapshot {
        cache.save(name)?;
    }
    if a.json {
        let v = serde_json::json!({
            "prompt_ids": ids,
            "generated_ids": result.ids,
            "text": result.text,
            "finish_reason": result.finish.as_str(),
            "seed": params.sampling.seed,
            "stats": stats_json(&result.stats),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
    }
    if a.stats {
        eprintln!("{}", stats_line(&result.stats));
    }
    Ok(())
}

pub fn stats_json(s: &Stats) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": s.prompt_tokens,
        "prefix_hit_tokens": s.prefix_hit_tokens,
        "prefilled_tokens": s.prefilled_tokens,
        "generated_tokens": s.generated_tokens,
        "ttft_ms": s.ttft.as_secs_f64() * 1e3,
        "prefill_tok_s": s.prefill_tok_s(),
        "decode_tok_s": s.decode_tok_s(),
    })
}

pub fn stats_line(s: &Stats) -> String {
    format!(
        "prompt {} tokens ({} from cache, {} prefilled) | TTFT {:.1} ms | prefill {:.1} tok/s | decode {:.1} tok/s over {} tokens",
        s.prompt_tokens,
        s.prefix_hit_tokens,
        s.prefilled_tokens,
        s.ttft.as_secs_f64() * 1e3,
        s.prefill_tok_s(),
        s.decode_tok_s(),
        s.generated_tokens
    )
}
