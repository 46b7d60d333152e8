//! [`CpuBackend`]: the forward step on this machine's cores. It owns the weights laid
//! out for its instruction-set path, the outlier blocks' second pass picked at load
//! (`outliers`), and the [`Cpu`] handle (threads and path) every kernel call goes
//! through; each step is a [`Forward`] over the batch's rows.

use super::backend::Backend;
use super::config::Config;
use super::error::StepError;
use super::forward::{Forward, Observer};
use super::outliers::{self, Outliers, Pass, Probe, Site};
use super::step_logits::StepLogits;
use super::weights::Weights;
use crate::kernels::matmul::ActKind;
use crate::kernels::{Cpu, Isa, QMatrix};
use crate::kv::{Batch, KvStorage};

/// The forward step on the CPU.
pub struct CpuBackend {
    cpu: Cpu,
    weights: Weights,
    /// The second pass over each matmul input's outlier blocks (empty: llama.cpp's
    /// arithmetic).
    outliers: Outliers,
}

impl CpuBackend {
    /// `weights` on `cpu`, laid out for its path, without outlier passes.
    pub(super) fn new(cpu: Cpu, mut weights: Weights) -> Self {
        weights.lay_out_for(cpu.isa(), false);
        CpuBackend {
            cpu,
            weights,
            outliers: Outliers::default(),
        }
    }

    /// Picks the outlier blocks by running `batch` (the calibration text, its logits
    /// all wanted) through the model with an observer on every matmul input, then gives
    /// each input's matrices their extra columns (see [`outliers`]).
    pub(super) fn calibrate(&mut self, c: &Config, batch: &Batch, kv: &mut dyn KvStorage) {
        /// Gives every matrix of an input the outlier columns, or none of them; each
        /// is rewritten as its old buffer is given back (never held twice).
        fn extend<const N: usize>(p: &Pass, ms: [&mut QMatrix; N]) -> bool {
            if ms.iter().any(|m| m.act_kind() != ActKind::Q8) {
                return false;
            }
            for m in ms {
                *m = p.extend_owned(m.take()).unwrap_or_else(|same| same);
            }
            true
        }
        // Only inputs whose matrices all take 8-bit blocks get the pass (`extend`): a
        // model without any (Q4_K_M's K-quants) skips the calibration forward.
        let q8 = |ms: &[&QMatrix]| ms.iter().all(|m| m.act_kind() == ActKind::Q8);
        let w = &self.weights;
        let any = q8(&[w.head()])
            || (w.layers.iter()).any(|l| q8(&[&l.wq, &l.wk, &l.wv]) || q8(&[&l.w_gate, &l.w_up]));
        if !any {
            tracing::info!("no matmul input takes 8-bit blocks: no outlier pass");
            return;
        }
        let mut probe = Probe::new(c.n_layers);
        let rows = rows_of(batch);
        self.forward(c, batch, &rows)
            .run(kv, &mut StepLogits::new(), Some(&mut probe));
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
    }

    /// Gathers the weights into their final buffers (after calibration and layout).
    pub(super) fn gather(&mut self) {
        self.weights.gather();
    }

    /// llama.cpp's arithmetic: the outlier blocks' second pass off (the matrices lose
    /// their extra columns), attention's value accumulators rounded to f16 where the
    /// path gives llama.cpp's bits ([`Isa::f16_attention`]), and the matrices in the
    /// layouts whose kernels sum in llama.cpp's order ([`QMatrix::llama_layout_for`]).
    pub(super) fn llama_arithmetic(&mut self) {
        self.cpu.llama_arithmetic();
        let o8 = std::mem::take(&mut self.outliers);
        let restore = |p: &Option<Pass>, ms: &mut [&mut QMatrix]| {
            if let Some(p) = p {
                ms.iter_mut().for_each(|m| **m = p.restore(m));
            }
        };
        let layers = self.weights.layers.iter_mut();
        for ((l, a), f) in layers.zip(&o8.attention).zip(&o8.feed_forward) {
            restore(a, &mut [&mut l.wq, &mut l.wk, &mut l.wv]);
            restore(f, &mut [&mut l.w_gate, &mut l.w_up]);
        }
        restore(&o8.head, &mut [self.weights.head_mut()]);
        self.weights.lay_out_for(self.cpu.isa(), true);
        self.weights.gather();
    }

    /// How many matmul inputs get the second pass (0: llama.cpp's arithmetic).
    pub fn outlier_passes(&self) -> usize {
        self.outliers.count()
    }

    /// Moves to path `isa` (which the caller has checked this CPU runs), the weights
    /// laid out again for its kernels; `gather` as after loading.
    pub(super) fn set_isa(&mut self, isa: Isa, gather: bool) {
        self.cpu.set_isa(isa);
        self.weights.lay_out_for(isa, self.cpu.llama());
        if gather {
            self.weights.gather();
        }
    }

    /// The instruction-set path the kernels take.
    pub fn isa(&self) -> Isa {
        self.cpu.isa()
    }

    fn forward<'a>(
        &'a self,
        c: &'a Config,
        batch: &'a Batch,
        rows: &'a [(usize, usize)],
    ) -> Forward<'a> {
        Forward {
            cfg: c,
            weights: &self.weights,
            outliers: &self.outliers,
            cpu: &self.cpu,
            batch,
            rows,
        }
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("cpu {} ×{} threads", self.cpu.isa(), self.cpu.threads())
    }

    fn threads(&self) -> usize {
        self.cpu.threads()
    }

    fn bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token()
    }

    fn kv_signature(&self) -> Vec<u8> {
        let mut s = self.outliers.signature();
        // llama.cpp's f16 value accumulators change every attention output, so every
        // later layer's K/V (folio's f32 ones add nothing: fingerprints stay as they were).
        if self.cpu.rounds_attention() {
            s.extend_from_slice(b"attention:f16-accumulators");
        }
        s
    }

    fn step(
        &self,
        config: &Config,
        batch: &Batch,
        kv: &mut dyn KvStorage,
        out: &mut StepLogits,
    ) -> Result<(), StepError> {
        let rows = rows_of(batch);
        self.forward(config, batch, &rows).run(kv, out, None);
        if !out.all_finite(self.cpu.pool()) {
            return Err(StepError::NonFinite);
        }
        Ok(())
    }

    fn as_cpu(&self) -> Option<&CpuBackend> {
        Some(self)
    }

    fn as_cpu_mut(&mut self) -> Option<&mut CpuBackend> {
        Some(self)
    }
}

impl Observer for Probe {
    fn input(&mut self, site: Site, values: &[f32], width: usize) {
        self.record(site, values, width);
    }

    fn logits(&self) -> bool {
        false
    }
}

/// Every new token of `batch` as (sequence, position), in order.
fn rows_of(batch: &Batch) -> Vec<(usize, usize)> {
    let seqs = batch.seqs.iter().enumerate();
    seqs.flat_map(|(s, st)| (st.start..st.end()).map(move |p| (s, p)))
        .collect()
}
