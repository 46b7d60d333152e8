//! `folio chat`: a multi-turn conversation in the terminal. Each turn re-renders the
//! whole conversation with the model's chat template; the KV cache keeps the
//! conversation so far, so a turn prefills only its new tokens.

use crate::opts::{ModelArgs, SamplingArgs};
use anyhow::Result;
use folio::generate::generate;
use folio::tokenizer::Message;
use std::io::{BufRead, IsTerminal, Write};

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

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load()?;
    let template = model.tokenizer.chat_template()?;
    let params = a.sampling.params();
    let mut cache = a.model.cache(&model)?;
    let start: Vec<Message> = a.system.iter().map(|s| Message::new("system", s)).collect();
    let mut messages = start.clone();
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
                match cache.save(l["/save ".len()..].trim()) {
                    Ok(()) => eprintln!("saved"),
                    Err(e) => eprintln!("error: {e:#}"),
                }
                continue;
            }
            "/reset" => {
                messages = start.clone();
                cache.with(|c| c.truncate(0));
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", line));
        let prompt = template.render(&messages, true)?;
        let ids = model.tokenizer.encode(&prompt, true);
        let mut out = std::io::stdout().lock();
        let result = cache.with(|c| {
            generate(&model, c, &ids, &params, &mut |piece| {
                let _ = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
            })
        });
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                // The conversation outgrew the context, say: report it and let the user
                // go on (or /reset) rather than ending the session.
                messages.pop();
                eprintln!("error: {e}");
                continue;
            }
        };
        writeln!(out)?;
        if a.stats {
            eprintln!("[{}]", crate::generate::stats_line(&result.stats));
        }
        messages.push(Message::new("assistant", result.text.trim()));
    }
    Ok(())
}
