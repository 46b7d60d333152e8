//! `folio`: the command line. Only this crate prints, parses flags or knows JSON.

mod bench;
mod bench_batch;
mod bench_contention;
mod bench_grammar;
mod bench_long;
mod bench_serve;
mod bench_spec;
mod chat;
mod figures;
mod generate;
mod opts;
mod report;
mod run;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "folio",
    version,
    about = "LLM inference built around a paged KV cache"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// An OpenAI-compatible HTTP server (completions, chat, streaming, metrics).
    Serve(serve::Args),
    /// One completion of a prompt (from the argument or standard input).
    Generate(generate::Args),
    /// A multi-turn chat in the terminal, using the model's chat template.
    Chat(chat::Args),
    /// Prefill and decode speed, with llama.cpp's figures from the same run when
    /// llama-cpp-python is installed.
    Bench(bench::Args),
    /// Runs an inferlet (a folio:inferlet component) once, printing what it emits.
    Run(run::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal, never in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FOLIO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Generate(a) => generate::run(a),
        Cmd::Chat(a) => chat::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Run(a) => run::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`folio generate … | head`): generation stopped at once;
            // exit as a process killed by SIGPIPE would, quietly.
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::from(141);
            }
            match e
                .downcast_ref::<folio::EngineError>()
                .and_then(opts::flag_error)
            {
                Some(msg) => eprintln!("error: {msg}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
