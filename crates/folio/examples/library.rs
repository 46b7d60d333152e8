//! The README's library snippets, whole: an engine with a request and a context
//! (fork, reply, truncate, save), then one step below the engine (reserve, compute,
//! commit), on the default model. The test `readme::library_snippets_are_this_example`
//! holds the README's code blocks to the lines between the `// README` markers here.
//!
//! `cargo run --release -p folio --example library` (from the repository's root)

fn main() -> Result<(), Box<dyn std::error::Error>> {
    engine()?;
    step()?;
    Ok(())
}

#[rustfmt::skip]
fn engine() -> Result<(), Box<dyn std::error::Error>> {
    // README engine
    use folio::{Engine, EngineConfig, Model, Prompt, Request};
    let model = Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), 0)?;
    let engine = Engine::new(model, EngineConfig::default())?;
    let answers = engine.submit(Request::new(Prompt::Text("Once upon a time".into())))?.collect_all()?;
    let ctx = engine.context(None)?;
    ctx.system("You are terse.")?;
    ctx.user("Name a colour.")?;
    ctx.flush()?;                                        // computed once, pages committed
    let branch = ctx.fork()?;                            // O(1): committed pages shared, only the partial page copied
    let reply = branch.reply(Request::new(Prompt::Tokens(vec![])))?.collect_all()?;
    branch.truncate(3)?;                                 // roll back, even into a shared page
    ctx.save("colours")?;                                // pinned; persisted with snapshot_dir
    // README end
    println!("completion: {:?}\nreply in the fork: {:?}", answers[0].text, reply[0].text);
    Ok(())
}

#[rustfmt::skip]
fn step() -> Result<(), Box<dyn std::error::Error>> {
    let model = folio::Model::load("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), 0)?;
    let ids = model.tokenizer.encode("The capital of France is", true);
    // README step
    use folio::kv::{KvDtype, Logits, PagedKv};
    let mut kv = PagedKv::with_shape(model.pool_shape(512, 16, KvDtype::F16), 4096, &model.fingerprint());
    let mut table = kv.new_table(None);
    let step = kv.plan(&mut table, &ids, Logits::Last)?;          // slots reserved here, never in the model
    let logits = model.forward(&folio::Batch::one(step), kv.storage())?;
    kv.commit(&mut table)?;                                       // full pages hashed, deduplicated, indexed
    // README end
    let best = folio::model::sampler::argmax(&logits[0]);
    println!("next token after the prompt: {:?}", model.tokenizer.decode(&[best]));
    Ok(())
}
