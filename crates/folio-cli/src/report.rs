//! The JSON record of one `folio bench` run (`--json PATH`): the machine it ran on
//! (CPU, kernel path, cores, threads, measured read bandwidth), the command line, the
//! commit, and each figure set's numbers (medians and every round) under its own key.
//! The tables on stdout and this record come from the same measurements;
//! `scripts/bench_plots.py` turns the record into plots and docs/BENCHMARKS.md.

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use std::path::Path;

#[derive(Default)]
pub struct Report {
    sections: Map<String, Value>,
}

impl Report {
    /// Files `value` under `section` (a later value of the same section replaces it).
    pub fn add(&mut self, section: &str, value: Value) {
        self.sections.insert(section.to_string(), value);
    }

    /// Writes the record: `machine` and `command` first, then every section.
    pub fn write(&self, path: &Path, machine: Value) -> Result<()> {
        let mut all = Map::new();
        all.insert("machine".into(), machine);
        all.insert(
            "command".into(),
            json!(std::env::args().collect::<Vec<_>>().join(" ")),
        );
        all.insert(
            "commit".into(),
            json!(command_line("git", &["rev-parse", "--short", "HEAD"])),
        );
        all.insert(
            "date".into(),
            json!(command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"])),
        );
        all.extend(self.sections.clone());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(
            path,
            serde_json::to_string_pretty(&Value::Object(all))? + "\n",
        )
        .with_context(|| format!("writing {}", path.display()))?;
        println!("\nwrote {}", path.display());
        Ok(())
    }
}

/// The machine as a benchmark record names it.
pub fn machine(threads: usize, bandwidth: f64) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    json!({
        "cpu": field("model name"),
        "cpu_family": field("cpu family"),
        "cpu_model": field("model"),
        "kernels": folio::machine::isa_name(),
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "threads": threads,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "memory_gib": total_memory_gib(),
    })
}

fn total_memory_gib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: f64 = text
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / (1024.0 * 1024.0))
}

/// The first line a command prints, or `None` when it cannot run.
fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_string)
}

/// A median and its rounds, as every section records figures.
pub fn figure(median: f64, rounds: &[f64]) -> Value {
    json!({"median": median, "rounds": rounds})
}
