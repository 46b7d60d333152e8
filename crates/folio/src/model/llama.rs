//! The llama-family forward pass: one step over a planned ragged [`Batch`] (each
//! sequence's new tokens: a whole prompt or a chunk of it in one matrix pass, or one
//! decode token), K/V written to and read from a [`KvStorage`] by page id; logits out.
//! The batch's pages are reserved by whoever planned it: a step never allocates.
//! Every architecture of [`super::config::Arch`] runs here: their differences are
//! branches per layer (or per step), none inside a token loop.

use super::attention::{attention_with, Heads, Scores};
use super::config::{Activation, Config};
use super::error::{ModelError, StepError};
use super::ops;
use super::outliers::{self, Outliers, Pass, Probe, Site};
use super::step_logits::StepLogits;
use super::weights::Weights;
use crate::gguf::Gguf;
use crate::kernels::{self, matmul, matmul_add, Activations, Isa, ThreadPool};
use crate::kv::{BasicCache, Batch, KvDtype, KvStorage, Logits, PageId, PoolShape, SeqStep};
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// The text run through a model at load to find its matmul inputs' outlier blocks
/// ([`outliers`]): prose, figures and code, as the inputs a model sees.
const CALIBRATION: &str = "The committee met on Tuesday, 14 March, to review the budget. \
Revenue rose 7.2% to $3.1 million, while costs fell. \"We expect growth to continue,\" \
said the chair.\n\nfn main() {\n    let total: u64 = (1..=10).sum();\n    \
println!(\"{total}\");\n}\n";

/// The most calibration tokens run.
const CALIBRATION_TOKENS: usize = 64;

/// A loaded model: config, weights, tokenizer and the threads that run it.
pub struct Model {
    pub config: Config,
    pub tokenizer: Tokenizer,
    weights: Weights,
    /// The second pass over each matmul input's outlier blocks (empty: llama.cpp's
    /// arithmetic).
    outliers: Outliers,
    pool: ThreadPool,
    isa: Isa,
    /// The most tokens one sequence holds, as configured ([`Model::with_context`]).
    n_ctx: usize,
    /// The file's hash; [`Model::fingerprint`] adds what the configuration changes in
    /// the K/V.
    file_fingerprint: [u8; 16],
}

impl Model {
    /// Loads a GGUF model; `threads` = 0 means all cores. More than
    /// [`kernels::pool::MAX_THREADS`] is [`ModelError::Pool`].
    pub fn load(path: &Path, threads: usize) -> Result<Self, ModelError> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        // First, so that a refused thread count costs no weight loading.
        let pool = ThreadPool::new(threads)?;
        let g = Gguf::open(path)?;
        // The whole file identifies the model (prefix hashes, snapshots).
        let fingerprint = xxhash_rust::xxh3::xxh3_128(g.bytes()).to_le_bytes();
        let mut config = Config::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        let mut weights = Weights::load(&g, &config)?;
        weights.lay_out_for(kernels::isa());
        if let Some(f) = &weights.rope_freqs {
            if config.rope.factors.is_some() {
                return Err(ModelError::BadMetadata {
                    key: format!("{}.rope.scaling.type", config.arch),
                    reason: "per-frequency factors given twice (metadata and rope_freqs)".into(),
                });
            }
            config.rope.factors = Some(f.clone());
        }
        if weights.longrope.is_some() && config.rope.factors.is_some() {
            return Err(ModelError::BadMetadata {
                key: format!("{}.rope.scaling.type", config.arch),
                reason: "per-frequency factors given twice (llama3 or rope_freqs, and \
                         rope_factors_short/long)"
                    .into(),
            });
        }
        tracing::info!(
            arch = %config.arch, layers = config.n_layers, dim = config.dim,
            threads, isa = %kernels::isa(), "model loaded"
        );
        let n_ctx = config.context_length;
        let model = Self {
            config,
            tokenizer,
            weights,
            outliers: Outliers::default(),
            pool,
            isa: kernels::isa(),
            n_ctx,
            file_fingerprint: fingerprint,
        }
        .with_context(n_ctx);
        let mut model = model.calibrated();
        model.weights.gather();
        Ok(model)
    }

    /// The model with a second pass over its matmul inputs' outlier blocks, picked by
    /// running [`CALIBRATION`] through it (see [`outliers`]). A model whose vocabulary
    /// cannot run the prompt keeps llama.cpp's arithmetic.
    fn calibrated(mut self) -> Self {
        /// Gives every matrix of an input the outlier columns, or none of them.
        fn extend<const N: usize>(p: &Pass, ms: [&mut kernels::QMatrix; N]) -> bool {
            let Some(wide) = ms.iter().map(|m| p.extend(m)).collect::<Option<Vec<_>>>() else {
                return false;
            };
            ms.into_iter().zip(wide).for_each(|(m, w)| *m = w);
            true
        }
        let mut ids = self.tokenizer.encode(CALIBRATION, true);
        ids.truncate(CALIBRATION_TOKENS.min(self.config.context_length));
        if ids.is_empty() {
            return self;
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
            return self;
        }
        let rows: Vec<(usize, usize)> = (0..n).map(|p| (0, p)).collect();
        let mut probe = Probe::new(c.n_layers);
        self.forward_rows(
            &mut kv,
            &batch,
            &rows,
            &mut StepLogits::new(),
            Some(&mut probe),
        );
        let d = c.dim;
        let mut o8 = Outliers::default();
        for (i, l) in self.weights.layers.iter_mut().enumerate() {
            let k = outliers::LAYER_BLOCKS;
            let p = Pass::new(&mut probe, Site::Attention(i), k, d);
            o8.attention
                .push(p.filter(|p| extend(p, [&mut l.wq, &mut l.wk, &mut l.wv])));
            let p = Pass::new(&mut probe, Site::FeedForward(i), k, d);
            o8.feed_forward
                .push(p.filter(|p| extend(p, [&mut l.w_gate, &mut l.w_up])));
        }
        let p = Pass::new(&mut probe, Site::Head, outliers::HEAD_BLOCKS, d);
        o8.head = p.filter(|p| extend(p, [self.weights.head_mut()]));
        self.outliers = o8;
        tracing::info!(
            inputs = self.outliers.count(),
            head_blocks = ?self.outliers.head.as_ref().map(Pass::blocks),
            "second pass over the outlier blocks"
        );
        self
    }

    /// The same model with llama.cpp's arithmetic: no second pass over the outlier
    /// blocks ([`outliers`]; the matrices lose their extra columns). For the tests that
    /// hold folio to llama.cpp's numbers.
    pub fn llama_arithmetic(mut self) -> Self {
        let o8 = std::mem::take(&mut self.outliers);
        let restore = |p: &Option<Pass>, ms: &mut [&mut kernels::QMatrix]| {
            if let Some(p) = p {
                ms.iter_mut().for_each(|m| **m = p.restore(m));
            }
        };
        for ((l, a), f) in self
            .weights
            .layers
            .iter_mut()
            .zip(&o8.attention)
            .zip(&o8.feed_forward)
        {
            restore(a, &mut [&mut l.wq, &mut l.wk, &mut l.wv]);
            restore(f, &mut [&mut l.w_gate, &mut l.w_up]);
        }
        restore(&o8.head, &mut [self.weights.head_mut()]);
        self
    }

    /// How many matmul inputs get the second pass over their outlier blocks (0: llama.cpp's
    /// arithmetic).
    pub fn outlier_passes(&self) -> usize {
        self.outliers.count()
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
        if let Some(lr) = &self.weights.longrope {
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
        self.isa = kernels::runnable_at_most(isa);
        self.weights.lay_out_for(self.isa);
        self.weights.gather();
        self
    }

    /// [`Model::with_isa`] without checking that the CPU runs the path: for tests that
    /// run it under an emulator.
    #[cfg(test)]
    pub(crate) fn with_isa_unchecked(mut self, isa: Isa) -> Self {
        self.isa = isa;
        self.weights.lay_out_for(isa);
        self
    }

    /// The instruction-set path the kernels take.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Threads the forward pass uses.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Bytes of weights one decode step reads (for bandwidth figures).
    pub fn bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token()
    }

    /// A fingerprint of the model file (and of the divisor set its context chose, for
    /// Phi-3's long-context RoPE: the two sets rotate K differently).
    pub fn fingerprint(&self) -> [u8; 16] {
        let set: &[u8] = match &self.weights.longrope {
            None => b"",
            Some(lr) if lr.is_long(self.n_ctx) => b"longrope:long",
            Some(_) => b"longrope:short",
        };
        let passes = self.outliers.signature();
        if set.is_empty() && passes.is_empty() {
            return self.file_fingerprint;
        }
        let all = [&self.file_fingerprint[..], set, &passes].concat();
        xxhash_rust::xxh3::xxh3_128(&all).to_le_bytes()
    }

    /// The shape of a KV pool of `n_pages` pages of `page_size` tokens for this model.
    pub fn pool_shape(&self, n_pages: usize, page_size: usize, dtype: KvDtype) -> PoolShape {
        PoolShape {
            n_pages,
            page_size,
            n_layers: self.config.n_layers,
            kv_dim: self.config.kv_dim(),
            dtype,
        }
    }

    /// One forward step over a ragged batch: sequence `s` runs its tokens at positions
    /// `start..` through the pages the batch names. All token rows share every matmul
    /// (each weight is read once per step); attention reads each row's own sequence.
    /// Returns each sequence's logits (`vocab` per requested position). A sequence's
    /// logits are the same bits whatever else is in the batch. The batch is checked
    /// first: a refused batch writes nothing.
    pub fn forward<S: KvStorage + ?Sized>(
        &self,
        batch: &Batch,
        kv: &mut S,
    ) -> Result<Vec<Vec<f32>>, StepError> {
        let mut out = StepLogits::new();
        self.forward_into(batch, kv, &mut out)?;
        Ok(out.to_vecs())
    }

    /// [`Model::forward`] into `out`, a buffer the caller keeps from step to step (the
    /// engine's decode loop: see [`StepLogits`] for what a fresh one per step cost).
    /// On an error `out`'s contents are unspecified.
    pub fn forward_into<S: KvStorage + ?Sized>(
        &self,
        batch: &Batch,
        kv: &mut S,
        out: &mut StepLogits,
    ) -> Result<(), StepError> {
        self.check(batch, kv)?;
        let rows: Vec<(usize, usize)> = batch
            .seqs
            .iter()
            .enumerate()
            .flat_map(|(s, st)| (st.start..st.end()).map(move |p| (s, p)))
            .collect();
        self.forward_rows(kv, batch, &rows, out, None);
        if !out.all_finite(&self.pool) {
            return Err(StepError::NonFinite);
        }
        Ok(())
    }

    /// Every token in the vocabulary, every sequence non-empty, and its pages present
    /// in `kv`, of its page size, covering every position up to its last new token.
    fn check<S: KvStorage + ?Sized>(&self, batch: &Batch, kv: &S) -> Result<(), StepError> {
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

    fn forward_rows<S: KvStorage + ?Sized>(
        &self,
        kv: &mut S,
        batch: &Batch,
        rows: &[(usize, usize)],
        out: &mut StepLogits,
        mut probe: Option<&mut Probe>,
    ) {
        let steps = &batch.seqs;
        let c = &self.config;
        let n = rows.len();
        let (d, qd, kvd, f, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.head_dim);
        let w = &self.weights;
        let heads = Heads {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
        };

        let mut x = vec![0f32; n * d];
        let tokens = steps.iter().flat_map(|s| s.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            w.embed.dequant_row(t as usize, row);
            if let Some(s) = c.embed_scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
        // Each row's cos/sin, per RoPE the layers use (Gemma's local layers have one
        // of their own).
        let table = |rope: &super::rope::Rope| {
            let mut t = vec![Vec::new(); n];
            for (t, &(_, pos)) in t.iter_mut().zip(rows) {
                rope.table(pos, t);
            }
            t
        };
        let tables = table(&c.rope);
        let tables_local = c.rope_local.as_ref().map(table);
        let (mut q, mut k, mut v) = (vec![0f32; n * qd], vec![0f32; n * kvd], vec![0f32; n * kvd]);
        let mut att = vec![0f32; n * qd];
        // Only a norm after a residual branch's matmul needs its output apart.
        let post_norms =
            (w.layers.iter()).any(|l| l.post_attn_norm.is_some() || l.post_ffn_norm.is_some());
        let mut o = vec![0f32; if post_norms { n * d } else { 0 }];
        let (mut gate, mut up) = (vec![0f32; n * f], vec![0f32; n * f]);
        let mut act = Activations::default();
        let o8 = &self.outliers;

        // Element-wise steps split their rows over the threads when there are many
        // (prefill); each row is computed the same way either way.
        let pool = &self.pool;
        let par = kernels::matmul::PARALLEL_ROWS;
        // A matmul input: `x`'s rows normed by `g`, each followed by its outlier
        // blocks' residuals where the input has a pass.
        let normed = |act: &mut Activations,
                      x: &[f32],
                      picked: &[usize],
                      g: &[f32],
                      pass: Option<&Pass>,
                      ws: &[&kernels::QMatrix]| {
            let width = pass.map_or(d, Pass::width);
            act.build(pool, self.isa, (picked.len(), width), ws, &|r, out| {
                let (h, rest) = out.split_at_mut(d);
                let r = picked[r];
                ops::rms_norm(&x[r * d..(r + 1) * d], g, c.norm_eps, h);
                if let Some(p) = pass {
                    p.residuals(self.isa, h, rest);
                }
            });
        };
        let all: Vec<usize> = (0..n).collect();
        let record = |probe: &mut Option<&mut Probe>, site: Site, act: &Activations| {
            if let Some(p) = probe.as_deref_mut() {
                assert_eq!(act.values().len(), n * d, "calibration runs without passes");
                p.record(site, act.values(), d);
            }
        };
        // A residual connection: `x += act · wᵀ`, or where a norm follows `w` (Gemma's
        // post-norms), `x += norm(act · wᵀ)` through `o`.
        let residual = |act: &mut Activations,
                        x: &mut [f32],
                        w: &kernels::QMatrix,
                        post: &Option<Vec<f32>>,
                        o: &mut [f32]| {
            let Some(g) = post else {
                return matmul_add(pool, self.isa, act, w, x);
            };
            matmul(pool, self.isa, act, &mut [(w, &mut *o)]);
            pool.rows_mut(o, d, par, &|_, os| {
                ops::rms_norm_in_place(os, g, c.norm_eps)
            });
            pool.rows_mut(x, d, par, &|r, xs| {
                xs.iter_mut().zip(&o[r * d..]).for_each(|(a, b)| *a += b)
            });
        };
        for (li, l) in w.layers.iter().enumerate() {
            let qkv = [&l.wq, &l.wk, &l.wv];
            let pass = o8.attention.get(li).and_then(Option::as_ref);
            normed(&mut act, &x, &all, &l.attn_norm, pass, &qkv);
            record(&mut probe, Site::Attention(li), &act);
            matmul(
                pool,
                self.isa,
                &mut act,
                &mut [(&l.wq, &mut q), (&l.wk, &mut k), (&l.wv, &mut v)],
            );
            for (bias, out, width) in [
                (&l.bq, &mut q, qd),
                (&l.bk, &mut k, kvd),
                (&l.bv, &mut v, kvd),
            ] {
                if let Some(b) = bias {
                    for row in out.chunks_exact_mut(width) {
                        row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
                    }
                }
            }
            let (rope, tables) = match (&tables_local, c.layers[li].local_rope) {
                (Some(t), true) => (c.rope_of(li), t),
                _ => (&c.rope, &tables),
            };
            // Q and K rows, normed per head where the model says so and rotated, in one
            // region split from a few rows (a decode batch's are otherwise serial).
            let mut parts = Vec::new();
            let (mut qs, mut ks) = (&mut q[..], &mut k[..]);
            for (a, b) in pool.row_chunks(n, kernels::matmul::BUILD_ROWS) {
                let (qa, qr) = std::mem::take(&mut qs).split_at_mut((b - a) * qd);
                let (ka, kr) = std::mem::take(&mut ks).split_at_mut((b - a) * kvd);
                (qs, ks) = (qr, kr);
                parts.push((a, qa, ka));
            }
            pool.each(parts, &|(r, qa, ka)| {
                for (xs, width, qk_norm) in [(qa, qd, &l.q_norm), (ka, kvd, &l.k_norm)] {
                    for (row, t) in xs.chunks_exact_mut(width).zip(&tables[r..]) {
                        if let Some(g) = qk_norm {
                            ops::rms_norm_in_place(row, g, c.norm_eps);
                        }
                        rope.rotate(self.isa, hd, t, row);
                    }
                }
            });
            if let Some(s) = c.q_scale {
                q.iter_mut().for_each(|v| *v *= s);
            }
            for (i, &(s, pos)) in rows.iter().enumerate() {
                let (ki, vi) = (&k[i * kvd..(i + 1) * kvd], &v[i * kvd..(i + 1) * kvd]);
                let (page, slot) = steps[s].slot(pos);
                kv.write(page.0, li, slot, ki, vi);
            }
            let scores = Scores {
                scale: if c.q_scale.is_some() {
                    1.0
                } else {
                    1.0 / (hd as f32).sqrt()
                },
                softcap: c.attn_softcap,
                window: c.layers[li].window,
            };
            attention_with(
                pool, self.isa, heads, scores, &*kv, batch, li, rows, &q, &mut att,
            );
            act.build(pool, self.isa, (n, qd), &[&l.wo], &|r, out| {
                out.copy_from_slice(&att[r * qd..(r + 1) * qd])
            });
            residual(&mut act, &mut x, &l.wo, &l.post_attn_norm, &mut o);

            let pass = o8.feed_forward.get(li).and_then(Option::as_ref);
            normed(&mut act, &x, &all, &l.ffn_norm, pass, &[&l.w_gate, &l.w_up]);
            record(&mut probe, Site::FeedForward(li), &act);
            matmul(
                pool,
                self.isa,
                &mut act,
                &mut [(&l.w_gate, &mut gate), (&l.w_up, &mut up)],
            );
            act.build(pool, self.isa, (n, f), &[&l.w_down], &|r, g| {
                g.copy_from_slice(&gate[r * f..(r + 1) * f]);
                let up = &up[r * f..(r + 1) * f];
                match c.activation {
                    Activation::SwiGlu => kernels::swiglu(self.isa, g, up),
                    Activation::GeGlu => ops::geglu(g, up),
                }
            });
            residual(&mut act, &mut x, &l.w_down, &l.post_ffn_norm, &mut o);
        }

        // The rows that want logits, all through the head together.
        let mut picked = Vec::new();
        let mut start = 0;
        for st in steps {
            let len = st.tokens.len();
            match st.logits {
                Logits::Last => picked.push(start + len - 1),
                Logits::All => picked.extend(start..start + len),
                Logits::None => {}
            }
            start += len;
        }
        let m = picked.len();
        out.reset(c.vocab, steps.iter().map(|st| st.logit_rows()));
        if m == 0 {
            return;
        }
        let head = [w.head()];
        normed(&mut act, &x, &picked, &w.out_norm, o8.head.as_ref(), &head);
        if let Some(p) = probe {
            assert_eq!(act.values().len(), m * d, "calibration runs without passes");
            p.record(Site::Head, act.values(), d);
        }
        let logits = out.data_mut();
        matmul(&self.pool, self.isa, &mut act, &mut [(w.head(), logits)]);
        if let Some(cap) = c.final_softcap {
            ops::softcap(logits, cap);
        }
    }
}
