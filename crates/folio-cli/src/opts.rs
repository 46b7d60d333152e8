//! Flags shared by every command: the model, threads, context, sampling.

use anyhow::{Context, Result};
use folio::generate::GenerateParams;
use folio::kv::{KvArena, KvDtype, PageTable, PagedKv};
use folio::model::{BasicCache, KvCache, Model, SamplingParams};
use std::path::PathBuf;

/// The default model's file name, as `scripts/setup.sh` fetches it.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file [default: $FOLIO_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Threads for the forward pass (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Context size in tokens (capped at the model's).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// KV cache: paged (pages from one pool, prefix sharing) or basic (one contiguous
    /// slab per sequence: the oracle).
    #[arg(long, value_enum, default_value_t = KvKind::Paged)]
    pub kv: KvKind,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Pages in the pool [default: twice what one full context needs].
    #[arg(long, conflicts_with = "kv_memory")]
    pub kv_pages: Option<usize>,
    /// Pool size in bytes (suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, value_parser = parse_size)]
    pub kv_memory: Option<u64>,
    /// Element type of the stored K/V.
    #[arg(long, value_enum, default_value_t = KvDtypeArg::F16)]
    pub kv_dtype: KvDtypeArg,
    /// Persist snapshots here (paged cache): restored at start, their pages shared by
    /// any prompt that begins with them.
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtypeArg {
    F16,
    F32,
}

impl KvDtypeArg {
    pub fn dtype(self) -> KvDtype {
        match self {
            KvDtypeArg::F16 => KvDtype::F16,
            KvDtypeArg::F32 => KvDtype::F32,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvKind {
    Paged,
    Basic,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        u => return Err(format!("unknown size unit {u:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// The KV cache of one sequence, of the kind the flags chose.
pub enum Cache {
    Basic(BasicCache),
    Paged(Box<PagedKv>, PageTable),
}

impl Cache {
    /// Pins the sequence's pages under `name` (written to `--snapshot-dir`).
    pub fn save(&mut self, name: &str) -> Result<()> {
        match self {
            Cache::Basic(_) => anyhow::bail!("snapshots need the paged cache (--kv paged)"),
            Cache::Paged(kv, t) => Ok(kv.save(name, t)?),
        }
    }

    /// Runs `f` on the cache as the model's `KvCache`.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut dyn KvCache) -> R) -> R {
        match self {
            Cache::Basic(c) => f(c),
            Cache::Paged(kv, t) => f(&mut kv.seq(t)),
        }
    }
}

impl ModelArgs {
    pub fn path(&self) -> Result<PathBuf> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        if let Some(p) = std::env::var_os("FOLIO_MODEL") {
            return Ok(PathBuf::from(p));
        }
        // ./models, then the models folder of the checkout the binary was built in.
        let mut candidates = vec![PathBuf::from("models").join(DEFAULT_MODEL)];
        if let Ok(exe) = std::env::current_exe() {
            for dir in exe.ancestors().skip(1) {
                candidates.push(dir.join("models").join(DEFAULT_MODEL));
            }
        }
        candidates.into_iter().find(|p| p.exists()).with_context(|| {
            format!("the default model {DEFAULT_MODEL} is not here: run scripts/setup.sh, or pass --model")
        })
    }

    /// A cache for one sequence of up to `--ctx` tokens.
    pub fn cache(&self, model: &Model) -> Result<Cache> {
        anyhow::ensure!(self.page_size > 0, "--page-size must be at least 1");
        anyhow::ensure!(
            self.snapshot_dir.is_none() || self.kv == KvKind::Paged,
            "--snapshot-dir needs the paged cache"
        );
        Ok(match self.kv {
            KvKind::Basic => Cache::Basic(model.new_cache_as(self.kv_dtype.dtype(), self.ctx)),
            KvKind::Paged => {
                let pages = self.pool_pages(model, 2 * self.ctx)?;
                let mut kv =
                    model.new_paged_as(self.kv_dtype.dtype(), pages, self.page_size, self.ctx);
                if let Some(dir) = &self.snapshot_dir {
                    let (restored, skipped) = kv
                        .open_snapshot_dir(dir)
                        .with_context(|| format!("snapshot directory {}", dir.display()))?;
                    for e in skipped {
                        eprintln!("warning: snapshot skipped: {e}");
                    }
                    tracing::info!(?restored, "snapshots restored");
                }
                let table = kv.new_table(None);
                Cache::Paged(Box::new(kv), table)
            }
        })
    }

    /// Pages of the KV pool: `--kv-pages`, or `--kv-memory` worth, or enough for
    /// `default_tokens` tokens.
    pub fn pool_pages(&self, model: &Model, default_tokens: usize) -> Result<usize> {
        anyhow::ensure!(self.page_size > 0, "--page-size must be at least 1");
        let c = &model.config;
        let pages = match (self.kv_pages, self.kv_memory) {
            (Some(n), _) => n,
            (None, Some(bytes)) => {
                (bytes
                    / KvArena::page_bytes(
                        c.n_layers,
                        self.page_size,
                        c.kv_dim(),
                        self.kv_dtype.dtype(),
                    ) as u64) as usize
            }
            (None, None) => default_tokens.div_ceil(self.page_size),
        };
        anyhow::ensure!(
            pages > 0,
            "the KV pool has no pages: raise --kv-pages or --kv-memory"
        );
        Ok(pages)
    }

    pub fn load(&self) -> Result<Model> {
        let path = self.path()?;
        Model::load(&path, self.threads).with_context(|| format!("loading {}", path.display()))
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p times the most likely one.
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for repeating recent tokens (1 = none).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed [default: from the clock].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long = "stop", value_name = "STR")]
    pub stop: Vec<String>,
    /// Keep going past the end-of-generation token.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    pub fn params(&self) -> GenerateParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                seed,
                ..SamplingParams::default()
            },
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        }
    }
}
