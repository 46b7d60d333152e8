//! Helpers every benchmark file shares: medians of rounds, the list of rounds,
//! running an optional baseline tool, and one sequence's prefill and decode speed.
//! Bench files import this, never each other.

use anyhow::Result;
use folio::kv::{KvSeq, Logits};
use folio::model::sampler::argmax;
use folio::{forward_one, Engine, Event, Model, Request};
use std::time::Instant;

/// The text the prefill figures' prompts repeat.
const TEXT: &str = "The history of the printing press begins long before Gutenberg, with movable type made of baked clay and later cast in bronze. ";

/// A prompt of `n` tokens: [`TEXT`] over and over.
pub fn bench_prompt(model: &Model, n: usize) -> Vec<u32> {
    let base = model.tokenizer.encode(TEXT, false);
    base.iter().cycle().take(n).copied().collect()
}

/// Each round's figure, rounded, space-separated.
pub fn rounds(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The stdout of an optional baseline tool (`what` names it), or `None` with its stderr
/// printed when it fails: a missing baseline never stops folio's own figures.
pub fn baseline_output(cmd: &mut std::process::Command, what: &str) -> Result<Option<Vec<u8>>> {
    let out = cmd.output()?;
    if !out.status.success() {
        eprintln!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
        return Ok(None);
    }
    Ok(Some(out.stdout))
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Prefill tok/s of `prompt` into an empty sequence, then tok/s of `n` single-token
/// greedy decode steps after one token of context.
pub fn speeds<S: KvSeq>(
    model: &Model,
    seq: &mut S,
    prompt: &[u32],
    n: usize,
) -> Result<(f64, f64)> {
    seq.truncate(0);
    let t = Instant::now();
    forward_one(model, seq, prompt, Logits::Last)?;
    let pp = prompt.len() as f64 / t.elapsed().as_secs_f64();
    seq.truncate(0);
    let mut logits = forward_one(model, seq, &prompt[..1], Logits::Last)?;
    let t = Instant::now();
    for _ in 0..n {
        let next = argmax(&logits);
        logits = forward_one(model, seq, &[next], Logits::Last)?;
    }
    Ok((pp, n as f64 / t.elapsed().as_secs_f64()))
}

/// Decode tok/s of `reqs` run at once: tokens after each request's first, over the
/// time from the first token to the last; and each request's tokens.
pub fn decode_rate(engine: &Engine, reqs: Vec<Request>) -> Result<(f64, Vec<Vec<u32>>)> {
    let streams: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r))
        .collect::<Result<_, _>>()?;
    let handles: Vec<_> = streams
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let (mut first, mut last, mut ids) = (None, Instant::now(), Vec::new());
                for ev in s {
                    match ev {
                        Event::Token { id, .. } => {
                            let now = Instant::now();
                            first.get_or_insert(now);
                            last = now;
                            ids.push(id);
                        }
                        Event::Done { .. } | Event::Error(_) => break,
                        Event::PromptLogprobs(_) => {}
                    }
                }
                (first.unwrap_or(last), last, ids)
            })
        })
        .collect();
    let got: Vec<(Instant, Instant, Vec<u32>)> = handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))
        })
        .collect::<Result<_>>()?;
    let start = got.iter().map(|g| g.0).min().unwrap_or_else(Instant::now);
    let end = got.iter().map(|g| g.1).max().unwrap_or(start);
    let tokens: usize = got.iter().map(|g| g.2.len().saturating_sub(1)).sum();
    let secs = (end - start).as_secs_f64().max(1e-9);
    Ok((tokens as f64 / secs, got.into_iter().map(|g| g.2).collect()))
}
