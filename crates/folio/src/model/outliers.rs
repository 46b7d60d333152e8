//! A second 8-bit pass over the outlier blocks of a matmul's input.
//!
//! Every matmul input is rounded to 8 bits per block of 32 values (`d·q`, `d` = the
//! block's largest magnitude / 127), as llama.cpp rounds it. A few channels of a
//! model's hidden state carry values tens of times larger than the rest, and the
//! blocks that hold them get a step so coarse that their other values are mostly lost.
//! In the default model the top block of a norm's output carries about half of that
//! input's rounding error (the sum of `d²` over its blocks), and the channels are the
//! same from token to token.
//!
//! So at load a short calibration prompt runs through the model and, for each input
//! that feeds the attention projections, the feed-forward's gate and up, or the output
//! head, the blocks with the largest `Σ d²` are picked ([`LAYER_BLOCKS`],
//! [`HEAD_BLOCKS`]). Each matrix reading that input gets those blocks' columns again,
//! copied bit for bit after its own ([`QMatrix::block_columns`]), and the input row
//! gets, after its own values, what their 8-bit rounding left (`x - d·q`,
//! [`kernels::q8_residual`](crate::kernels::q8_residual)), which the matmul rounds to 8
//! bits in turn. So one matmul, over one block in 18 more (two in the head), makes
//! the outlier blocks about 16-bit accurate and puts folio about 30% nearer the exact
//! model (`tests/it/fidelity_f64*.rs`). The attention output's and the down
//! projection's inputs spread their rounding error over many blocks (their top block
//! holds 15-19% of it): a pass there bought little on the mean and moved the fixtures'
//! maxima both ways, so they have none.
//!
//! A row's correction depends on that row alone and sits at fixed columns, so a row's
//! logits still do not depend on the batch, the chunking, the pages or the threads.
//! [`Model::llama_arithmetic`](super::Model::llama_arithmetic) takes the columns off
//! again: llama.cpp's arithmetic, for the tests that hold folio to it.

use crate::kernels::{self, Isa, QMatrix};

/// Values per block of the 8-bit formats.
const QK: usize = 32;

/// Outlier blocks picked for each layer input (the attention projections', the
/// feed-forward's gate and up).
pub const LAYER_BLOCKS: usize = 1;

/// Outlier blocks picked for the output head's input, whose rounding moves every logit
/// directly. Four took the short fixtures' mean |Δ logprob| only from 0.0573 to 0.0558
/// (AVX2 path) for 3.3 MB more read per decoded token (issue 20's closing note lists
/// the configurations measured).
pub const HEAD_BLOCKS: usize = 2;

/// A matmul input whose outlier blocks get the second pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The attention projections' input in layer `l` (Q, K, V).
    Attention(usize),
    /// The feed-forward's input in layer `l` (gate, up).
    FeedForward(usize),
    /// The output head's input.
    Head,
}

/// What calibration measures: per site, `Σ d²` of each block over the prompt's rows.
pub struct Probe {
    /// Per layer: attention, feed-forward.
    layers: Vec<[Vec<f64>; 2]>,
    head: Vec<f64>,
}

impl Probe {
    pub fn new(layers: usize) -> Self {
        Self {
            layers: vec![Default::default(); layers],
            head: Vec::new(),
        }
    }

    /// `site`'s sums.
    fn sums(&mut self, site: Site) -> &mut Vec<f64> {
        match site {
            Site::Attention(l) => &mut self.layers[l][0],
            Site::FeedForward(l) => &mut self.layers[l][1],
            Site::Head => &mut self.head,
        }
    }

    /// Adds the rows of `x` (`cols` each) seen at `site`.
    pub fn record(&mut self, site: Site, x: &[f32], cols: usize) {
        let sums = self.sums(site);
        sums.resize(cols / QK, 0.0);
        for row in x.chunks_exact(cols) {
            for (s, b) in sums.iter_mut().zip(row.chunks_exact(QK)) {
                let d = b.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                *s += f64::from(d) * f64::from(d);
            }
        }
    }

    /// The `k` blocks of `site` with the largest sums, in ascending order (ties: the
    /// lower block).
    fn top(&mut self, site: Site, k: usize) -> Vec<usize> {
        let sums = &*self.sums(site);
        let mut order: Vec<usize> = (0..sums.len()).collect();
        order.sort_by(|&a, &b| sums[b].total_cmp(&sums[a]).then(a.cmp(&b)));
        order.truncate(k);
        order.sort_unstable();
        order
    }
}

/// One input's second pass: its width and its outlier blocks.
pub struct Pass {
    cols: usize,
    blocks: Vec<usize>,
}

impl Pass {
    /// The pass over `site`'s top `k` blocks of its `cols`-wide input (`None` where
    /// there is none to pick).
    pub fn new(probe: &mut Probe, site: Site, k: usize, cols: usize) -> Option<Self> {
        let blocks = probe.top(site, k);
        (!blocks.is_empty()).then_some(Self { cols, blocks })
    }

    /// The blocks this pass corrects.
    pub fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    /// Width of the input with its residual blocks.
    pub fn width(&self) -> usize {
        self.cols + self.blocks.len() * QK
    }

    /// `m` (a matrix reading the input) with the outlier blocks' columns again after
    /// its own, its old buffer given back as it is read (see
    /// [`QMatrix::into_block_columns`]); `Err` gives it back untouched, for a format
    /// without 32-wide blocks.
    pub fn extend_owned(&self, m: QMatrix) -> Result<QMatrix, QMatrix> {
        assert_eq!(m.cols, self.cols, "a matrix of this input");
        let own = 0..self.cols / QK;
        m.into_block_columns(&own.chain(self.blocks.iter().copied()).collect::<Vec<_>>())
    }

    /// `m` as it was before [`Pass::extend_owned`].
    pub fn restore(&self, m: &QMatrix) -> QMatrix {
        let own: Vec<usize> = (0..self.cols / QK).collect();
        m.block_columns(&own)
            .expect("an extended matrix has 32-wide blocks")
    }

    /// What the 8-bit rounding left of `row`'s outlier blocks, into `out` (a block's
    /// worth each, in order): what follows the row in the extended matrices' input.
    pub fn residuals(&self, isa: Isa, row: &[f32], out: &mut [f32]) {
        assert_eq!(
            out.len(),
            self.blocks.len() * QK,
            "a block of residuals per block"
        );
        for (&b, r) in self.blocks.iter().zip(out.chunks_exact_mut(QK)) {
            kernels::q8_residual(isa, &row[b * QK..(b + 1) * QK], r);
        }
    }
}

/// Every input's pass (those without one run llama.cpp's arithmetic).
#[derive(Default)]
pub struct Outliers {
    pub attention: Vec<Option<Pass>>,
    pub feed_forward: Vec<Option<Pass>>,
    pub head: Option<Pass>,
}

impl Outliers {
    /// Every input's pass, the layers' by kind, then the head's.
    fn all(&self) -> impl Iterator<Item = &Option<Pass>> {
        (self.attention.iter().chain(&self.feed_forward)).chain([&self.head])
    }

    /// How many inputs have a pass.
    pub fn count(&self) -> usize {
        self.all().flatten().count()
    }

    /// Every pass's blocks, for the model's fingerprint: K/V computed with one set of
    /// passes is not reused under another. Empty without any.
    pub fn signature(&self) -> Vec<u8> {
        if self.count() == 0 {
            return Vec::new();
        }
        let mut sig = b"outliers:".to_vec();
        for p in self.all() {
            if let Some(p) = p {
                sig.extend(p.blocks.iter().flat_map(|&b| (b as u32).to_le_bytes()));
            }
            sig.extend(u32::MAX.to_le_bytes());
        }
        sig
    }
}
