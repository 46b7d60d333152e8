//! Draft and roll back: let the model draft a few tokens, keep the part a checker
//! accepts and truncate the rest (a rejected draft costs no recompute of what came
//! before, even when the rollback crosses into a committed, shared page).
//!
//! `cargo run --release -p folio --example draft_rollback [MODEL.gguf]`

use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::model::{Model, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let engine = Engine::new(Model::load(path.as_ref(), 0)?, EngineConfig::default())?;
    let ctx = engine.context(None)?;
    ctx.append_text("A list of fruits without the letter e: fig, kiwi,")?;
    ctx.flush()?;
    let mut kept = 0;
    for round in 0..6 {
        let held = ctx.info()?.seq_len;
        let mut r = Request::new(Prompt::Tokens(vec![]));
        r.max_tokens = 4;
        r.sampling = SamplingParams {
            temperature: 0.8,
            seed: round,
            ..Default::default()
        };
        let draft = ctx.generate(r)?.collect_all()?.remove(0);
        // The checker: accept the draft only if it has no letter 'e'.
        if draft.text.contains('e') {
            ctx.truncate(draft.ids.len())?;
            println!(
                "round {round}: rejected {:?}, rolled back to {held} tokens",
                draft.text
            );
        } else {
            kept += draft.ids.len();
            println!("round {round}: kept {:?}", draft.text);
        }
        assert!(ctx.info()?.seq_len >= held);
    }
    let all = ctx.tokens()?;
    println!(
        "final ({} tokens, {kept} drafted and kept): {}",
        all.len(),
        engine.model().tokenizer.decode(&all)
    );
    Ok(())
}
