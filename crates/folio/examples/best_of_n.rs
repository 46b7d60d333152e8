//! Best-of-n via fork: compute a prompt once, fork the context n times (the prompt's
//! committed pages are shared, not copied), sample each fork, and keep the answer the
//! model itself scores highest (mean token log-probability).
//!
//! `cargo run --release -p folio --example best_of_n [MODEL.gguf]`

use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::model::{Model, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let engine = Engine::new(Model::load(path.as_ref(), 0)?, EngineConfig::default())?;
    let base = engine.context(None)?;
    base.system("You answer in one short sentence.")?;
    base.user("Give me a name for a friendly robot.")?;
    base.flush()?;
    let prompt = engine.stats()?.prefilled_tokens;
    let before = engine.stats()?;
    let mut best: Option<(f32, String)> = None;
    for i in 0..4 {
        let fork = base.fork()?;
        let mut r = Request::new(Prompt::Tokens(vec![]));
        r.max_tokens = 24;
        r.logprobs = Some(0);
        r.sampling = SamplingParams {
            temperature: 0.9,
            seed: i,
            ..Default::default()
        };
        let out = fork.reply(r)?.collect_all()?.remove(0);
        let score =
            out.logprobs.iter().map(|l| l.logprob).sum::<f32>() / out.logprobs.len().max(1) as f32;
        println!("candidate {i}: {:>7.3}  {}", score, out.text.trim());
        if best.as_ref().is_none_or(|b| score > b.0) {
            best = Some((score, out.text.trim().to_string()));
        }
    }
    let after = engine.stats()?;
    println!("best: {}", best.map(|b| b.1).unwrap_or_default());
    println!(
        "the {prompt}-token prompt was computed once; the 4 candidates together computed {} more \
         prompt tokens (each its own assistant header), sharing the prompt's pages",
        after.prefilled_tokens - before.prefilled_tokens
    );
    Ok(())
}
