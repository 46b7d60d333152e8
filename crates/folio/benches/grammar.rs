//! What constrained decoding costs: one sequence generating the same number of
//! tokens with and without a grammar (a JSON schema), alternating for 5 rounds,
//! and the time of one token mask alone. `cargo bench -p folio --bench grammar`.

mod shared;

use folio::grammar::{GrammarSpec, Grammars};
use folio::{Engine, EngineConfig, Model, Prompt, Request};
use serde_json::json;
use std::time::Instant;

fn main() {
    let path = shared::model_path();
    let threads = std::env::var("FOLIO_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let model = Model::load(&path, threads).expect("the default model (scripts/setup.sh)");
    println!("{} threads for the forward pass", model.threads());
    let vocab = model.config.vocab;
    let t = Instant::now();
    let gs = Grammars::new(&model.tokenizer, vocab).unwrap();
    println!(
        "token table: {:.1} ms (once per model)",
        t.elapsed().as_secs_f64() * 1e3
    );
    let schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 12, "maxItems": 12}},
        "required": ["items"], "additionalProperties": false});
    let spec = GrammarSpec::JsonSchema(schema);
    let t = Instant::now();
    let g = gs.compile(&spec).unwrap();
    println!("compile: {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    let engine = Engine::new(
        model,
        EngineConfig {
            kv_pages: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let prompt = "List twelve fruits as JSON:";
    let run = |grammar: Option<folio::grammar::Grammar>, max_tokens: usize| {
        let mut r = Request::new(Prompt::Text(prompt.into()));
        r.max_tokens = max_tokens;
        r.ignore_eos = true;
        r.sampling.temperature = 0.8;
        r.sampling.seed = 11;
        r.grammar = grammar;
        let t = Instant::now();
        let out = engine.submit(r).unwrap().collect_all().unwrap();
        (out[0].ids.clone(), t.elapsed().as_secs_f64())
    };
    let (ids, _) = run(Some(g.clone()), 400);
    let n = ids.len();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (a, ta) = run(Some(g.clone()), 400);
        let (_, tb) = run(None, a.len());
        with.push(a.len() as f64 / ta);
        without.push(a.len() as f64 / tb);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, wo) = (med(&mut with), med(&mut without));
    println!("generation of {n} tokens (prompt + decode, one sequence): with the grammar {w:.1} tok/s, without {wo:.1} tok/s ({:.1}% slower)", 100.0 * (1.0 - w / wo));
    // The mask alone, along the same output: computing the allowed set, applying it
    // to the logits, and advancing past the token.
    let mut g2 = g.clone();
    let mut logits = vec![0f32; vocab];
    let (mut t_allowed, mut t_apply, mut t_advance) = (0f64, 0f64, 0f64);
    for &id in &ids {
        logits.iter_mut().for_each(|l| *l = 0.0);
        let t = Instant::now();
        let a = g2.allowed().expect("a mask");
        t_allowed += t.elapsed().as_secs_f64();
        let t = Instant::now();
        a.apply(&mut logits);
        t_apply += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let ok = g2.advance(id);
        t_advance += t.elapsed().as_secs_f64();
        if !ok {
            break;
        }
    }
    let us = |t: f64| t * 1e6 / n as f64;
    println!(
        "per token over {n} tokens: allowed set {:.1} µs, applying it {:.1} µs, advancing {:.1} µs",
        us(t_allowed),
        us(t_apply),
        us(t_advance)
    );
}
