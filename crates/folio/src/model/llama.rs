//! The llama-family forward pass over a contiguous KV cache: a batch of a sequence's new
//! tokens (a whole prompt in one matrix pass, or one decode token) in, logits out.

use super::cache::{BasicCache, KvCache};
use super::config::Config;
use super::ops;
use super::weights::Weights;
use crate::error::{ModelError, RunError};
use crate::gguf::Gguf;
use crate::kernels::{self, matmul, Activations, Isa, ThreadPool};
use crate::kv::PagedKv;
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Mutex;

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (teacher forcing, scoring).
    All,
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

    /// A paged KV pool of `n_pages` pages of `page_size` tokens; no sequence in it grows
    /// past `max_tokens` (capped at the model's context).
    pub fn new_paged(&self, n_pages: usize, page_size: usize, max_tokens: usize) -> PagedKv {
        let c = &self.config;
        PagedKv::new(
            n_pages,
            page_size,
            c.n_layers,
            c.kv_dim(),
            max_tokens.min(c.context_length),
            &self.fingerprint,
        )
    }

    /// A contiguous KV cache for up to `capacity` tokens (capped at the model's context).
    pub fn new_cache(&self, capacity: usize) -> BasicCache {
        let c = &self.config;
        BasicCache::new(c.n_layers, c.kv_dim(), capacity.min(c.context_length))
    }

    /// Runs `tokens` at the positions following what `cache` holds, stores their K/V and
    /// returns logits (`vocab` per requested position).
    pub fn forward<C: KvCache + ?Sized>(
        &self,
        cache: &mut C,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, RunError> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(RunError::EmptyPrompt);
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(RunError::BadToken(bad));
        }
        let pos0 = cache.len();
        cache.begin(tokens)?;
        let result = self.forward_begun(cache, tokens, pos0, want);
        match &result {
            Ok(_) => cache.finish()?,
            Err(_) => cache.abort(n),
        }
        result
    }

    fn forward_begun<C: KvCache + ?Sized>(
        &self,
        cache: &mut C,
        tokens: &[u32],
        pos0: usize,
        want: Logits,
    ) -> Result<Vec<f32>, RunError> {
        let c = &self.config;
        let n = tokens.len();
        let (d, kv, f) = (c.dim, c.kv_dim(), c.ffn_dim);
        let w = &self.weights;

        let mut x = vec![0f32; n * d];
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            w.embed.dequant_row(t as usize, row);
        }
        let mut tables = vec![Vec::new(); n];
        for (i, t) in tables.iter_mut().enumerate() {
            ops::rope_table(c, pos0 + i, t);
        }
        let mut h = vec![0f32; n * d];
        let (mut q, mut k, mut v) = (vec![0f32; n * d], vec![0f32; n * kv], vec![0f32; n * kv]);
        let mut att = vec![0f32; n * d];
        let mut o = vec![0f32; n * d];
        let (mut gate, mut up) = (vec![0f32; n * f], vec![0f32; n * f]);
        let mut act = Activations::default();

        for (li, l) in w.layers.iter().enumerate() {
            ops::rms_norm(&x, &l.attn_norm, c.norm_eps, &mut h);
            act.set(&h, n, d);
            matmul(
                &self.pool,
                self.isa,
                &mut act,
                &mut [(&l.wq, &mut q), (&l.wk, &mut k), (&l.wv, &mut v)],
            );
            for (bias, out, width) in [(&l.bq, &mut q, d), (&l.bk, &mut k, kv), (&l.bv, &mut v, kv)]
            {
                if let Some(b) = bias {
                    for row in out.chunks_exact_mut(width) {
                        row.iter_mut().zip(b).for_each(|(y, bb)| *y += bb);
                    }
                }
            }
            for i in 0..n {
                ops::rope(c, &tables[i], &mut q[i * d..(i + 1) * d]);
                ops::rope(c, &tables[i], &mut k[i * kv..(i + 1) * kv]);
                cache.write(
                    li,
                    pos0 + i,
                    &k[i * kv..(i + 1) * kv],
                    &v[i * kv..(i + 1) * kv],
                )?;
            }
            self.attention(cache, li, pos0, &q, &mut att);
            act.set(&att, n, d);
            matmul(&self.pool, self.isa, &mut act, &mut [(&l.wo, &mut o)]);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            ops::rms_norm(&x, &l.ffn_norm, c.norm_eps, &mut h);
            act.set(&h, n, d);
            matmul(
                &self.pool,
                self.isa,
                &mut act,
                &mut [(&l.w_gate, &mut gate), (&l.w_up, &mut up)],
            );
            kernels::swiglu(self.isa, &mut gate, &up);
            act.set(&gate, n, f);
            matmul(&self.pool, self.isa, &mut act, &mut [(&l.w_down, &mut o)]);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        }

        let rows = match want {
            Logits::Last => &x[(n - 1) * d..],
            Logits::All => &x[..],
        };
        let m = rows.len() / d;
        ops::rms_norm(rows, &w.out_norm, c.norm_eps, &mut h[..m * d]);
        act.set(&h, m, d);
        let mut logits = vec![0f32; m * c.vocab];
        matmul(
            &self.pool,
            self.isa,
            &mut act,
            &mut [(w.head(), &mut logits)],
        );
        Ok(logits)
    }

    /// Causal grouped-query attention of the batch's queries over the cache, in parallel
    /// over (token, head) pairs; each pair's reduction runs in one fixed order, so the
    /// result does not depend on the batch or the thread count.
    ///
    /// NOTE: the arithmetic is that of llama.cpp's CPU flash attention (its default): the
    /// query rounded to f16, an online softmax over the keys in order, and the value
    /// accumulator kept in f16. SmolLM2's attention is sensitive enough that a more exact
    /// f32 accumulation lands further from llama.cpp than its own noise.
    fn attention<C: KvCache + ?Sized>(
        &self,
        cache: &C,
        layer: usize,
        pos0: usize,
        q: &[f32],
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, nh) = (c.head_dim, c.n_heads);
        let group = nh / c.n_kv_heads;
        let units = q.len() / hd;
        let threads = self.pool.threads().min(units);
        let scale = 1.0 / (hd as f32).sqrt();
        // Contiguous runs of units with about equal work each (a query at position p
        // reads p + 1 keys), so causal prefill does not leave one thread waiting.
        let work = |u: usize| (pos0 + u / nh + 1) as u64;
        let total: u64 = (0..units).map(work).sum();
        let mut bounds = vec![0usize];
        let mut acc = 0u64;
        for u in 0..units {
            acc += work(u);
            if bounds.len() < threads && acc * threads as u64 >= total * bounds.len() as u64 {
                bounds.push(u + 1);
            }
        }
        while bounds.len() <= threads {
            bounds.push(units);
        }
        // Each thread gets the contiguous slice of `out` its units write.
        let mut parts: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(threads);
        let mut rest = out;
        for t in 0..threads {
            let (a, b) = (bounds[t], bounds[t + 1]);
            let (mine, tail) = rest.split_at_mut((b - a) * hd);
            parts.push(Mutex::new(mine));
            rest = tail;
        }
        let isa = self.isa;
        self.pool.run(&|t| {
            if t >= threads {
                return;
            }
            let (a, b) = (bounds[t], bounds[t + 1]);
            let mut guard = parts[t].lock().unwrap_or_else(|e| e.into_inner());
            let mine: &mut [f32] = &mut guard;
            for u in a..b {
                let (i, h) = (u / nh, u % nh);
                let g = h / group;
                let kv = |p: usize| {
                    (
                        &cache.k_row(layer, p)[g * hd..(g + 1) * hd],
                        &cache.v_row(layer, p)[g * hd..(g + 1) * hd],
                    )
                };
                let o = &mut mine[(u - a) * hd..(u - a + 1) * hd];
                kernels::attend_f16(isa, &q[u * hd..(u + 1) * hd], pos0 + i + 1, &kv, scale, o);
            }
        });
    }
}
