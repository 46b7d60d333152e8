//! [`Model`]: a loaded model. It owns the description (config, tokenizer, context
//! window, fingerprint) and the [`Backend`] its forward steps run on (the CPU one
//! unless [`Model::with_backend`] says otherwise); it checks every batch before a step
//! and leaves the arithmetic to the backend.

use super::backend::Backend;
use super::config::Config;
use super::cpu::CpuBackend;
use super::error::{ModelError, StepError};
use super::rope::LongRope;
use super::step_logits::StepLogits;
use super::weights::{rope_divisors, Weights};
use crate::gguf::Gguf;
use crate::kernels::{self, Cpu, Isa};
use crate::kv::{BasicCache, Batch, KvDtype, KvStorage, Logits, PageId, PoolShape, SeqStep};
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// The text run through a model at load to find its matmul inputs' outlier blocks
/// (`outliers`): prose, figures and code, as the inputs a model sees.
const CALIBRATION: &str = "The committee met on Tuesday, 14 March, to review the budget. \
Revenue rose 7.2% to $3.1 million, while costs fell. \"We expect growth to continue,\" \
said the chair.\n\nfn main() {\n    let total: u64 = (1..=10).sum();\n    \
println!(\"{total}\");\n}\n";

/// The most calibration tokens run.
const CALIBRATION_TOKENS: usize = 64;

/// A loaded model: config, tokenizer and the backend that runs it.
pub struct Model {
    pub config: Config,
    pub tokenizer: Tokenizer,
    backend: Box<dyn Backend>,
    /// Phi-3's long-context RoPE: the divisor set depends on the context window.
    longrope: Option<LongRope>,
    /// The most tokens one sequence holds, as configured ([`Model::with_context`]).
    n_ctx: usize,
    /// The file's hash; [`Model::fingerprint`] adds what the configuration changes in
    /// the K/V.
    file_fingerprint: [u8; 16],
}

impl Model {
    /// Loads a GGUF model onto the CPU backend; `threads` = 0 means all cores. More
    /// than [`kernels::pool::MAX_THREADS`] is [`ModelError::Pool`].
    pub fn load(path: &Path, threads: usize) -> Result<Self, ModelError> {
        let none = |_: &Gguf, _: &Config| Err::<Box<dyn Backend>, ()>(());
        Ok(Self::load_onto(path, threads, none)?.0)
    }

    /// Loads a GGUF model onto the backend `make` builds from the open file and the
    /// model's configuration (a GPU's). Where `make` gives none, its `Err` comes back
    /// beside the model, which is then on the CPU backend as [`Model::load`] makes it.
    /// The CPU's weights are packed only then: a model on another backend never
    /// holds a host copy of its matrices.
    pub fn load_onto<E>(
        path: &Path,
        threads: usize,
        make: impl FnOnce(&Gguf, &Config) -> Result<Box<dyn Backend>, E>,
    ) -> Result<(Self, Result<(), E>), ModelError> {
        // First, so that a refused thread count costs no weight loading.
        let cpu = Cpu::new(threads)?;
        let g = Gguf::open(path)?;
        // The whole file identifies the model (prefix hashes, snapshots).
        let fingerprint = g.fingerprint();
        let mut config = Config::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        let (rope_freqs, longrope) = rope_divisors(&g, &config)?;
        rope_factors(&mut config, rope_freqs, longrope.is_some())?;
        let (backend, arena, made) = match make(&g, &config) {
            Ok(backend) => (backend, None, Ok(())),
            Err(e) => {
                // Every matrix packed from here to the end of calibration (widened ones
                // too) is cut from one mapping on huge pages, in order: packed once,
                // never gathered after. Address space only: twice the tensors, for the
                // outlier pass's copies.
                let tensor_bytes = (g.tensors().iter()).fold(0u64, |n, t| n.saturating_add(t.size));
                let arena = kernels::matmul::WeightArena::enter(
                    usize::try_from(tensor_bytes.saturating_mul(2))
                        .unwrap_or(usize::MAX / 2)
                        .saturating_add(64 << 20),
                );
                let weights = Weights::load(&g, &config, cpu.isa())?;
                tracing::info!(
                    arch = %config.arch, layers = config.n_layers, dim = config.dim,
                    threads = cpu.threads(), isa = %cpu.isa(), "model loaded"
                );
                let cpu: Box<dyn Backend> = Box::new(CpuBackend::new(cpu, weights));
                (cpu, Some(arena), Err(e))
            }
        };
        let n_ctx = config.context_length;
        let mut model = Self {
            config,
            tokenizer,
            backend,
            longrope,
            n_ctx,
            file_fingerprint: fingerprint,
        }
        .with_context(n_ctx);
        // The CPU backend's calibration (nothing on another backend).
        model.calibrate();
        drop(arena);
        // Whatever was mapped on its own (the arena full or refused) joins one region.
        if let Some(cpu) = model.backend.as_cpu_mut() {
            cpu.gather();
        }
        Ok((model, made))
    }

    /// The same model on another backend, made from its current one (which the new one
    /// may wrap, or drop once it has what it needs). The bit-invariance tests hold every
    /// backend to [`super::backend`]'s contract; the fingerprint takes the new one's
    /// [`Backend::kv_signature`].
    pub fn with_backend(self, make: impl FnOnce(Box<dyn Backend>) -> Box<dyn Backend>) -> Self {
        let Model {
            config,
            tokenizer,
            backend,
            longrope,
            n_ctx,
            file_fingerprint,
        } = self;
        Model {
            backend: make(backend),
            config,
            tokenizer,
            longrope,
            n_ctx,
            file_fingerprint,
        }
    }

    /// What runs the steps, for logs and `bench`.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Picks the outlier blocks' second pass on the CPU backend by running the
    /// calibration text through it. A model whose vocabulary cannot run the prompt
    /// keeps llama.cpp's arithmetic.
    fn calibrate(&mut self) {
        let mut ids = self.tokenizer.encode(CALIBRATION, true);
        ids.truncate(CALIBRATION_TOKENS.min(self.config.context_length));
        if ids.is_empty() {
            return;
        }
        let c = &self.config;
        let mut kv = BasicCache::new(c.n_layers, c.kv_dim(), ids.len());
        let n = ids.len();
        let batch = Batch::one(SeqStep {
            tokens: ids,
            start: 0,
            pages: vec![PageId(0)],
            page_size: n,
            logits: Logits::All,
        });
        if self.check(&batch, &kv).is_err() {
            return;
        }
        if let Some(cpu) = self.backend.as_cpu_mut() {
            cpu.calibrate(&self.config, &batch, &mut kv);
        }
    }

    /// The same model with llama.cpp's arithmetic: no second pass over the outlier
    /// blocks (`outliers`; the matrices lose their extra columns), and on the scalar and
    /// AVX2 paths attention's value accumulators rounded to f16 after every key, as
    /// llama.cpp's flash attention keeps them. For the tests that hold folio to
    /// llama.cpp's numbers (`--llama-arithmetic`).
    pub fn llama_arithmetic(mut self) -> Self {
        if let Some(cpu) = self.backend.as_cpu_mut() {
            cpu.llama_arithmetic();
        }
        self
    }

    /// How many matmul inputs get the second pass over their outlier blocks (0: llama.cpp's
    /// arithmetic).
    pub fn outlier_passes(&self) -> usize {
        self.backend.as_cpu().map_or(0, CpuBackend::outlier_passes)
    }

    /// The same model configured for at most `n_ctx` tokens per sequence (capped at
    /// the metadata's `context_length`, which is also the default). The engine sets its
    /// window here, and its sequences never grow past it; `forward` itself does not
    /// check positions against it. Only Phi-3's long-context RoPE depends on it: the
    /// divisor set is chosen by `n_ctx` alone (see [`super::rope::LongRope`]), and the
    /// fingerprint names the set, so K/V cached or saved under one set is never reused
    /// under the other.
    pub fn with_context(mut self, n_ctx: usize) -> Self {
        self.n_ctx = n_ctx.min(self.config.context_length);
        if let Some(lr) = &self.longrope {
            let long = lr.is_long(self.n_ctx);
            self.config.rope.factors = lr.factors_for(self.n_ctx).map(<[f32]>::to_vec);
            tracing::info!(
                n_ctx = self.n_ctx,
                original = lr.n_ctx_orig,
                "longrope: the {} divisors",
                if long { "long" } else { "short" }
            );
        }
        self
    }

    /// The most tokens one sequence holds, as configured ([`Model::with_context`]).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The same model on another instruction-set path (tests and benchmarks compare
    /// them), its weights laid out for that path's kernels. A path this CPU does not
    /// run is replaced by the best one it runs below it, with a log line.
    pub fn with_isa(mut self, isa: Isa) -> Self {
        if let Some(cpu) = self.backend.as_cpu_mut() {
            cpu.set_isa(kernels::runnable_at_most(isa), true);
        }
        self
    }

    /// [`Model::with_isa`] without checking that the CPU runs the path: for tests that
    /// run it under an emulator.
    #[cfg(test)]
    pub(crate) fn with_isa_unchecked(mut self, isa: Isa) -> Self {
        if let Some(cpu) = self.backend.as_cpu_mut() {
            cpu.set_isa(isa, false);
        }
        self
    }

    /// The instruction-set path the CPU kernels take (the detected one where the
    /// backend is not the CPU's).
    pub fn isa(&self) -> Isa {
        self.backend
            .as_cpu()
            .map_or_else(kernels::isa, CpuBackend::isa)
    }

    /// Threads the forward pass uses.
    pub fn threads(&self) -> usize {
        self.backend.threads()
    }

    /// Bytes of weights one decode step reads (for bandwidth figures).
    pub fn bytes_per_token(&self) -> usize {
        self.backend.bytes_per_token()
    }

    /// A fingerprint of the model file, of the divisor set its context chose (for
    /// Phi-3's long-context RoPE: the two sets rotate K differently), and of the
    /// backend's arithmetic ([`Backend::kv_signature`]).
    pub fn fingerprint(&self) -> [u8; 16] {
        let set: &[u8] = match &self.longrope {
            None => b"",
            Some(lr) if lr.is_long(self.n_ctx) => b"longrope:long",
            Some(_) => b"longrope:short",
        };
        let backend = self.backend.kv_signature();
        if set.is_empty() && backend.is_empty() {
            return self.file_fingerprint;
        }
        let all = [&self.file_fingerprint[..], set, &backend].concat();
        xxhash_rust::xxh3::xxh3_128(&all).to_le_bytes()
    }

    /// The shape of a KV pool of `n_pages` pages of `page_size` tokens for this model.
    pub fn pool_shape(&self, n_pages: usize, page_size: usize, dtype: KvDtype) -> PoolShape {
        PoolShape {
            n_pages,
            page_size,
            n_layers: self.config.n_layers,
            kv_dim: self.config.kv_dim(),
            head_dim: self.config.head_dim,
            dtype,
        }
    }

    /// One forward step over a ragged batch: sequence `s` runs its tokens at positions
    /// `start..` through the pages the batch names. All token rows share every matmul
    /// (each weight is read once per step); attention reads each row's own sequence.
    /// Returns each sequence's logits (`vocab` per requested position). A sequence's
    /// logits are the same bits whatever else is in the batch. The batch is checked
    /// first: a refused batch writes nothing.
    pub fn forward(
        &self,
        batch: &Batch,
        kv: &mut dyn KvStorage,
    ) -> Result<Vec<Vec<f32>>, StepError> {
        let mut out = StepLogits::new();
        self.forward_into(batch, kv, &mut out)?;
        Ok(out.to_vecs())
    }

    /// [`Model::forward`] into `out`, a buffer the caller keeps from step to step (the
    /// engine's decode loop: see [`StepLogits`] for what a fresh one per step cost).
    /// On an error `out`'s contents are unspecified.
    pub fn forward_into(
        &self,
        batch: &Batch,
        kv: &mut dyn KvStorage,
        out: &mut StepLogits,
    ) -> Result<(), StepError> {
        self.check(batch, kv)?;
        self.backend.step(&self.config, batch, kv, out)
    }

    /// The most token rows one step may hold on this model's backend, if it has a limit
    /// ([`Backend::max_step_rows`]).
    pub fn max_step_rows(&self) -> Option<usize> {
        self.backend.max_step_rows()
    }

    /// Makes the backend ready for `kv`, a pool of pages of `page_size` slots, before
    /// its first step ([`Backend::prepare`]: a GPU allocates its copy of the pool).
    pub fn prepare(&self, kv: &mut dyn KvStorage, page_size: usize) -> Result<(), StepError> {
        self.backend.prepare(&self.config, kv, page_size)
    }

    /// Every token in the vocabulary, every sequence non-empty, and its pages present
    /// in `kv`, of its page size, covering every position up to its last new token.
    fn check(&self, batch: &Batch, kv: &dyn KvStorage) -> Result<(), StepError> {
        let vocab = self.config.vocab;
        for (s, st) in batch.seqs.iter().enumerate() {
            if st.tokens.is_empty() {
                return Err(StepError::Empty { seq: s });
            }
            if let Some(&bad) = st.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(StepError::BadToken(bad));
            }
            let bad = |reason: String| StepError::BadBatch { seq: s, reason };
            if st.page_size == 0 {
                return Err(bad("page size 0".into()));
            }
            let need = st.end().div_ceil(st.page_size);
            if st.pages.len() < need {
                return Err(bad(format!(
                    "{} pages cannot hold {} positions of {} slots each",
                    st.pages.len(),
                    st.end(),
                    st.page_size
                )));
            }
            for p in &st.pages[..need] {
                if p.0 as usize >= kv.num_pages() || kv.page_slots(p.0) != st.page_size {
                    return Err(bad(format!("page {} is not a page of the storage", p.0)));
                }
            }
        }
        Ok(())
    }
}

/// The per-frequency RoPE divisors into `config`: Llama 3's (`rope_freqs` or its
/// metadata) or Phi-3's long-context sets (`longrope`), never two of them.
fn rope_factors(
    config: &mut Config,
    rope_freqs: Option<Vec<f32>>,
    longrope: bool,
) -> Result<(), ModelError> {
    let twice = |reason: &str| ModelError::BadMetadata {
        key: format!("{}.rope.scaling.type", config.arch),
        reason: reason.into(),
    };
    if let Some(f) = rope_freqs {
        if config.rope.factors.is_some() {
            return Err(twice(
                "per-frequency factors given twice (metadata and rope_freqs)",
            ));
        }
        config.rope.factors = Some(f);
    }
    if longrope && config.rope.factors.is_some() {
        return Err(twice(
            "per-frequency factors given twice (llama3 or rope_freqs, and \
             rope_factors_short/long)",
        ));
    }
    Ok(())
}
