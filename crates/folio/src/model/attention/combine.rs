//! Combining the units' partial softmax states: each (row, query head) takes its
//! chunks' states in chunk order, rescales them to the largest maximum and divides by
//! the sum. The order is fixed by the row's position alone, so the bits are too.

use super::plan::Plan;
use super::AttentionStep;
use crate::kernels::{self, Cpu};

/// Each row's output (`n_heads · head_dim`) into `out` from the partial states.
pub(super) fn combine(
    cpu: &Cpu,
    at: &AttentionStep,
    plan: &Plan,
    partial: &[f32],
    out: &mut [f32],
) {
    let h = at.heads;
    let d = h.n_heads * h.head_dim;
    let out = &mut out[..at.rows.len() * d];
    // Rows split over the threads from a few (a decode batch's rows are otherwise
    // serial).
    cpu.pool()
        .rows_mut(out, d, kernels::matmul::BUILD_ROWS, &|r0, out| {
            let mut mine = Vec::new();
            for (r, out) in (r0..).zip(out.chunks_exact_mut(d)) {
                row(at, plan, partial, r, out, &mut mine);
            }
        });
}

/// Row `r`'s output from the units of its block, KV heads by KV heads, each its chunks
/// in order (`mine`: a buffer for the chunks' offsets).
fn row(
    at: &AttentionStep,
    plan: &Plan,
    partial: &[f32],
    r: usize,
    out: &mut [f32],
    mine: &mut Vec<usize>,
) {
    let h = at.heads;
    let (hd, group) = (h.head_dim, h.n_heads / h.n_kv_heads);
    let stride = group * (hd + 2);
    let units = &plan.units;
    let (mut i, end) = plan.block_units[r];
    while i < end {
        let (h0, h1) = (units[i].h0, units[i].h1);
        let mut j = i;
        while j < end && units[j].h0 == h0 {
            j += 1;
        }
        for kh in h0 as usize..h1 as usize {
            // The partial states of row r and KV head kh, chunk by chunk: a unit holds
            // its heads one after another, each with its rows.
            mine.clear();
            let reads = |u: &&super::plan::Unit| (u.r0 as usize..u.r1 as usize).contains(&r);
            mine.extend(units[i..j].iter().filter(reads).map(|u| {
                let rows_in = u.rows();
                u.off + ((kh - h0 as usize) * rows_in + r - u.r0 as usize) * stride
            }));
            for g in 0..group {
                let hq = kh * group + g;
                let part = |c: usize| &partial[c + g * (hd + 2)..][..hd + 2];
                let o = &mut out[hq * hd..(hq + 1) * hd];
                merge(mine.iter().map(|&c| part(c)), o);
            }
        }
        i = j;
    }
}

/// `o` = the softmax-weighted sum of the partial states `parts` ([max, sum, acc]),
/// taken in order.
fn merge<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, o: &mut [f32]) {
    let mx = parts
        .clone()
        .map(|p| p[0])
        .fold(f32::NEG_INFINITY, f32::max);
    o.fill(0.0);
    let mut sum = 0f32;
    for part in parts {
        let w = (part[0] - mx).exp();
        sum += part[1] * w;
        o.iter_mut().zip(&part[2..]).for_each(|(y, a)| *y += a * w);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    o.iter_mut().for_each(|y| *y *= inv);
}
