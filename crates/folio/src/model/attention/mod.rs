//! Paged attention: every query row of a ragged batch attends over its own sequence's
//! K/V, read page run by page run from a [`KvStorage`] through the pages its
//! [`Batch`] step names, with no dense copy of the history. Causal by position: the
//! row at position `p` reads keys `0..=p`.
//!
//! Three steps, one file each:
//! - `plan`: the work cut into units of (block of rows, KV heads, key chunk). The query
//!   heads that share a KV head run together, so each key is loaded once for all of
//!   them; up to [`ROW_BLOCK`] rows of one sequence at consecutive positions (a
//!   prefill) go through each tile of keys together, so each page is read from memory
//!   once per block; a query's keys are cut into chunks of [`SPLIT_KEYS`] (split-K), so
//!   one long decode spreads over every thread; and a decode row with enough chunks, or
//!   in a step of many rows, runs every KV head in one unit, piece by piece, so each
//!   page's rows are read whole, once, in order, with the next piece asked for ahead.
//! - `run`: the threads run the units through the kernels' one entry
//!   ([`crate::kernels::attend`]), leaving partial softmax states.
//! - `combine`: each row's chunks' states combined in chunk order.
//!
//! The cut points depend only on the position, never on the batch or the thread count,
//! and each unit's reduction runs keys in order; so a row's output is the same bits
//! whatever else runs in the step, whichever rows share its block and however many
//! threads run it.
//!
//! NOTE: the arithmetic is that of llama.cpp's CPU flash attention (its default): the
//! query rounded to f16 and an online softmax over the keys in order; folio keeps the
//! value accumulator in f32 on every path, faster and nearer the exact model
//! (`tests/it/fidelity_f64.rs`). With llama.cpp's arithmetic (`--llama-arithmetic`) the
//! scalar and AVX2 paths keep it in f16 as llama.cpp does (`Isa::f16_attention`): up to
//! [`SPLIT_KEYS`] keys there is one chunk and the result is exactly llama.cpp's AVX2
//! build's. Without the query's f16 rounding too, the largest
//! |Δ logprob| from the exact model rose past llama.cpp's, so the query keeps it.
//! Figures for these choices: docs/BENCHMARKS.md, "Attention".

mod combine;
mod plan;
mod run;

use crate::kernels::Cpu;
use crate::kv::{Batch, KvStorage};
use plan::{Plan, Shape};
use run::Scale;

/// Keys per split-K chunk.
pub const SPLIT_KEYS: usize = 1024;

/// Query rows per block: consecutive positions of one sequence that go through each
/// tile of K/V together, so a prefill reads each page once per block instead of once
/// per row (and, where a block kernel runs, widens each f16 tile once per block). It
/// changes no row's arithmetic. (32 measured best of 16, 32 and 64: docs/BENCHMARKS.md.)
pub const ROW_BLOCK: usize = 32;

/// Keys a unit of several KV heads runs through all of them before going on: the K/V
/// rows of a page hold every KV head side by side, so running the heads together reads
/// whole rows once, in order, instead of a third of each row per pass. While it runs a
/// piece, each head's kernel call asks for a share of the next piece's whole rows into
/// L2, spread over its keys, so the next piece is in L2 before it starts. (128 measured
/// best of 64-512: docs/BENCHMARKS.md.)
const HEADS_TOGETHER_KEYS: usize = 128;

/// Attention head layout.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// How a layer turns query·key products into softmax inputs, and which keys it sees.
#[derive(Debug, Clone, Copy)]
pub struct Scores {
    /// Multiplies every product (1/sqrt(head_dim), or 1 where Q was scaled already).
    pub scale: f32,
    /// Scores become `cap · tanh(score / cap)` (Gemma 2).
    pub softcap: Option<f32>,
    /// A query at position `p` sees keys `p + 1 - w ..= p` only (sliding window).
    pub window: Option<usize>,
}

impl Scores {
    /// Scaled by 1/sqrt(head_dim), uncapped, every key up to the row's own.
    pub fn plain(head_dim: usize) -> Self {
        Scores {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }
}

/// One layer's attention over a step: what [`attention`] reads.
#[derive(Clone, Copy)]
pub struct AttentionStep<'a> {
    pub heads: Heads,
    pub scores: Scores,
    /// The K/V, every row's own already written.
    pub kv: &'a dyn KvStorage,
    /// The step: sequence `s`'s pages are `batch.seqs[s].pages`.
    pub batch: &'a Batch,
    pub layer: usize,
    /// `rows[r] = (seq, pos)`: query row `r` belongs to sequence `seq` and sits at
    /// position `pos`, whose K/V (and all before it) are written to its pages.
    pub rows: &'a [(usize, usize)],
}

/// Grouped-query attention of `q` (`rows.len()` rows of `n_heads · head_dim`) into `out`
/// (same shape), on `cpu`'s threads. With a window each row's first chunk starts at its
/// window's first key (the later chunks at the fixed cut points), within a block that
/// runs each row alone up to the block's last row's first key and then all together,
/// so a row's bits still depend on its position only.
pub fn attention(cpu: &Cpu, at: &AttentionStep, q: &[f32], out: &mut [f32]) {
    let h = at.heads;
    let group = h.n_heads / h.n_kv_heads;
    let shape = Shape {
        n_kv_heads: h.n_kv_heads,
        state: h.head_dim + 2,
        group,
        window: at.scores.window,
        threads: cpu.pool().parallelism(),
    };
    let plan = Plan::new(at.rows, |s| at.batch.seqs[s].page_size, shape);
    // As ggml's flash attention: with a cap, the scale is divided by it before tanh.
    let scale = match at.scores.softcap {
        Some(cap) => Scale {
            scale: at.scores.scale / cap,
            cap,
        },
        None => Scale {
            scale: at.scores.scale,
            cap: 0.0,
        },
    };
    let mut partial = vec![0f32; plan.partial_len];
    run::run_units(cpu, at, &plan, q, scale, &mut partial);
    combine::combine(cpu, at, &plan, &partial, out);
}

#[cfg(test)]
mod tests;
