//! `folio chat`: a multi-turn conversation in the terminal, held in one engine
//! [`Context`]: each turn appends the user's message with the model's chat template and
//! generates the reply into the same context, so a turn computes only its new tokens.
//! Ctrl-C while an answer streams stops that answer and keeps the conversation; Ctrl-C
//! at the prompt, Ctrl-D or `/exit` leaves.

use crate::generate::{consume, stats_line};
use crate::opts::{ModelArgs, SamplingArgs};
use anyhow::Result;
use folio::{Context, Engine, EngineError, ErrorKind, Prompt};
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// An answer is streaming (Ctrl-C stops it rather than the session).
static ANSWERING: AtomicBool = AtomicBool::new(false);
/// Ctrl-C came while an answer was streaming.
static STOP: AtomicBool = AtomicBool::new(false);

/// What a line typed at the prompt asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    Empty,
    Exit,
    Reset,
    Help,
    Save(&'a str),
    /// A message for the model (a leading `//` sends a literal `/`).
    Message(&'a str),
    /// A slash command that does not exist, or lacks its argument: the error.
    Bad(String),
}

/// Parses one typed line.
pub fn parse(line: &str) -> Line<'_> {
    let line = line.trim_end();
    if line.trim().is_empty() {
        return Line::Empty;
    }
    if let Some(literal) = line.strip_prefix("//") {
        return Line::Message(&line[line.len() - literal.len() - 1..]);
    }
    let Some(cmd) = line.strip_prefix('/') else {
        return Line::Message(line);
    };
    let (name, arg) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
    let arg = arg.trim();
    match (name, arg.is_empty()) {
        ("exit" | "quit", true) => Line::Exit,
        ("reset", true) => Line::Reset,
        ("help", true) => Line::Help,
        ("save", false) => Line::Save(arg),
        ("save", true) => Line::Bad("/save needs a name: /save NAME".into()),
        ("exit" | "quit" | "reset" | "help", false) => {
            Line::Bad(format!("/{name} takes no argument"))
        }
        _ => Line::Bad(format!(
            "unknown command /{name} (/help lists them; // starts a message with /)"
        )),
    }
}

const HELP: &str = "/save NAME keeps a snapshot, /reset starts over, /exit (or Ctrl-D) quits; Ctrl-C stops an answer.";

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
    let config = a.model.engine_config(&model, 2)?;
    let engine = Engine::new(model, config)?;
    let mut ctx = start(&engine, &a.system)?;
    ctrlc::set_handler(|| {
        if ANSWERING.load(Ordering::SeqCst) {
            STOP.store(true, Ordering::SeqCst);
        } else {
            std::process::exit(130);
        }
    })?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("folio chat: type a message; {HELP}");
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let text = match parse(&line) {
            Line::Empty => continue,
            Line::Exit => break,
            Line::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Line::Bad(why) => {
                eprintln!("error: {why}");
                continue;
            }
            Line::Save(name) => {
                match ctx.save(name) {
                    Ok(()) => eprintln!("saved {name}"),
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
            Line::Reset => {
                ctx = start(&engine, &a.system)?;
                continue;
            }
            Line::Message(t) => t,
        };
        if let Err(e) = ctx.user(text) {
            report(&e);
            continue;
        }
        let req = a.sampling.request(Prompt::Tokens(Vec::new()));
        let started = Instant::now();
        STOP.store(false, Ordering::SeqCst);
        ANSWERING.store(true, Ordering::SeqCst);
        let stream = ctx.reply(req);
        let mut out = std::io::stdout().lock();
        let result = stream.map(|s| {
            consume(s, started, &|| STOP.load(Ordering::SeqCst), &mut |piece| {
                out.write_all(piece.as_bytes())?;
                out.flush()
            })
        });
        ANSWERING.store(false, Ordering::SeqCst);
        writeln!(out)?;
        match result {
            // stdout is gone (a closed pipe, a full disk): nothing more can be shown.
            Ok(Err(io)) => return Err(io.into()),
            Ok(Ok(r)) => {
                if r.interrupted {
                    eprintln!("(stopped; the conversation goes on)");
                }
                if let Some(e) = &r.error {
                    report(e);
                } else if a.stats && !r.interrupted {
                    eprintln!("[{}]", stats_line(&r));
                }
            }
            Err(e) => report(&e),
        }
    }
    Ok(())
}

/// An error of one turn; the session goes on.
fn report(e: &EngineError) {
    match e {
        EngineError::PromptTooLong { .. }
        | EngineError::PoolTooSmall { .. }
        | EngineError::TooLargeForPool { .. } => {
            eprintln!("error: {e}; /reset starts a new conversation")
        }
        _ if e.kind() == ErrorKind::Internal => eprintln!("error (internal): {e}"),
        _ => eprintln!("error: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_commands_are_parsed_and_unknown_ones_refused() {
        assert_eq!(parse("  "), Line::Empty);
        assert_eq!(parse("/exit"), Line::Exit);
        assert_eq!(parse("/quit"), Line::Exit);
        assert_eq!(parse("/reset"), Line::Reset);
        assert_eq!(parse("/save notes-1"), Line::Save("notes-1"));
        assert!(matches!(parse("/save"), Line::Bad(m) if m.contains("needs a name")));
        assert!(matches!(parse("/sav x"), Line::Bad(m) if m.contains("unknown command /sav")));
        assert!(matches!(parse("/reset now"), Line::Bad(_)));
        assert_eq!(parse("hello /save"), Line::Message("hello /save"));
        assert_eq!(
            parse("//etc/passwd is a file"),
            Line::Message("/etc/passwd is a file")
        );
    }
}
