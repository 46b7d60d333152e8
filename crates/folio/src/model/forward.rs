//! The CPU forward step: a planned ragged [`Batch`]'s token rows through the embedding,
//! every layer's attention block and feed-forward block, and the head, on the kernels of
//! one [`Cpu`]. All rows share every matmul (each weight is read once per step);
//! attention reads each row's own sequence. A sequence that asks for hidden states
//! ([`Logits::Hidden`]) gets its rows after the final norm instead of logits. K/V is written to and read from a
//! [`KvStorage`] by page id; the step never allocates pages.
//!
//! Every architecture of [`super::config::Arch`] runs here: their differences are
//! methods of the layer's description ([`Config`], [`Layer`]) called once per layer,
//! none inside a token loop. An [`Observer`] may watch every matmul input (the
//! calibration that picks the outlier blocks).

use super::attention::{attention, AttentionStep, Heads};
use super::config::Config;
use super::ops;
use super::outliers::{Outliers, Pass, Site};
use super::step_logits::StepLogits;
use super::weights::{Layer, Weights};
use crate::kernels::{matmul, Activations, Cpu, QMatrix};
use crate::kv::{Batch, KvStorage, Logits};

/// Sees each matmul input of a step: `values` holds its rows back to back, `width`
/// values each.
pub(super) trait Observer {
    fn input(&mut self, site: Site, values: &[f32], width: usize);

    /// Whether the step's logits are wanted beside what is observed (calibration
    /// wants only the head's input: its logits, vocabulary × rows of them, are never
    /// computed, nor their buffer made).
    fn logits(&self) -> bool {
        true
    }
}

/// What one step computes with.
pub(super) struct Forward<'a> {
    pub cfg: &'a Config,
    pub weights: &'a Weights,
    pub outliers: &'a Outliers,
    pub cpu: &'a Cpu,
    pub batch: &'a Batch,
    /// `rows[r] = (seq, pos)`: every new token of the batch, in order.
    pub rows: &'a [(usize, usize)],
}

/// The buffers of one step, sized for its rows.
struct Scratch {
    /// The residual stream: one row of `dim` per token.
    x: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    /// A residual branch's output where a norm follows it (post-norms), else empty.
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Activations,
    /// Each row's RoPE (cos, sin) table; `tables_local` for the local layers' RoPE.
    tables: Vec<Vec<(f32, f32)>>,
    tables_local: Option<Vec<Vec<(f32, f32)>>>,
}

impl Scratch {
    fn new(c: &Config, w: &Weights, rows: &[(usize, usize)]) -> Self {
        let n = rows.len();
        let (d, qd, kvd, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let table = |rope: &super::rope::Rope| {
            let mut t = vec![Vec::new(); n];
            for (t, &(_, pos)) in t.iter_mut().zip(rows) {
                rope.table(pos, t);
            }
            t
        };
        Scratch {
            x: vec![0f32; n * d],
            q: vec![0f32; n * qd],
            k: vec![0f32; n * kvd],
            v: vec![0f32; n * kvd],
            att: vec![0f32; n * qd],
            o: vec![0f32; if w.post_norms() { n * d } else { 0 }],
            gate: vec![0f32; n * f],
            up: vec![0f32; n * f],
            act: Activations::default(),
            tables: table(&c.rope),
            tables_local: c.rope_local.as_ref().map(table),
        }
    }
}

impl Forward<'_> {
    /// Runs the step: K/V of every row written to `kv`, logits of the rows that want
    /// them into `out`.
    pub fn run(
        &self,
        kv: &mut dyn KvStorage,
        out: &mut StepLogits,
        mut obs: Option<&mut dyn Observer>,
    ) {
        let mut s = Scratch::new(self.cfg, self.weights, self.rows);
        self.embed(&mut s.x);
        for (li, l) in self.weights.layers.iter().enumerate() {
            let pass = self.outliers.attention.get(li).and_then(Option::as_ref);
            let qkv = [&l.wq, &l.wk, &l.wv];
            self.normed(&mut s.act, &s.x, None, &l.attn_norm, pass, &qkv);
            observe(&mut obs, Site::Attention(li), &s.act, pass, self.cfg.dim);
            self.attention_block(li, l, &mut s, kv);
            let pass = self.outliers.feed_forward.get(li).and_then(Option::as_ref);
            let gate_up = [&l.w_gate, &l.w_up];
            self.normed(&mut s.act, &s.x, None, &l.ffn_norm, pass, &gate_up);
            observe(&mut obs, Site::FeedForward(li), &s.act, pass, self.cfg.dim);
            self.ffn_block(l, &mut s);
        }
        self.head(&mut s, out, obs);
    }

    /// Each row's token's embedding (scaled where the model says so).
    fn embed(&self, x: &mut [f32]) {
        let d = self.cfg.dim;
        let tokens = self.batch.seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &t) in x.chunks_exact_mut(d).zip(tokens) {
            self.weights.embed.dequant_row(t as usize, row);
            if let Some(s) = self.cfg.embed_scale {
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
    }

    /// A matmul input into `act`: the rows of `x` (`picked`, or all) normed by `g`,
    /// each followed by its outlier blocks' residuals where the input has a pass, and
    /// quantized for `ws`.
    fn normed(
        &self,
        act: &mut Activations,
        x: &[f32],
        picked: Option<&[usize]>,
        g: &[f32],
        pass: Option<&Pass>,
        ws: &[&QMatrix],
    ) {
        let (d, eps, isa) = (self.cfg.dim, self.cfg.norm_eps, self.cpu.isa());
        let n = picked.map_or(x.len() / d, <[usize]>::len);
        let width = pass.map_or(d, Pass::width);
        self.cpu.build(act, (n, width), ws, &|r, out| {
            let (h, rest) = out.split_at_mut(d);
            let r = picked.map_or(r, |p| p[r]);
            ops::rms_norm(&x[r * d..(r + 1) * d], g, eps, h);
            if let Some(p) = pass {
                p.residuals(isa, h, rest);
            }
        });
    }

    /// Layer `li`'s attention from its normed input in `s.act`: Q, K, V; biases, per-head
    /// norms, RoPE and Q's scale as the layer says; K/V written to each row's slot;
    /// attention; the output projection added to the residual stream.
    fn attention_block(&self, li: usize, l: &Layer, s: &mut Scratch, kv: &mut dyn KvStorage) {
        let (c, cpu, n) = (self.cfg, self.cpu, self.rows.len());
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        let outs = &mut [
            (&l.wq, &mut s.q[..]),
            (&l.wk, &mut s.k[..]),
            (&l.wv, &mut s.v[..]),
        ];
        cpu.matmul(&mut s.act, outs);
        l.add_biases(&mut s.q, &mut s.k, &mut s.v);
        let tables = match &s.tables_local {
            Some(t) if c.layers[li].local_rope => t,
            _ => &s.tables,
        };
        self.norm_and_rotate(li, l, tables, &mut s.q, &mut s.k);
        if let Some(scale) = c.q_scale {
            s.q.iter_mut().for_each(|v| *v *= scale);
        }
        for (i, &(seq, pos)) in self.rows.iter().enumerate() {
            let (ki, vi) = (&s.k[i * kvd..(i + 1) * kvd], &s.v[i * kvd..(i + 1) * kvd]);
            let (page, slot) = self.batch.seqs[seq].slot(pos);
            kv.write(page.0, li, slot, ki, vi);
        }
        let at = AttentionStep {
            heads: Heads {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
            },
            scores: c.scores(li),
            kv: &*kv,
            batch: self.batch,
            layer: li,
            rows: self.rows,
        };
        attention(cpu, &at, &s.q, &mut s.att);
        let att = &s.att;
        cpu.build(&mut s.act, (n, qd), &[&l.wo], &|r, out| {
            out.copy_from_slice(&att[r * qd..(r + 1) * qd])
        });
        self.residual(&mut s.act, &mut s.x, &l.wo, &l.post_attn_norm, &mut s.o);
    }

    /// Q and K rows normed per head where the layer says so, and rotated, in one region
    /// split from a few rows (a decode batch's are otherwise serial).
    fn norm_and_rotate(
        &self,
        li: usize,
        l: &Layer,
        tables: &[Vec<(f32, f32)>],
        q: &mut [f32],
        k: &mut [f32],
    ) {
        let (c, pool, isa) = (self.cfg, self.cpu.pool(), self.cpu.isa());
        let (qd, kvd, rope) = (c.q_dim(), c.kv_dim(), c.rope_of(li));
        let mut parts = Vec::new();
        let (mut qs, mut ks) = (q, k);
        for (a, b) in pool.row_chunks(self.rows.len(), matmul::BUILD_ROWS) {
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
                    rope.rotate(isa, c.head_dim, t, row);
                }
            }
        });
    }

    /// The feed-forward from its normed input in `s.act`: gate and up, the activation
    /// function, the down projection added to the residual stream.
    fn ffn_block(&self, l: &Layer, s: &mut Scratch) {
        let (c, cpu, n, f) = (self.cfg, self.cpu, self.rows.len(), self.cfg.ffn_dim);
        cpu.matmul(
            &mut s.act,
            &mut [(&l.w_gate, &mut s.gate[..]), (&l.w_up, &mut s.up[..])],
        );
        let (gate, up, isa) = (&s.gate, &s.up, cpu.isa());
        cpu.build(&mut s.act, (n, f), &[&l.w_down], &|r, g| {
            g.copy_from_slice(&gate[r * f..(r + 1) * f]);
            c.activation.apply(isa, g, &up[r * f..(r + 1) * f]);
        });
        self.residual(&mut s.act, &mut s.x, &l.w_down, &l.post_ffn_norm, &mut s.o);
    }

    /// A residual connection: `x += act · wᵀ`, or where a norm follows `w` (Gemma's
    /// post-norms), `x += norm(act · wᵀ)` through `o`.
    fn residual(
        &self,
        act: &mut Activations,
        x: &mut [f32],
        w: &QMatrix,
        post: &Option<Vec<f32>>,
        o: &mut [f32],
    ) {
        let Some(g) = post else {
            return self.cpu.matmul_add(act, w, x);
        };
        let (pool, d, eps) = (self.cpu.pool(), self.cfg.dim, self.cfg.norm_eps);
        self.cpu.matmul(act, &mut [(w, &mut *o)]);
        // Element-wise steps split their rows over the threads when there are many
        // (prefill); each row is computed the same way either way.
        let par = matmul::PARALLEL_ROWS;
        pool.rows_mut(o, d, par, &|_, os| ops::rms_norm_in_place(os, g, eps));
        pool.rows_mut(x, d, par, &|r, xs| {
            xs.iter_mut().zip(&o[r * d..]).for_each(|(a, b)| *a += b)
        });
    }

    /// The rows that want logits, all through the head together, into `out`; the rows
    /// that want hidden states, final-normed into `out`'s states (they skip the head).
    fn head(&self, s: &mut Scratch, out: &mut StepLogits, mut obs: Option<&mut dyn Observer>) {
        let (c, w) = (self.cfg, self.weights);
        let steps = &self.batch.seqs;
        let (mut picked, mut hidden) = (Vec::new(), Vec::new());
        let mut start = 0;
        for st in steps {
            let len = st.tokens.len();
            match st.logits {
                Logits::Last => picked.push(start + len - 1),
                Logits::All => picked.extend(start..start + len),
                Logits::Hidden => hidden.extend(start..start + len),
                Logits::None => {}
            }
            start += len;
        }
        let logits = obs.as_deref().is_none_or(|o| o.logits());
        out.reset(
            c.vocab,
            steps
                .iter()
                .map(|st| if logits { st.logit_rows() } else { 0 }),
        );
        out.reset_states(c.dim, steps.iter().map(|st| st.state_rows()));
        if !hidden.is_empty() {
            // The head's input without its quantization: each row normed on its own,
            // so its bits do not depend on the other rows or the threads.
            let (x, d, eps, g) = (&s.x, c.dim, c.norm_eps, &w.out_norm);
            let par = matmul::PARALLEL_ROWS;
            self.cpu
                .pool()
                .rows_mut(out.states_mut(), d, par, &|first, part| {
                    for (k, row) in part.chunks_exact_mut(d).enumerate() {
                        let r = hidden[first + k];
                        ops::rms_norm(&x[r * d..(r + 1) * d], g, eps, row);
                    }
                });
        }
        if picked.is_empty() {
            return;
        }
        let (head, pass) = (w.head(), self.outliers.head.as_ref());
        self.normed(&mut s.act, &s.x, Some(&picked), &w.out_norm, pass, &[head]);
        observe(&mut obs, Site::Head, &s.act, pass, c.dim);
        if !logits {
            return;
        }
        let logits = out.data_mut();
        self.cpu.matmul(&mut s.act, &mut [(head, logits)]);
        if let Some(cap) = c.final_softcap {
            ops::softcap(logits, cap);
        }
    }
}

/// Shows `act`'s rows to the observer, if any, as the input of `site` (`pass`: the
/// input's outlier pass, whose columns follow the `dim` values of each row).
fn observe(
    obs: &mut Option<&mut dyn Observer>,
    site: Site,
    act: &Activations,
    pass: Option<&Pass>,
    dim: usize,
) {
    if let Some(o) = obs.as_deref_mut() {
        o.input(site, act.values(), pass.map_or(dim, Pass::width));
    }
}
