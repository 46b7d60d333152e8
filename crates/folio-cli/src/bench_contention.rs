//! `folio bench --contention`: prefill and decode of one sequence when the cores are
//! shared. Each round measures, in turn, the quiet machine, the same threads beside
//! one competing CPU-bound process (a shell busy loop), and one thread more than the
//! cores; medians over the rounds, with the ratio to quiet.

use crate::figures::{median, rounds, speeds};
use crate::opts::ModelArgs;
use anyhow::{Context as _, Result};
use folio::kv::{KvDtype, PagedKv};
use folio::Model;
use std::process::{Child, Command, Stdio};

/// A CPU-bound neighbour for as long as it lives.
struct Busy(Child);

impl Busy {
    fn start() -> Result<Self> {
        let child = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .spawn()
            .context("starting the competing busy loop (sh)")?;
        Ok(Self(child))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (prefill, decode) tok/s of `model` on a fresh paged sequence (16-token pages).
fn measure(model: &Model, prompt: &[u32], tg: usize) -> Result<(f64, f64)> {
    let max = prompt.len() + tg + 1;
    let shape = model.pool_shape(max.div_ceil(16) + 1, 16, KvDtype::F16);
    let mut kv = PagedKv::with_shape(shape, max, &model.fingerprint());
    let mut t = kv.new_table(None);
    speeds(model, &mut kv.seq(&mut t), prompt, tg)
}

pub fn run(args: &ModelArgs, prompt: &[u32], tg: usize, reps: usize) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let quiet_model = args.load()?;
    let threads = quiet_model.threads();
    let over = ModelArgs {
        threads: cores + 1,
        ..args.clone()
    }
    .load()?;
    let names = [
        format!("quiet, {threads} threads"),
        format!("{threads} threads + 1 busy process"),
        format!("{} threads on {cores} cores", cores + 1),
    ];
    let mut pp = vec![Vec::new(); 3];
    let mut tgs = vec![Vec::new(); 3];
    for _ in 0..reps {
        for (i, (pp, tgs)) in pp.iter_mut().zip(tgs.iter_mut()).enumerate() {
            let _busy = if i == 1 { Some(Busy::start()?) } else { None };
            let model = if i == 2 { &over } else { &quiet_model };
            let (p, t) = measure(model, prompt, tg)?;
            pp.push(p);
            tgs.push(t);
        }
    }
    println!();
    println!(
        "Under contention (medians of {reps} rounds, the three conditions in turn each round)"
    );
    println!(
        "| condition | pp{} tok/s | tg{tg} tok/s | tg vs quiet | rounds (tg) |",
        prompt.len()
    );
    println!("|-----------|------------|------------|-------------|-------------|");
    let quiet_tg = median(&tgs[0]);
    for ((name, pp), tgs) in names.iter().zip(&pp).zip(&tgs) {
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}x | {} |",
            median(pp),
            median(tgs),
            median(tgs) / quiet_tg,
            rounds(tgs)
        );
    }
    Ok(())
}
