//! An agent loop whose prompt only grows: each turn appends a tool result and asks for
//! the next step. The context keeps every earlier turn's K/V, so each turn computes
//! only its new tokens; the counters show it.
//!
//! `cargo run --release -p folio --example agent_loop [MODEL.gguf]`

use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::model::Model;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let engine = Engine::new(Model::load(path.as_ref(), 0)?, EngineConfig::default())?;
    let ctx = engine.context(None)?;
    ctx.system("You are a calculator agent. Reply with the next arithmetic step only.")?;
    let mut observation = "The task: add 17 and 25, then double the result.".to_string();
    for turn in 0..4 {
        ctx.user(&observation)?;
        let before = engine.stats()?;
        let t = Instant::now();
        let mut r = Request::new(Prompt::Tokens(vec![]));
        r.max_tokens = 24;
        let out = ctx.reply(r)?.collect_all()?.remove(0);
        let after = engine.stats()?;
        let info = ctx.info()?;
        println!(
            "turn {turn}: {} ms, computed {} new prompt tokens of {} held | {}",
            t.elapsed().as_millis(),
            after.prefilled_tokens - before.prefilled_tokens,
            info.seq_len,
            out.text.trim()
        );
        observation = format!("Tool result for turn {turn}: ok. Continue.");
    }
    Ok(())
}
