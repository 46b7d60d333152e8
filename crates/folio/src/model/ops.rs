//! Element-wise pieces of the forward pass: RMSNorm, RoPE, SwiGLU, softmax.

use super::config::{Config, RopeStyle};

/// y = x / sqrt(mean(x²) + eps) * w, row by row. The sum of squares runs in f64, in
/// order, as ggml's does.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xs, ys) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f64 = xs.iter().map(|v| (v * v) as f64).sum();
        let mean = (ss / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((y, &v), &g) in ys.iter_mut().zip(xs).zip(w) {
            *y = v * scale * g;
        }
    }
}

/// cos/sin of every rotated pair at position `pos`, computed as ggml does (the angle
/// advanced by repeated multiplication) so positions round the same way.
pub fn rope_table(c: &Config, pos: usize, out: &mut Vec<(f32, f32)>) {
    out.clear();
    let scale = c.rope_base.powf(-2.0 / c.rope_dims as f32);
    let mut theta = pos as f32;
    for _ in 0..c.rope_dims / 2 {
        out.push((theta.cos(), theta.sin()));
        theta *= scale;
    }
}

/// Rotates every head of one token row in place.
pub fn rope(c: &Config, table: &[(f32, f32)], row: &mut [f32]) {
    let hd = c.head_dim;
    let half = c.rope_dims / 2;
    for head in row.chunks_exact_mut(hd) {
        for (i, &(cos, sin)) in table.iter().enumerate() {
            let (a, b) = match c.rope_style {
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                RopeStyle::Halves => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            // ggml's C is compiled with FP contraction on, so these are fused there.
            head[a] = x0.mul_add(cos, -(x1 * sin));
            head[b] = x0.mul_add(sin, x1 * cos);
        }
    }
}
