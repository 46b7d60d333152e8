//! `folio run PROG.wasm --input JSON`: one inferlet run on a local engine, its chunks
//! printed as they come (text as it is, each JSON chunk on a line of its own), with the same
//! sandbox as `folio serve` gives it.

use crate::opts::ModelArgs;
use anyhow::{Context as _, Result};
use folio::Engine;
use folio_inferlet::{Cancel, Chunk, Host, Limits};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The program: a component of the folio:inferlet world
    /// (scripts/build_inferlet.sh makes one from a .py file).
    pub program: PathBuf,
    /// The program's input, JSON.
    #[arg(long, default_value = "null")]
    pub input: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most seconds the run may take.
    #[arg(long, default_value_t = 300)]
    pub time_limit: u64,
    /// Print the run's figures (host calls, instantiation, time) to stderr.
    #[arg(long)]
    pub stats: bool,
}

pub fn run(a: Args) -> Result<()> {
    serde_json::from_str::<serde_json::Value>(&a.input).context("--input is not JSON")?;
    let bytes =
        std::fs::read(&a.program).with_context(|| format!("reading {}", a.program.display()))?;
    let model = a.model.load()?;
    let config = a.model.engine_config(&model, 8)?;
    let engine = Engine::new(model, config)?;
    let limits = Limits {
        run_time: Duration::from_secs(a.time_limit),
        ..Limits::default()
    };
    let host = Host::new(engine, limits)?;
    let program = host.compile(&bytes)?;
    let cancel = Cancel::default();
    {
        let c = cancel.clone();
        let _ = ctrlc::set_handler(move || c.cancel());
    }
    let permit = host.permit()?;
    // Whether the output ends a line (a JSON chunk starts one of its own).
    let line_start = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let ls = line_start.clone();
    let report = host.run(permit, &program, &a.input, None, &cancel, move |chunk| {
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = std::io::stdout().lock();
        let ok = match chunk {
            Chunk::Text(t) => {
                if !t.is_empty() {
                    ls.store(t.ends_with('\n'), Relaxed);
                }
                out.write_all(t.as_bytes())
            }
            Chunk::Json(v) => {
                let nl = if ls.swap(true, Relaxed) { "" } else { "\n" };
                writeln!(out, "{nl}{v}")
            }
        };
        ok.and_then(|()| out.flush()).is_ok()
    })?;
    if !line_start.load(std::sync::atomic::Ordering::Relaxed) {
        println!();
    }
    if a.stats {
        eprintln!(
            "host calls {}, instantiate {:.1} ms, run {:.1} ms",
            report.host_calls,
            report.instantiate.as_secs_f64() * 1e3,
            report.elapsed.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
