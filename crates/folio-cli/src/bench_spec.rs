//! `folio bench --spec-figures`: speculative decoding without a draft model. Decode
//! tok/s with drafts (`--spec auto`) against without (`off`), greedy, on replays
//! whose answers repeat their input (a code edit, quoting a passage, reformatting
//! JSON, a retrieval answer that quotes) and on free chat, one request at a time and
//! 16 at once. Each round runs both modes on a fresh engine each (no prefix cache or
//! draft history carried over), the order swapped every round, and checks that both
//! gave the same tokens.

use crate::figures::{decode_rate, median, rounds};
use crate::opts::ModelArgs;
use crate::report::{figure, Report};
use anyhow::{Context, Result};
use folio::tokenizer::Message;
use folio::{Engine, Prompt, Request, SamplingParams, SpecMode};
use serde_json::json;

/// The workloads, shared with `scripts/bench_spec_servers.py` (folio's and llama.cpp's
/// servers on the same messages).
const WORKLOADS: &str = include_str!("../../../scripts/spec_workloads.json");

/// (kind, user message) of each replay whose answer repeats its input.
type Replays = Vec<(String, String)>;

/// The replays and the free chat messages.
fn workloads() -> Result<(Replays, Vec<String>)> {
    let w: serde_json::Value = serde_json::from_str(WORKLOADS)?;
    let replays = w["replays"]
        .as_array()
        .context("replays")?
        .iter()
        .map(|r| -> Result<(String, String)> {
            Ok((
                r["kind"].as_str().context("kind")?.to_string(),
                r["message"].as_str().context("message")?.to_string(),
            ))
        })
        .collect::<Result<_>>()?;
    let chat = w["chat"]
        .as_array()
        .context("chat")?
        .iter()
        .map(|m| m.as_str().map(str::to_string).context("a chat message"))
        .collect::<Result<_>>()?;
    Ok((replays, chat))
}

struct Run {
    rate: f64,
    ids: Vec<Vec<u32>>,
    drafted: u64,
    accepted: u64,
    drafts: u64,
    /// The engine's measured cost of an added row, at the end.
    row_cost: f32,
}

/// Decode tok/s of `messages` on a fresh engine in `mode`: one request at a time
/// (the rates' harmonic mean: total tokens over total decode time) or all at once.
fn run(
    args: &ModelArgs,
    mode: SpecMode,
    messages: &[String],
    together: bool,
    max_tokens: usize,
) -> Result<Run> {
    let model = args.load()?;
    let template = model.tokenizer.chat_template()?;
    let reqs: Vec<Request> = messages
        .iter()
        .map(|m| -> Result<Request> {
            let text = template.render(&[Message::new("user", m)], true)?;
            let mut r = Request::new(Prompt::Text(text));
            r.max_tokens = max_tokens;
            r.sampling = SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            };
            Ok(r)
        })
        .collect::<Result<_>>()?;
    let mut config = args.engine_config(&model, messages.len().max(2))?;
    config.speculative = mode;
    let engine = Engine::new(model, config)?;
    let (rate, ids) = if together {
        decode_rate(&engine, reqs)?
    } else {
        let (mut tokens, mut secs, mut ids) = (0.0, 0.0, Vec::new());
        for r in reqs {
            let (rate, mut got) = decode_rate(&engine, vec![r])?;
            let n = got[0].len().saturating_sub(1) as f64;
            tokens += n;
            secs += n / rate.max(1e-9);
            ids.append(&mut got);
        }
        (tokens / f64::max(secs, 1e-9), ids)
    };
    let st = engine.stats()?;
    Ok(Run {
        rate,
        ids,
        drafted: st.spec_drafted_tokens,
        accepted: st.spec_accepted_tokens,
        drafts: st.spec_drafts,
        row_cost: st.spec_row_cost,
    })
}

pub fn run_figures(report: &mut Report, args: &ModelArgs, reps: usize) -> Result<()> {
    println!();
    println!("Speculative decoding (greedy, 256 tokens each; drafts from the prompt and recent outputs):");
    println!("| workload | requests at once | spec off tok/s | spec auto tok/s | ratio | accepted / drafted | tokens per draft step |");
    println!("|----------|------------------|----------------|-----------------|-------|--------------------|-----------------------|");
    let (replays, chat) = workloads()?;
    let mut cases: Vec<(String, Vec<String>, bool)> = replays
        .iter()
        .map(|(k, m)| (k.clone(), vec![m.clone()], false))
        .collect();
    let all: Vec<String> = replays.into_iter().map(|(_, m)| m).collect();
    let sixteen =
        |v: &[String]| -> Vec<String> { (0..16).map(|i| v[i % v.len()].clone()).collect() };
    cases.push(("all replays".into(), sixteen(&all), true));
    cases.push(("free chat".into(), sixteen(&chat), true));
    cases.push(("free chat".into(), chat, false));
    let mut rec = serde_json::Map::new();
    for (kind, messages, together) in cases {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        let (mut drafted, mut accepted, mut drafts) = (0, 0, 0);
        let mut costs = Vec::new();
        for round in 0..reps {
            let mut pair = Vec::new();
            for first_on in [round % 2 == 0, round % 2 != 0] {
                let mode = if first_on {
                    SpecMode::Auto
                } else {
                    SpecMode::Off
                };
                pair.push((mode, run(args, mode, &messages, together, 256)?));
            }
            let (a, b) = (&pair[0].1, &pair[1].1);
            anyhow::ensure!(a.ids == b.ids, "{kind}: speculation changed the tokens");
            for (mode, r) in pair {
                costs.push(r.row_cost);
                if mode == SpecMode::Auto {
                    on.push(r.rate);
                    (drafted, accepted, drafts) = (
                        drafted + r.drafted,
                        accepted + r.accepted,
                        drafts + r.drafts,
                    );
                } else {
                    off.push(r.rate);
                }
            }
        }
        let (a, b) = (median(&on), median(&off));
        let n = if together { messages.len() } else { 1 };
        let share = accepted as f64 / drafted.max(1) as f64;
        let per_step = 1.0 + accepted as f64 / drafts.max(1) as f64;
        println!(
            "| {kind} | {n} | {b:.1} | {a:.1} | {:.2}x | {accepted} / {drafted} ({:.0}%) | {per_step:.2} |",
            a / b,
            100.0 * share
        );
        let costs: Vec<String> = costs.iter().map(|c| format!("{c:.3}")).collect();
        println!(
            "  (rounds: auto {} | off {}; a row's cost as measured, each run: {})",
            rounds(&on),
            rounds(&off),
            costs.join(" ")
        );
        rec.insert(
            format!("{kind} x{n}"),
            json!({"auto": figure(a, &on), "off": figure(b, &off), "ratio": a / b,
                   "drafted": drafted, "accepted": accepted, "tokens_per_draft_step": per_step,
                   "row_costs": costs}),
        );
    }
    report.add("speculative", rec.into());
    Ok(())
}
