//! The llama-family forward pass: one step over a ragged batch of sequences, each with
//! its new tokens (a whole prompt or a chunk of it in one matrix pass, or one decode
//! token), through any [`KvBatch`] (the paged pool or contiguous caches); logits out.

use super::attention::{attention, Heads};
use super::cache::{BasicCache, KvBatch, KvCache};
use super::config::Config;
use super::ops;
use super::weights::Weights;
use crate::error::{ModelError, RunError};
use crate::gguf::Gguf;
use crate::kernels::{self, matmul, Activations, Isa, ThreadPool};
use crate::kv::{KvDtype, PagedKv};
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (teacher forcing, scoring).
    All,
    /// None (a prefill chunk that does not end the prompt).
    None,
}

/// One sequence's part of a batched forward step.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// New tokens: a prefill chunk or one decode token.
    pub tokens: &'a [u32],
    pub want: Logits,
}

/// A loaded model: config, weights, tokenizer and the threads that run it.
pub struct Model {
    pub config: Config,
    pub tokenizer: Tokenizer,
    weights: Weights,
    pool: ThreadPool,
    isa: Isa,
    fingerprint: [u8; 16],
}

impl Model {
    /// Loads a GGUF model; `threads` = 0 means all cores.
    pub fn load(path: &Path, threads: usize) -> Result<Self, ModelError> {
        let g = Gguf::open(path)?;
        // The whole file identifies the model (prefix hashes, snapshots).
        let fingerprint = xxhash_rust::xxh3::xxh3_128(g.bytes()).to_le_bytes();
        let config = Config::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        let weights = Weights::load(&g, &config)?;
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        tracing::info!(
            arch = %config.arch, layers = config.n_layers, dim = config.dim,
            threads, isa = %kernels::isa(), "model loaded"
        );
        Ok(Self {
            config,
            tokenizer,
            weights,
            pool: ThreadPool::new(threads),
            isa: kernels::isa(),
            fingerprint,
        })
    }

    /// Threads the forward pass uses.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Bytes of weights one decode step reads (for bandwidth figures).
    pub fn bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token()
    }

    /// A fingerprint of the model file.
    pub fn fingerprint(&self) -> [u8; 16] {
        self.fingerprint
    }

    /// A paged KV pool of `n_pages` pages of `page_size` tokens (f16); no sequence in it
    /// grows past `max_tokens` (capped at the model's context).
    pub fn new_paged(&self, n_pages: usize, page_size: usize, max_tokens: usize) -> PagedKv {
        self.new_paged_as(KvDtype::F16, n_pages, page_size, max_tokens)
    }

    /// [`Model::new_paged`] with K/V stored as `dtype`.
    pub fn new_paged_as(
        &self,
        dtype: KvDtype,
        n_pages: usize,
        page_size: usize,
        max_tokens: usize,
    ) -> PagedKv {
        let c = &self.config;
        PagedKv::with_dtype(
            (n_pages, page_size, c.n_layers, c.kv_dim()),
            max_tokens.min(c.context_length),
            &self.fingerprint,
            dtype,
        )
    }

    /// A contiguous f16 KV cache for up to `capacity` tokens (capped at the model's
    /// context).
    pub fn new_cache(&self, capacity: usize) -> BasicCache {
        self.new_cache_as(KvDtype::F16, capacity)
    }

    /// [`Model::new_cache`] with K/V stored as `dtype`.
    pub fn new_cache_as(&self, dtype: KvDtype, capacity: usize) -> BasicCache {
        let c = &self.config;
        BasicCache::with_dtype(
            c.n_layers,
            c.kv_dim(),
            capacity.min(c.context_length),
            dtype,
        )
    }

    /// Runs `tokens` at the positions following what `cache` holds, stores their K/V and
    /// returns logits (`vocab` per requested position). A batch of one.
    pub fn forward<C: KvCache + ?Sized>(
        &self,
        cache: &mut C,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, RunError> {
        let mut one = [cache];
        let mut out = self.forward_batch(&mut one[..], &[Step { tokens, want }])?;
        Ok(out.pop().expect("one step, one result"))
    }

    /// One forward step over a ragged batch: step `s` runs its tokens at the positions
    /// following what sequence `s` of `kv` holds. All token rows share every matmul (each
    /// weight is read once per step); attention reads each row's own sequence. Returns
    /// each step's logits. A sequence's logits are the same bits whatever else is in the
    /// batch. On error nothing is stored.
    pub fn forward_batch<B: KvBatch + ?Sized>(
        &self,
        kv: &mut B,
        steps: &[Step],
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let c = &self.config;
        if steps.len() != kv.seqs() {
            return Err(RunError::Kv(format!(
                "{} steps for a batch of {} sequences",
                steps.len(),
                kv.seqs()
            )));
        }
        for st in steps {
            if st.tokens.is_empty() {
                return Err(RunError::EmptyPrompt);
            }
            if let Some(&bad) = st.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(RunError::BadToken(bad));
            }
        }
        let mut rows = Vec::new();
        for (s, st) in steps.iter().enumerate() {
            let pos0 = kv.seq_len(s);
            if let Err(e) = kv.begin(s, st.tokens) {
                for (b, st) in steps[..s].iter().enumerate() {
                    kv.abort(b, st.tokens.len());
                }
                return Err(e);
            }
            rows.extend((0..st.tokens.len()).map(|i| (s, pos0 + i)));
        }
        let result = self.forward_rows(kv, steps, &rows);
        for (s, st) in steps.iter().enumerate() {
            match &result {
                Ok(_) => kv.finish(s)?,
                Err(_) => kv.abort(s, st.tokens.len()),
            }
        }
        result
    }

    fn forward_rows<B: KvBatch + ?Sized>(
        &self,
        kv: &mut B,
        steps: &[Step],
        rows: &[(usize, usize)],
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let c = &self.config;
        let n = rows.len();
        let (d, kvd, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        let w = &self.weights;
        let heads = Heads {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };

        let mut x = vec![0f32; n * d];
        let tokens = steps.iter().flat_map(|s| s.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            w.embed.dequant_row(t as usize, row);
        }
        let mut tables = vec![Vec::new(); n];
        for (t, &(_, pos)) in tables.iter_mut().zip(rows) {
            ops::rope_table(c, pos, t);
        }
        let mut h = vec![0f32; n * d];
        let (mut q, mut k, mut v) = (vec![0f32; n * d], vec![0f32; n * kvd], vec![0f32; n * kvd]);
        let mut att = vec![0f32; n * d];
        let mut o = vec![0f32; n * d];
        let (mut gate, mut up) = (vec![0f32; n * f], vec![0f32; n * f]);
        let mut act = Activations::default();

        // Element-wise steps split their rows over the threads when there are many
        // (prefill); each row is computed the same way either way.
        let pool = &self.pool;
        let par = kernels::matmul::PARALLEL_ROWS;
        let norm = |x: &[f32], g: &[f32], h: &mut [f32]| {
            pool.rows_mut(&mut h[..n * d], d, par, &|r, hs| {
                ops::rms_norm(&x[r * d..r * d + hs.len()], g, c.norm_eps, hs)
            });
        };
        let add = |x: &mut [f32], o: &[f32]| {
            pool.rows_mut(x, d, par, &|r, xs| {
                xs.iter_mut().zip(&o[r * d..]).for_each(|(a, b)| *a += b)
            });
        };
        for (li, l) in w.layers.iter().enumerate() {
            norm(&x, &l.attn_norm, &mut h);
            act.set(&h, n, d);
            matmul(
                pool,
                self.isa,
                &mut act,
                &mut [(&l.wq, &mut q), (&l.wk, &mut k), (&l.wv, &mut v)],
            );
            for (bias, out, width) in [
                (&l.bq, &mut q, d),
                (&l.bk, &mut k, kvd),
                (&l.bv, &mut v, kvd),
            ] {
                if let Some(b) = bias {
                    for row in out.chunks_exact_mut(width) {
                        row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
                    }
                }
            }
            for (x, width) in [(&mut q, d), (&mut k, kvd)] {
                pool.rows_mut(x, width, par, &|r, xs| {
                    for (row, t) in xs.chunks_exact_mut(width).zip(&tables[r..]) {
                        ops::rope(c, t, row);
                    }
                });
            }
            for (i, &(s, pos)) in rows.iter().enumerate() {
                let (ki, vi) = (&k[i * kvd..(i + 1) * kvd], &v[i * kvd..(i + 1) * kvd]);
                kv.write(s, li, pos, ki, vi)?;
            }
            attention(pool, self.isa, heads, &*kv, li, rows, &q, &mut att);
            act.set(&att, n, d);
            matmul(pool, self.isa, &mut act, &mut [(&l.wo, &mut o)]);
            add(&mut x, &o);

            norm(&x, &l.ffn_norm, &mut h);
            act.set(&h, n, d);
            matmul(
                pool,
                self.isa,
                &mut act,
                &mut [(&l.w_gate, &mut gate), (&l.w_up, &mut up)],
            );
            pool.rows_mut(&mut gate, f, par, &|r, g| {
                kernels::swiglu(self.isa, g, &up[r * f..r * f + g.len()])
            });
            act.set(&gate, n, f);
            matmul(pool, self.isa, &mut act, &mut [(&l.w_down, &mut o)]);
            add(&mut x, &o);
        }

        // The rows that want logits, all through the head together.
        let mut picked = Vec::new();
        let mut start = 0;
        for st in steps {
            let len = st.tokens.len();
            match st.want {
                Logits::Last => picked.push(start + len - 1),
                Logits::All => picked.extend(start..start + len),
                Logits::None => {}
            }
            start += len;
        }
        let m = picked.len();
        if m == 0 {
            return Ok(vec![Vec::new(); steps.len()]);
        }
        let mut sel = vec![0f32; m * d];
        for (dst, &r) in sel.chunks_exact_mut(d).zip(&picked) {
            dst.copy_from_slice(&x[r * d..(r + 1) * d]);
        }
        ops::rms_norm(&sel, &w.out_norm, c.norm_eps, &mut h[..m * d]);
        act.set(&h, m, d);
        let mut logits = vec![0f32; m * c.vocab];
        matmul(
            &self.pool,
            self.isa,
            &mut act,
            &mut [(w.head(), &mut logits)],
        );
        let mut out = Vec::with_capacity(steps.len());
        let mut at = 0;
        for st in steps {
            let k = match st.want {
                Logits::Last => 1,
                Logits::All => st.tokens.len(),
                Logits::None => 0,
            };
            out.push(logits[at * c.vocab..(at + k) * c.vocab].to_vec());
            at += k;
        }
        Ok(out)
    }
}
