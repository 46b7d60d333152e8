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
use anyhow::Result;
use folio::tokenizer::Message;
use folio::{Engine, Prompt, Request, SamplingParams, SpecMode};
use serde_json::json;

const CODE: &str = r#"import csv

def load_orders(path):
    orders = []
    with open(path) as f:
        for row in csv.DictReader(f):
            orders.append({"id": int(row["id"]), "total": float(row["total"])})
    return orders

def sum_totals(orders):
    total = 0.0
    for order in orders:
        total += order["total"]
    return total

def largest(orders):
    best = None
    for order in orders:
        if best is None or order["total"] > best["total"]:
            best = order
    return best

if __name__ == "__main__":
    orders = load_orders("orders.csv")
    print("sum:", sum_totals(orders))
    print("largest:", largest(orders))
"#;

const PASSAGE: &str = "The lighthouse at Point Arena was built in 1870. An earthquake in 1906 \
damaged the tower so badly that it had to be torn down. A new tower, made of reinforced \
concrete, was finished in 1908 and stands 115 feet tall. Its first-order Fresnel lens was \
made in France and weighs more than six tons. The light was automated in 1977, and the \
keepers' houses are now rented to visitors. On a clear night the beam can be seen from \
25 miles out at sea.";

const JSON_IN: &str = r#"{"name":"Ada Lovelace","born":1815,"died":1852,"fields":["mathematics","computing"],"known_for":"the first published algorithm for a machine","father":"Lord Byron","country":"United Kingdom"}"#;

/// (kind, user message) of the replays whose answers repeat their input.
fn replays() -> Vec<(&'static str, String)> {
    vec![
        (
            "code edit",
            format!("Here is a Python file:\n\n{CODE}\nRename the variable `orders` to `items` everywhere and print the whole file again."),
        ),
        (
            "quotes",
            format!("{PASSAGE}\n\nQuote, word for word, every sentence of the passage above that contains a year."),
        ),
        (
            "JSON reformat",
            format!("Reformat this JSON with one key per line and two spaces of indentation:\n\n{JSON_IN}"),
        ),
        (
            "retrieval",
            format!("Document:\n{PASSAGE}\n\nQuestion: how tall is the tower and what is it made of? Answer by quoting the document."),
        ),
    ]
}

fn chat() -> Vec<String> {
    [
        "Tell me a short story about a cat who learns to sail.",
        "What are three good habits for staying healthy?",
        "Explain why the sky is blue to a ten-year-old.",
        "Give me ideas for a birthday party for my grandmother.",
        "Why do people enjoy gardening?",
        "Describe your perfect weekend.",
        "What makes a good teacher?",
        "How do bees make honey?",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

struct Run {
    rate: f64,
    ids: Vec<Vec<u32>>,
    drafted: u64,
    accepted: u64,
    drafts: u64,
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
    })
}

pub fn run_figures(report: &mut Report, args: &ModelArgs, reps: usize) -> Result<()> {
    println!();
    println!("Speculative decoding (greedy, 256 tokens each; drafts from the prompt and recent outputs):");
    println!("| workload | requests at once | spec off tok/s | spec auto tok/s | ratio | accepted / drafted | tokens per draft step |");
    println!("|----------|------------------|----------------|-----------------|-------|--------------------|-----------------------|");
    let mut cases: Vec<(String, Vec<String>, bool)> = replays()
        .into_iter()
        .map(|(k, m)| (k.to_string(), vec![m], false))
        .collect();
    let all: Vec<String> = replays().into_iter().map(|(_, m)| m).collect();
    let sixteen =
        |v: &[String]| -> Vec<String> { (0..16).map(|i| v[i % v.len()].clone()).collect() };
    cases.push(("all replays".into(), sixteen(&all), true));
    cases.push(("free chat".into(), chat(), false));
    cases.push(("free chat".into(), sixteen(&chat()), true));
    let mut rec = serde_json::Map::new();
    for (kind, messages, together) in cases {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        let (mut drafted, mut accepted, mut drafts) = (0, 0, 0);
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
        println!("  (rounds: auto {} | off {})", rounds(&on), rounds(&off));
        rec.insert(
            format!("{kind} x{n}"),
            json!({"auto": figure(a, &on), "off": figure(b, &off), "ratio": a / b,
                   "drafted": drafted, "accepted": accepted, "tokens_per_draft_step": per_step}),
        );
    }
    report.add("speculative", rec.into());
    Ok(())
}
