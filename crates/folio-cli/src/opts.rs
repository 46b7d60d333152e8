//! Flags shared by every command: the model, threads, context, sampling.

use anyhow::{Context, Result};
use folio::kv::KvDtype;
use folio::{EngineConfig, Model, Prompt, Request, SamplingParams};
use std::path::{Path, PathBuf};

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
    /// Element type of the stored K/V: f16, f32, or q8_0 (8-bit values with one f16
    /// scale per head row: ~1.94x the tokens of f16 per byte at head size 64).
    #[arg(long, value_enum, default_value_t = KvDtypeArg::F16)]
    pub kv_dtype: KvDtypeArg,
    /// Persist snapshots here (paged cache): restored at start, their pages shared by
    /// any prompt that begins with them.
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// A disk tier under the pool (paged cache): every committed page is written
    /// behind to a file here and read back when a prompt's prefix is no longer in
    /// memory, also after a restart. One server per directory.
    #[arg(long, value_name = "DIR")]
    pub kv_disk: Option<PathBuf>,
    /// Most bytes the disk tier's files may take (suffixes K, M, G, KiB, MiB, GiB); the
    /// least recently used pages go first.
    #[arg(long, value_parser = parse_size, default_value = "4GiB", requires = "kv_disk")]
    pub kv_disk_size: u64,
    /// Round every matmul input to 8 bits as llama.cpp does, without folio's second
    /// pass over the outlier blocks (which puts folio ~30% nearer the exact model).
    #[arg(long)]
    pub llama_arithmetic: bool,
    /// Speculative decoding without a draft model: `auto` drafts a sample's next
    /// tokens from its own text and recent outputs where that pays, `off` never does.
    /// The output is the same token for token either way.
    #[arg(long, value_enum, default_value_t = SpecArg::Auto)]
    pub spec: SpecArg,
    /// Where the forward pass runs: `cpu`; `gpu` (a Vulkan adapter, a software one such
    /// as lavapipe included; an error without one); `auto`, a hardware GPU where
    /// there is one, else the CPU. A model, or a K/V type, the GPU path does not run
    /// stays on the CPU, with a log line.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// The GPU matmuls' work split: `wide` (many lanes share an output: what a GPU
    /// wants), `narrow` (a lane an output: what a software adapter runs fastest),
    /// `auto` (by the adapter's kind). The logits differ in their last bits.
    #[arg(long, value_enum, default_value_t = SplitArg::Auto)]
    pub gpu_split: SplitArg,
    /// Add the GPU matmuls' lane sums in workgroup memory even where the device has
    /// subgroups (the same bits; for measuring what subgroups are worth).
    #[arg(long)]
    pub gpu_no_subgroups: bool,
    /// Run each GPU matrix in a dispatch of its own, not Q, K and V (and gate and up)
    /// of one format in one, quantize 8-bit inputs apart from the norm before them, and
    /// give attention a workgroup a query head, not one for the heads that share a K/V
    /// head (the same bits; for measuring what the fusions are worth).
    #[arg(long)]
    pub gpu_no_fusion: bool,
    /// Time each GPU step dispatch by dispatch (timestamps between dispatches, which
    /// cost some time of their own) and print where the device's time went, by step
    /// size and kind of dispatch, with each matmul's weight GB/s: `bench` (its main
    /// model: the single-sequence and batch figures) and `generate` print it at the
    /// end; other commands ignore it.
    #[arg(long)]
    pub gpu_profile: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitArg {
    Auto,
    Wide,
    Narrow,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    Gpu,
    Auto,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecArg {
    Auto,
    Off,
}

impl SpecArg {
    pub fn mode(self) -> folio::SpecMode {
        match self {
            SpecArg::Auto => folio::SpecMode::Auto,
            SpecArg::Off => folio::SpecMode::Off,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtypeArg {
    F16,
    F32,
    /// 8-bit values, one f16 scale per head row, after a Hadamard rotation of the row
    /// (`d = amax / 127`, `q = round(x / d)`).
    #[value(name = "q8_0", alias = "q8")]
    Q8_0,
}

impl KvDtypeArg {
    pub fn dtype(self) -> KvDtype {
        match self {
            KvDtypeArg::F16 => KvDtype::F16,
            KvDtypeArg::F32 => KvDtype::F32,
            KvDtypeArg::Q8_0 => KvDtype::Q8,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvKind {
    Paged,
    Basic,
}

pub fn parse_size(s: &str) -> Result<u64, String> {
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

    /// The engine's settings from the flags. `--kv basic` gives each sequence one
    /// contiguous page of `--ctx` slots (preallocated, never shared): the contiguous
    /// layout through the same engine.
    /// The pool holds `--kv-pages`, `--kv-memory` worth, or `sequences` full-length
    /// sequences. The engine checks every size against the model and the machine.
    pub fn engine_config(&self, model: &Model, sequences: usize) -> Result<EngineConfig> {
        anyhow::ensure!(
            self.ctx >= 2,
            "--ctx is {}; it must be at least 2 (a prompt token and a generated one)",
            self.ctx
        );
        let window = self.ctx.min(model.config.context_length);
        let default_tokens = sequences.saturating_mul(window);
        let page_size = match self.kv {
            KvKind::Paged => self.page_size,
            KvKind::Basic => window,
        };
        anyhow::ensure!(
            self.snapshot_dir.is_none() || self.kv == KvKind::Paged,
            "--snapshot-dir needs the paged cache (--kv paged)"
        );
        anyhow::ensure!(
            self.kv_disk.is_none() || self.kv == KvKind::Paged,
            "--kv-disk needs the paged cache (--kv paged)"
        );
        Ok(EngineConfig {
            kv_pages: self.pool_pages(model, page_size, default_tokens)?,
            page_size,
            max_seq_tokens: Some(window),
            snapshot_dir: self.snapshot_dir.clone(),
            kv_dtype: self.kv_dtype.dtype(),
            speculative: self.spec.mode(),
            kv_disk: self.kv_disk.as_ref().map(|dir| folio::kv::DiskConfig {
                dir: dir.clone(),
                max_bytes: self.kv_disk_size,
            }),
            ..EngineConfig::default()
        })
    }

    /// Pages of the KV pool: `--kv-pages`, or `--kv-memory` worth, or enough for
    /// `default_tokens` tokens.
    pub fn pool_pages(
        &self,
        model: &Model,
        page_size: usize,
        default_tokens: usize,
    ) -> Result<usize> {
        anyhow::ensure!(page_size > 0, "--page-size is 0; it must be at least 1");
        let shape = model.pool_shape(0, page_size, self.kv_dtype.dtype());
        let pages = match (self.kv_pages, self.kv_memory) {
            (Some(n), _) => n,
            (None, Some(bytes)) => shape.pages_in(bytes),
            (None, None) => default_tokens.div_ceil(page_size),
        };
        anyhow::ensure!(
            pages > 0,
            "the KV pool has no pages: raise --kv-pages or --kv-memory (one page of {page_size} tokens takes {} bytes)",
            shape.page_bytes()
        );
        Ok(pages)
    }

    pub fn load(&self) -> Result<Model> {
        self.load_from(&self.path()?)
    }

    /// [`Self::load`], and the GPU's profile where `--gpu-profile` asks for one and
    /// the model runs on the GPU.
    pub fn load_profiled(&self) -> Result<(Model, Option<folio_gpu::Profile>)> {
        self.load_with(&self.path()?, self.gpu_profile)
    }

    /// The model at `path` on the device `--device` asks for (see the flag), with the
    /// arithmetic the flags ask for. On the GPU the CPU's weights are never packed; a
    /// model the GPU path does not run is loaded onto the CPU, with a warning.
    pub fn load_from(&self, path: &Path) -> Result<Model> {
        Ok(self.load_with(path, false)?.0)
    }

    /// The model at `path`, and the GPU's profile where `profile` asks for one and the
    /// model runs on the GPU.
    fn load_with(&self, path: &Path, profile: bool) -> Result<(Model, Option<folio_gpu::Profile>)> {
        let loading = || format!("loading {}", path.display());
        let Some(gpu) = self.gpu()? else {
            if self.gpu_split != SplitArg::Auto
                || self.gpu_no_subgroups
                || self.gpu_no_fusion
                || profile
            {
                tracing::warn!("--gpu-split, --gpu-no-subgroups, --gpu-no-fusion and --gpu-profile: the forward pass runs on the CPU, so they change nothing");
            }
            let m = Model::load(path, self.threads).with_context(loading)?;
            return Ok((self.arithmetic(m), None));
        };
        let mut profiled = None;
        let llama = self.llama_arithmetic;
        let onto = |g: &folio::gguf::Gguf, c: &folio::model::Config| {
            let mut b = folio_gpu::GpuBackend::load_from(gpu, g, c)?
                .with_llama_arithmetic(llama)
                .with_fused_matmuls(!self.gpu_no_fusion)
                .with_grouped_attention(!self.gpu_no_fusion)
                .with_subgroups(!self.gpu_no_subgroups)?
                .with_profile(profile);
            if self.gpu_split != SplitArg::Auto {
                b = b.with_wide_matmuls(self.gpu_split == SplitArg::Wide);
            }
            profiled = b.profile();
            Ok::<Box<dyn folio::model::Backend>, folio_gpu::GpuError>(Box::new(b))
        };
        let (m, placed) = Model::load_onto(path, self.threads, onto).with_context(loading)?;
        match placed {
            Ok(()) => {
                tracing::info!(backend = %m.backend().describe(), "the forward pass runs on the GPU")
            }
            Err(e) => tracing::warn!("{e}: running on the CPU"),
        }
        Ok((self.arithmetic(m), profiled))
    }

    /// The GPU `--device` asks for: `None` for the CPU (`auto` without a hardware
    /// adapter, with a log line); an error where `gpu` finds none.
    fn gpu(&self) -> Result<Option<folio_gpu::Gpu>> {
        let forced = match self.device {
            DeviceArg::Cpu => return Ok(None),
            DeviceArg::Gpu => true,
            DeviceArg::Auto if !folio_gpu::gpu_device_present() => {
                tracing::info!(
                    "--device auto: no GPU device here; the forward pass runs on the CPU"
                );
                return Ok(None);
            }
            DeviceArg::Auto => false,
        };
        match folio_gpu::Gpu::open(forced) {
            Ok(g) => Ok(Some(g)),
            Err(e) if forced => anyhow::bail!("--device gpu: {e}"),
            Err(e) => {
                tracing::info!("--device auto: {e}; the forward pass runs on the CPU");
                Ok(None)
            }
        }
    }

    /// `model` with the arithmetic the flags ask for.
    pub fn arithmetic(&self, model: Model) -> Model {
        if self.llama_arithmetic {
            model.llama_arithmetic()
        } else {
            model
        }
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
    /// A request for `prompt` with these settings; the seed comes from the clock when
    /// none was given.
    pub fn request(&self, prompt: Prompt) -> Request {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Request {
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
            ..Request::new(prompt)
        }
    }
}

/// An engine configuration error in terms of the flag that set it.
pub fn flag_error(e: &folio::EngineError) -> Option<String> {
    let folio::EngineError::Config { name, reason } = e else {
        return None;
    };
    let flag = match *name {
        "max_seq_tokens" => "--ctx",
        "kv_pages" => "--kv-pages (or --kv-memory)",
        "page_size" => "--page-size",
        "max_batch_tokens" => "--max-batch-tokens",
        other => other,
    };
    Some(format!("{flag}: {reason}"))
}

/// The GPU's profile (`--gpu-profile`) on stderr, or why there is none.
pub fn print_profile(args: &ModelArgs, profile: Option<&folio_gpu::Profile>) {
    match profile {
        Some(p) => eprint!("\n{}", p.report()),
        None if args.gpu_profile => {
            eprintln!("(--gpu-profile: no profile; the log says why: FOLIO_LOG=warn)")
        }
        None => {}
    }
}
