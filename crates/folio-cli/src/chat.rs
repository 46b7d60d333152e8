//! `folio chat`: a multi-turn conversation in the terminal, held in one engine
//! [`Context`]: each turn appends the user's message with the model's chat template and
//! generates the reply into the same context, so a turn computes only its new tokens.

use crate::generate::{consume, stats_line};
use crate::opts::{ModelArgs, SamplingArgs};
use anyhow::Result;
use folio::{Context, Engine, Prompt};
use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    pub system: Option<String>,
    /// Print TTFT, prefill and decode speed after each answer.
    #[arg(long)]
    pub stats: bool,
}

/// A fresh conversation: the system message, if any.
fn start(engine: &Engine, system: &Option<String>) -> Result<Context> {
    let ctx = engine.context(None)?;
    if let Some(s) = system {
        ctx.system(s)?;
    }
    Ok(ctx)
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load()?;
    model.tokenizer.chat_template()?;
    let config = a.model.engine_config(&model, 2 * a.model.ctx)?;
    let engine = Engine::new(model, config)?;
    let mut ctx = start(&engine, &a.system)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("folio chat: type a message; /save NAME keeps a snapshot, /reset starts over, /exit or Ctrl-D quits.");
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim_end();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            l if l.starts_with("/save ") => {
                match ctx.save(l["/save ".len()..].trim()) {
                    Ok(()) => eprintln!("saved"),
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
            "/reset" => {
                ctx = start(&engine, &a.system)?;
                continue;
            }
            _ => {}
        }
        if let Err(e) = ctx.user(line) {
            // The conversation outgrew the context, say: report it and let the user
            // go on (or /reset) rather than ending the session.
            eprintln!("error: {e}");
            continue;
        }
        let req = a.sampling.request(Prompt::Tokens(Vec::new()));
        let started = Instant::now();
        let mut out = std::io::stdout().lock();
        let result = ctx.reply(req).map_err(anyhow::Error::from).and_then(|s| {
            consume(s, started, &mut |piece| {
                out.write_all(piece.as_bytes())?;
                out.flush()
            })
        });
        writeln!(out)?;
        match result {
            Ok(r) if a.stats => eprintln!("[{}]", stats_line(&r)),
            Ok(_) => {}
            Err(e) => eprintln!("error: {e:#}"),
        }
    }
    Ok(())
}
