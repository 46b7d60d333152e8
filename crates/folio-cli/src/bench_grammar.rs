//! `folio bench --grammar-figures`: what structured output costs. Decode tok/s of
//! JSON-schema requests against the same requests unconstrained (same prompts, the
//! same number of tokens), alone and 16 at once, taking turns (and which goes first)
//! each round; and the time to build the token table and to compile the schema.

use crate::figures::{decode_rate, median, rounds};
use crate::report::{figure, Report};
use anyhow::Result;
use folio::grammar::{GrammarSpec, Grammars};
use folio::{Engine, EngineConfig, Model, Prompt, Request};
use serde_json::json;
use std::time::Instant;

pub fn run(report: &mut Report, model: Model, page_size: usize, reps: usize) -> Result<()> {
    let t = Instant::now();
    let gs = Grammars::new(&model.tokenizer, model.config.vocab)?;
    let table_ms = t.elapsed().as_secs_f64() * 1e3;
    let schema = serde_json::json!({"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 8, "maxItems": 8},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "rating": {"type": "number", "minimum": 0, "maximum": 5}},
        "required": ["title", "tags", "year", "rating"], "additionalProperties": false});
    let spec = GrammarSpec::JsonSchema(schema);
    let mut compile = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        gs.compile(&spec)?;
        compile.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let grammar = gs.compile(&spec)?;
    let engine = Engine::new(
        model,
        EngineConfig {
            kv_pages: 2048,
            page_size,
            ..EngineConfig::default()
        },
    )?;
    println!();
    println!(
        "Structured output: token table {table_ms:.0} ms (once per model), schema compile {:.2} ms (median of 20)",
        median(&compile)
    );
    println!("| requests at once | constrained decode tok/s | unconstrained tok/s | ratio |");
    println!("|------------------|--------------------------|---------------------|-------|");
    let mut rec = serde_json::Map::new();
    rec.insert("token_table_ms".into(), json!(table_ms));
    rec.insert("schema_compile_ms".into(), json!(median(&compile)));
    for batch in [1usize, 16] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let (mut checked, mut masked) = (0u64, 0u64);
        // Even rounds run the constrained requests first, odd rounds the unconstrained
        // ones, replaying the round before's prompts (and so its constrained lengths:
        // the seeds fix every token): whichever goes first measured ~2% slower when
        // both runs were the same unconstrained requests.
        let mut lens: Vec<usize> = Vec::new();
        for round in 0..reps {
            let prompt =
                |i: usize| format!("Describe film number {} as JSON:", 100 * (round / 2) + i);
            let request = |i: usize| {
                let mut r = Request::new(Prompt::Text(prompt(i)));
                r.sampling.temperature = 0.8;
                r.sampling.seed = i as u64;
                r
            };
            let constrained = || -> Vec<Request> {
                (0..batch)
                    .map(|i| {
                        let mut r = request(i);
                        r.max_tokens = 300;
                        r.grammar = Some(grammar.clone());
                        r
                    })
                    .collect()
            };
            let plain = |lens: &[usize]| -> Vec<Request> {
                (0..batch)
                    .map(|i| {
                        let mut r = request(i);
                        r.max_tokens = lens[i].max(1);
                        r.ignore_eos = true;
                        r
                    })
                    .collect()
            };
            let mut run_constrained = || -> Result<Vec<usize>> {
                let before = engine.stats()?;
                let (rate, got) = decode_rate(&engine, constrained())?;
                let got: Vec<usize> = got.iter().map(Vec::len).collect();
                let after = engine.stats()?;
                checked += after.grammar_checked - before.grammar_checked;
                masked += after.grammar_masked - before.grammar_masked;
                with.push(rate);
                Ok(got)
            };
            if round % 2 == 0 {
                // Both runs find the prompts cached, a page of them at least (a prompt
                // shorter than a page is indexed once its page fills): the run that
                // came first would otherwise prefill them inside its decode window.
                let warm: Vec<Request> = (0..batch)
                    .map(|i| {
                        let mut r = request(i);
                        r.max_tokens = page_size.max(1);
                        r.ignore_eos = true;
                        r
                    })
                    .collect();
                decode_rate(&engine, warm)?;
                lens = run_constrained()?;
                without.push(decode_rate(&engine, plain(&lens))?.0);
            } else {
                without.push(decode_rate(&engine, plain(&lens))?.0);
                let again = run_constrained()?;
                anyhow::ensure!(
                    again == lens,
                    "the same constrained requests gave other lengths: {again:?} against {lens:?}"
                );
            }
        }
        let (w, wo) = (median(&with), median(&without));
        println!(
            "| {batch:>16} | {w:>24.1} | {wo:>19.1} | {:>4.1}% |",
            100.0 * w / wo
        );
        println!(
            "  (rounds: constrained {} | unconstrained {})",
            rounds(&with),
            rounds(&without)
        );
        let share = 100.0 * checked as f64 / (checked + masked).max(1) as f64;
        println!(
            "  (constrained samples decided without a mask: {checked} of {}, {share:.1}%)",
            checked + masked
        );
        rec.insert(
            format!("batch_{batch}"),
            json!({"constrained": figure(w, &with), "unconstrained": figure(wo, &without),
                   "samples_without_mask": checked, "samples_masked": masked}),
        );
    }
    report.add("grammar", rec.into());
    Ok(())
}
