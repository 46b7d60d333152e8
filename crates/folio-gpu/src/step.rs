//! One forward step on the device: the batch's rows through every layer in one
//! compute pass (wgpu orders the dispatches), then one copy of what comes back (the
//! requested logits, the requested hidden states; every new row's K and V only for
//! storage that holds no rows on the device). Where the requested logits would be more
//! than one binding holds, the head runs over them in pieces, each after the first in
//! a pass and a copy of its own.
//!
//! First each row's embedding, gathered from the table on the device. Per layer:
//! RMSNorm → Q, K, V matmuls (one dispatch where they share a format; + biases) →
//! (per-head Q/K norms) → K, rotated by RoPE (the host's tables, the local one on a
//! local layer), and V into the pool and the step's copy → paged attention over each
//! row's own pages, Q rotated as it is loaded → output matmul added to the residual
//! (normed first where the model has post-norms) → RMSNorm → gate and up and the SiLU
//! or GELU gate (one dispatch where gate and up are one matrix in one piece: they
//! share a format and fit a binding) → down added to the residual (likewise). Then
//! the final norm of the picked rows and the head. Attention scores and the final
//! logits are soft-capped where the model says (Gemma 2). Every row of the ragged
//! batch (prefill chunks and decode rows alike) shares each matmul.

use crate::arena::{Arena, Recorder};
use crate::device::Gpu;
use crate::kernels::{Input, Kernels, Outputs, Q8K_WORDS, Q8_WORDS, WG};
use crate::pool::Pool;
use crate::profile::{Profile, Stamped};
use crate::table::StepTable;
use crate::weights::{Matrix, Weights};
use folio::model::Config;
use folio::Batch;

/// What a step brings back.
pub(crate) struct Output {
    /// `vocab` per picked row.
    pub logits: Vec<f32>,
    /// `dim` per hidden row.
    pub states: Vec<f32>,
    /// Layer by layer, row by row: each new row's K (`kv_dim` each).
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// One step's inputs.
pub(crate) struct Step<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a Kernels,
    pub weights: &'a Weights,
    pub config: &'a Config,
    pub pool: &'a Pool,
    pub table: &'a StepTable,
    /// Matmul inputs rounded to 8 bits (llama.cpp's arithmetic), else f32.
    pub llama: bool,
    /// Which 8-bit inputs the model's matmuls read then ([`eight_bit_inputs`]).
    pub inputs: (bool, bool),
    /// Every new row's K and V comes back (for storage that holds none on the device).
    pub write_back: bool,
    /// Where steps are profiled, the profile this one's dispatch times go to.
    pub profile: Option<&'a Profile>,
}

fn f(x: f32) -> u32 {
    x.to_bits()
}

impl Step<'_> {
    pub fn run(&self, batch: &Batch, arena: &mut Arena) -> Result<Output, String> {
        let started = std::time::Instant::now();
        let (gpu, c, w, t) = (self.gpu, self.config, self.weights, self.table);
        let k = self.kernels;
        let n = t.rows.len();
        let (d, qd, kvd, ff) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let (npick, nhid) = (t.picked.len(), t.hidden.len());
        // The residual stream starts as each row's embedding, gathered on the device
        // from the step's tokens (as f32 values, padded to whole vec4s:
        // `Kernels::embed`).
        let mut tokens: Vec<f32> = batch
            .seqs
            .iter()
            .flat_map(|s| s.tokens.iter().map(|&t| t as f32))
            .collect();
        tokens.resize(n.next_multiple_of(4), 0.0);
        let tokens = arena.upload(gpu, "tokens", bytemuck::cast_slice(&tokens));
        let x = arena.buffer(gpu, "x", (n * d * 4) as u64);
        // RoPE tables, the CPU path's own: the global one, and the local layers' own
        // where the model has one (Gemma 3; the same dimensions, `weights::check`).
        let half = c.rope.dims / 2;
        let table = |r: &folio::model::Rope| {
            let mut out = Vec::with_capacity(n * half * 2);
            let mut row = Vec::new();
            for &(_, pos) in &t.rows {
                r.table(pos, &mut row);
                out.extend(row.iter().flat_map(|&(cs, sn)| [cs, sn]));
            }
            out
        };
        let rope = table(&c.rope);
        let rope_local = c.rope_local.as_ref().map(table);
        let ident: Vec<u32> = (0..n as u32).collect();
        let fbytes = |len: usize| (len * 4) as u64;
        let rope = arena.upload(gpu, "rope", bytemuck::cast_slice(&rope));
        let rope_local =
            rope_local.map(|r| arena.upload(gpu, "local rope", bytemuck::cast_slice(&r)));
        let ident = arena.upload(gpu, "rows", bytemuck::cast_slice(&ident));
        let tab = arena.upload(gpu, "pages", bytemuck::cast_slice(&t.tab));
        let slots = arena.upload(gpu, "slots", bytemuck::cast_slice(&t.slots));
        let picked = arena.upload(gpu, "picked", bytemuck::cast_slice(&t.picked));
        let hidden = arena.upload(gpu, "hidden", bytemuck::cast_slice(&t.hidden));
        let h = arena.buffer(gpu, "h", fbytes(n * d));
        let q = arena.buffer(gpu, "q", fbytes(n * qd));
        let kb = arena.buffer(gpu, "k", fbytes(n * kvd));
        let vb = arena.buffer(gpu, "v", fbytes(n * kvd));
        let att = arena.buffer(gpu, "att", fbytes(n * qd));
        // A block's output before its post-norm (Gemma's).
        let o = arena.buffer(gpu, "o", fbytes(if c.post_norms { n * d } else { 0 }));
        let gate = arena.buffer(gpu, "gate", fbytes(n * ff));
        let up = arena.buffer(gpu, "up", fbytes(n * ff));
        // The new rows' K and V come back only for storage that holds none here.
        let kv_len = if self.write_back {
            c.n_layers * n * kvd
        } else {
            0
        };
        let knew = arena.buffer(gpu, "k new", fbytes(kv_len));
        let vnew = arena.buffer(gpu, "v new", fbytes(kv_len));
        // The head's logits in pieces of `head_rows` rows where all of them would be
        // more than one binding holds (a long prompt's logits over a large vocabulary):
        // the first piece in the step's pass, the others in passes of their own.
        let head_rows = ((gpu.max_binding() / 4) as usize / c.vocab)
            .min(k.set.head_rows)
            .max(1);
        let hp = arena.buffer(gpu, "head input", fbytes(npick.min(head_rows) * d));
        let widest = d.max(qd).max(ff);
        let (q8, q8k) = self.inputs;
        let aq = arena.buffer(
            gpu,
            "8-bit input",
            fbytes(if q8 { n * widest / 32 * Q8_WORDS } else { 0 }),
        );
        let akq = arena.buffer(
            gpu,
            "8-bit input (256)",
            fbytes(if q8k { n * widest / 256 * Q8K_WORDS } else { 0 }),
        );
        let logits = arena.buffer(gpu, "logits", fbytes(npick.min(head_rows) * c.vocab));
        let states = arena.buffer(gpu, "states", fbytes(nhid * d));

        // Attention split into chunks of keys where the longest row sees more than one
        // chunk (`attention.wgsl`), as many as a dispatch holds.
        let longest = t
            .rows
            .iter()
            .map(|&(_, pos)| pos as u32 + 1)
            .max()
            .unwrap_or(0);
        // Fewer, longer chunks where the chunks' partial states (`parts`) would be more
        // than one binding holds (a long prefill over a long context on lavapipe).
        let mut chunk_keys = k.set.attention_chunk;
        let part_bytes =
            |chunks: u32| (n * c.n_heads * chunks as usize * (c.head_dim + 2) * 4) as u64;
        while longest > chunk_keys
            && (n as u32 * longest.div_ceil(chunk_keys) > 65535
                || part_bytes(longest.div_ceil(chunk_keys)) > gpu.max_binding())
        {
            chunk_keys *= 2;
        }
        let (chunk_keys, chunks) = match longest.div_ceil(chunk_keys) {
            0 | 1 => (0, 1),
            more => (chunk_keys, more),
        };
        let part_len = part_bytes(chunks) as usize / 4;
        let parts = arena.buffer(
            gpu,
            "attention parts",
            fbytes(if chunk_keys > 0 { part_len } else { 0 }),
        );
        let lens = [npick.min(head_rows) * c.vocab, nhid * d, kv_len, kv_len];
        let total: usize = lens.iter().sum();

        let eps = f(c.norm_eps);
        let ops = Ops {
            k,
            x: &x,
            aq: &aq,
            akq: &akq,
            reads: (q8, q8k),
            llama: self.llama,
            eps,
            d,
        };
        arena.time(gpu, self.profile.is_some());
        let recorded = arena.record(gpu, |rec, p| {
            let norm = |p: &mut wgpu::ComputePass<'_>, idx, rows, g, out| {
                ops.norm(rec, p, idx, rows, g, out)
            };
            let norm_quantized = |p: &mut wgpu::ComputePass<'_>, g, out| {
                ops.norm_quantized(rec, p, &ident, n, g, out)
            };
            let quantize = |p: &mut wgpu::ComputePass<'_>, a, width, rows| {
                ops.quantize(rec, p, a, width, rows)
            };
            let matmul = |p: &mut wgpu::ComputePass<'_>, m: &Matrix, a, y, width, add| {
                let out = Outputs::parts(&m.parts, &[(y, width)]);
                ops.matmul(rec, p, m, a, &out, n, add)
            };
            // Matrices of several parts (`Matrix::parts`), each part into its output.
            let matmuls = |p: &mut wgpu::ComputePass<'_>, ms: &[Matrix], a, outs: &[_]| {
                let mut at = 0;
                for m in ms {
                    let out = Outputs::parts(&m.parts, &outs[at..at + m.parts.len()]);
                    ops.matmul(rec, p, m, a, &out, n, false);
                    at += m.parts.len();
                }
            };
            // The residual: `x += a · mᵀ`, or with a post-norm `g`, `x += norm(a · mᵀ)`.
            let residual =
                |p: &mut wgpu::ComputePass<'_>, m: &Matrix, a, g: &Option<wgpu::Buffer>| {
                    let Some(g) = g else {
                        return matmul(p, m, a, &x, d, true);
                    };
                    matmul(p, m, a, &o, d, false);
                    let params = [d as u32, n as u32, eps, 0];
                    rec.dispatch(p, &k.norm_add, &params, &[g, &o, &x], (n as u32, 1));
                };
            let scale = c.q_scale.unwrap_or(1.0 / (c.head_dim as f32).sqrt());
            // 8-bit K/V rotates head rows where head_dim is a power of two, as the
            // host does (`folio::kernels::rotate_heads`).
            let rotate = c.head_dim.is_power_of_two() as u32;
            let inv_sqrt = f(1.0 / (c.head_dim as f32).sqrt());
            let group = k.set.heads_per_group(c.n_heads, c.n_kv_heads, c.head_dim) as u32;
            let hd = c.head_dim as u32;
            let gelu = c.activation == folio::model::Activation::GeGlu;
            k.embed(
                rec,
                p,
                w.table(),
                &tokens,
                &x,
                n,
                c.embed_scale.unwrap_or(1.0),
            );
            for (li, l) in w.layers.iter().enumerate() {
                norm_quantized(p, &l.attn_norm, &h);
                matmuls(p, &l.qkv, &h, &[(&q, qd), (&kb, kvd), (&vb, kvd)]);
                if let Some(biases) = &l.biases {
                    for (b, y, width) in [
                        (&biases[0], &q, qd),
                        (&biases[1], &kb, kvd),
                        (&biases[2], &vb, kvd),
                    ] {
                        let groups = ((width as u32).div_ceil(WG), n as u32);
                        rec.dispatch(p, &k.bias, &[n as u32, width as u32], &[y, b], groups);
                    }
                }
                if let Some([gq, gk]) = &l.qk_norm {
                    for (g, y, heads) in [(gq, &q, c.n_heads), (gk, &kb, c.n_kv_heads)] {
                        let rows = (n * heads) as u32;
                        let params = [c.head_dim as u32, rows, eps, 0];
                        rec.dispatch(p, &k.norm_in_place, &params, &[g, y], (rows, 1));
                    }
                }
                // RoPE is applied as K is stored and Q loaded (`rope.wgsl`).
                let rope = match &rope_local {
                    Some(r) if c.layers[li].local_rope => r,
                    _ => &rope,
                };
                let adjacent = c.rope_of(li).style == folio::model::RopeStyle::Adjacent;
                let back = self.write_back as u32;
                let params = [
                    n as u32,
                    kvd as u32,
                    li as u32,
                    hd,
                    rotate,
                    inv_sqrt,
                    back,
                    half as u32,
                    adjacent as u32,
                ];
                let stores = [
                    &slots,
                    &kb,
                    &vb,
                    &self.pool.k[li],
                    &self.pool.v[li],
                    &knew,
                    &vnew,
                    rope,
                ];
                if self.pool.q8 {
                    let groups = (((n * kvd / c.head_dim) as u32).div_ceil(WG), 1);
                    rec.dispatch(p, &k.kv_store_q8, &params, &stores, groups);
                } else {
                    let groups = ((kvd as u32 / 2).div_ceil(WG), n as u32);
                    rec.dispatch(p, &k.kv_store, &params, &stores, groups);
                }
                let window = c.layers[li].window.unwrap_or(0) as u32;
                let params = [
                    n as u32,
                    c.n_heads as u32,
                    c.n_kv_heads as u32,
                    c.head_dim as u32,
                    t.page_size as u32,
                    kvd as u32,
                    f(scale),
                    window,
                    t.seqs_at,
                    f(c.attn_softcap.unwrap_or(0.0)),
                    rotate,
                    inv_sqrt,
                    chunk_keys,
                    chunks,
                    half as u32,
                    adjacent as u32,
                    group,
                ];
                let bufs = [
                    &att,
                    &parts,
                    &tab,
                    &q,
                    &self.pool.k[li],
                    &self.pool.v[li],
                    rope,
                ];
                let (attention, combine) = match self.pool.q8 {
                    true => (&k.attention_q8, &k.combine_q8),
                    false => (&k.attention, &k.combine),
                };
                let heads = c.n_heads as u32;
                let groups = (heads / group, n as u32 * chunks);
                rec.dispatch(p, attention, &params, &bufs, groups);
                if chunk_keys > 0 {
                    rec.dispatch(p, combine, &params, &bufs[..2], (heads, n as u32));
                }
                quantize(p, &att, qd, n);
                residual(p, &l.wo, &att, &l.post_attn_norm);
                norm_quantized(p, &l.ffn_norm, &h);
                // act(gate) * up into `gate`: one dispatch where gate and up are one
                // matrix in one piece (gated: `matmul_common.wgsl`), else their matmuls
                // and the gate kernel (the same bits).
                match &l.gate_up[..] {
                    [m] if k.set.fused && m.parts.len() == 2 && m.pieces.len() == 1 => {
                        let out = Outputs::gated((&gate, ff), ff, gelu);
                        ops.matmul(rec, p, m, &h, &out, n, false);
                    }
                    _ => {
                        matmuls(p, &l.gate_up, &h, &[(&gate, ff), (&up, ff)]);
                        let groups = ((ff as u32).div_ceil(WG), n as u32);
                        let params = [n as u32, ff as u32, gelu as u32, 0];
                        rec.dispatch(p, &k.glu, &params, &[&gate, &up], groups);
                    }
                }
                quantize(p, &gate, ff, n);
                residual(p, &l.w_down, &gate, &l.post_ffn_norm);
            }
            // The head over the first `head_rows` picked rows (the rest after it).
            ops.head(
                rec,
                p,
                (c, w),
                &picked,
                head_rows.min(npick),
                [&hp, &logits],
            );
            if nhid > 0 {
                norm(p, &hidden, nhid, &w.out_norm, &states);
            }
        });
        let (mut encoder, dispatches) = (recorded.encoder, recorded.dispatches);
        // A timed step's stamps come back after its results (two words each).
        let stamp_words = recorded
            .stamps
            .as_ref()
            .map_or(0, |(k, _)| 2 * (k.len() + 1));
        let staging = arena.staging(gpu, fbytes(total + stamp_words));
        let mut at = 0;
        for (buf, len) in [&logits, &states, &knew, &vnew].into_iter().zip(lens) {
            if len > 0 {
                encoder.copy_buffer_to_buffer(buf, 0, &staging, fbytes(at), fbytes(len));
            }
            at += len;
        }
        if let Some((_, stamps)) = &recorded.stamps {
            let bytes = fbytes(stamp_words);
            encoder.copy_buffer_to_buffer(stamps, 0, &staging, fbytes(total), bytes);
        }
        let recorded_at = started.elapsed();
        let mut all = gpu.finish(encoder, &staging, fbytes(total + stamp_words))?;
        // Host time to lay out and record the step, and the step through its results:
        // on a GPU the difference is the device's time and the copies.
        tracing::debug!(
            rows = n,
            dispatches,
            record_us = recorded_at.as_micros() as u64,
            step_us = started.elapsed().as_micros() as u64,
            "gpu: step"
        );
        // A timed step's stamps: as the device counts, low word first.
        let ticks: Vec<u64> = all[total..total + stamp_words]
            .chunks_exact(2)
            .map(|w| u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
            .collect();
        // The four parts, split off the back of one read-back (no copy of the logits; an
        // empty read-back maps one word).
        all.truncate(total);
        let v_rows = all.split_off(total - lens[3]);
        let k_rows = all.split_off(total - lens[3] - lens[2]);
        let states = all.split_off(lens[0]);
        let mut values = all;
        // The other pieces of the head, each in a pass of its own (x holds every
        // row's residual stream after the step's pass). Not timed: a profile holds
        // the step's own pass, and its host time counts these too.
        arena.time(gpu, false);
        for first in (head_rows..npick).step_by(head_rows) {
            let rows = &t.picked[first..npick.min(first + head_rows)];
            let picked = arena.upload(gpu, "picked", bytemuck::cast_slice(rows));
            let bytes = fbytes(rows.len() * c.vocab);
            let staging = arena.staging(gpu, bytes);
            let mut encoder = arena
                .record(gpu, |rec, p| {
                    ops.head(rec, p, (c, w), &picked, rows.len(), [&hp, &logits]);
                })
                .encoder;
            encoder.copy_buffer_to_buffer(&logits, 0, &staging, 0, bytes);
            let mut piece = gpu.finish(encoder, &staging, bytes)?;
            piece.truncate(rows.len() * c.vocab);
            values.extend(piece);
        }
        if let (Some(profile), Some((kinds, _))) = (self.profile, &recorded.stamps) {
            profile.add(Stamped {
                rows: n,
                kinds,
                ticks: &ticks,
                period_ns: gpu.queue.get_timestamp_period(),
                host: started.elapsed(),
                record: recorded_at,
            });
        }
        Ok(Output {
            logits: values,
            states,
            k: k_rows,
            v: v_rows,
        })
    }
}

/// Whether the matmuls of `w` read 8-bit inputs in blocks of 32, and in blocks of 256
/// (the K-quants), with llama.cpp's arithmetic (`llama`) or not: what a step quantizes
/// its matmul inputs into. Known once the weights and the arithmetic are.
pub(crate) fn eight_bit_inputs(k: &Kernels, w: &Weights, llama: bool) -> (bool, bool) {
    let reads = |input| {
        w.matrices()
            .any(|m| k.matmul_for(m.format, llama).1 == input)
    };
    (reads(Input::Q8), reads(Input::Q8K))
}

/// What the step's dispatches share (each recorded through a pass's recorder): the
/// kernels, the residual stream `x` and the matmuls' 8-bit inputs.
struct Ops<'r> {
    k: &'r Kernels,
    x: &'r wgpu::Buffer,
    /// `a` in 8-bit blocks of 32 and of 256 (llama.cpp's arithmetic), and which of them
    /// the model's matmuls read.
    aq: &'r wgpu::Buffer,
    akq: &'r wgpu::Buffer,
    reads: (bool, bool),
    llama: bool,
    /// The norms' epsilon (as bits) and the model's width.
    eps: u32,
    d: usize,
}

impl Ops<'_> {
    /// RMSNorm of the rows of `x` that `idx` lists, by `g`, into `out`.
    fn norm(
        &self,
        rec: &Recorder<'_>,
        p: &mut wgpu::ComputePass<'_>,
        idx: &wgpu::Buffer,
        rows: usize,
        g: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) {
        let params = [self.d as u32, rows as u32, self.eps];
        let bufs = [g, self.x, out, idx];
        rec.dispatch(p, &self.k.rms_norm, &params, &bufs, (rows as u32, 1));
    }

    /// [`Ops::norm`], then `out` into the 8-bit blocks the matrices after it read
    /// ([`Ops::quantize`]): one dispatch where the kernels are `fused` and the model's
    /// matmuls read 8-bit inputs (`norm.wgsl`'s `picked_quantized`: the same words).
    #[allow(clippy::too_many_arguments)]
    fn norm_quantized(
        &self,
        rec: &Recorder<'_>,
        p: &mut wgpu::ComputePass<'_>,
        idx: &wgpu::Buffer,
        rows: usize,
        g: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) {
        let (q8, q8k) = self.reads;
        if !self.k.set.fused || !(q8 || q8k) {
            self.norm(rec, p, idx, rows, g, out);
            return self.quantize(rec, p, out, self.d, rows);
        }
        let quant = q8 as u32 | (q8k as u32) << 1;
        let params = [self.d as u32, rows as u32, self.eps, quant];
        let bufs = [g, self.x, out, idx, self.aq, self.akq];
        let kernel = &self.k.rms_norm_quantized;
        rec.dispatch(p, kernel, &params, &bufs, (rows as u32, 1));
    }

    /// A matmul input into 8-bit blocks (in `aq`, and in blocks of 256 in `akq` where
    /// its width is whole blocks), for the matrices after it.
    fn quantize(
        &self,
        rec: &Recorder<'_>,
        p: &mut wgpu::ComputePass<'_>,
        a: &wgpu::Buffer,
        width: usize,
        rows: usize,
    ) {
        let params = [width as u32, rows as u32];
        let (q8, q8k) = self.reads;
        if q8 {
            let groups = ((width as u32 / 32).div_ceil(WG), rows as u32);
            rec.dispatch(p, &self.k.quantize, &params, &[a, self.aq], groups);
        }
        if q8k && width.is_multiple_of(256) {
            let groups = ((width as u32 / 256).div_ceil(WG), rows as u32);
            rec.dispatch(p, &self.k.quantize_k, &params, &[a, self.akq], groups);
        }
    }

    /// `a` · `m`ᵀ into `out` (added with `add`): with llama.cpp's arithmetic the
    /// quantized formats read `aq` or `akq`, which hold `a` quantized. A matrix of
    /// several parts is one dispatch (a piece), or one per part where the kernels are
    /// not `fused`.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        rec: &Recorder<'_>,
        p: &mut wgpu::ComputePass<'_>,
        m: &Matrix,
        a: &wgpu::Buffer,
        out: &Outputs<'_>,
        rows: usize,
        add: bool,
    ) {
        let (kernel, input) = self.k.matmul_for(m.format, self.llama);
        let input = match input {
            Input::F32 => a,
            Input::Q8 => self.aq,
            Input::Q8K => self.akq,
        };
        self.k.matrix(rec, p, kernel, m, input, out, rows, add);
    }

    /// The head over `rows` rows of `x` that `picked` lists: the final norm into `hp`,
    /// the head's matmul into `logits`, the final soft-capping where the model has it.
    fn head(
        &self,
        rec: &Recorder<'_>,
        p: &mut wgpu::ComputePass<'_>,
        (c, w): (&Config, &Weights),
        picked: &wgpu::Buffer,
        rows: usize,
        [hp, logits]: [&wgpu::Buffer; 2],
    ) {
        if rows == 0 {
            return;
        }
        self.norm_quantized(rec, p, picked, rows, &w.out_norm, hp);
        let out = Outputs::parts(&w.head.parts, &[(logits, c.vocab)]);
        self.matmul(rec, p, &w.head, hp, &out, rows, false);
        if let Some(cap) = c.final_softcap {
            let groups = ((c.vocab as u32).div_ceil(WG), rows as u32);
            let params = [rows as u32, c.vocab as u32, f(cap), 0];
            rec.dispatch(p, &self.k.softcap, &params, &[logits], groups);
        }
    }
}
