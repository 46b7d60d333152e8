//! Element-wise pieces of the forward pass: RMSNorm, GeGLU, soft-capping.

use crate::kernels::quant::{f16_to_f32, f32_to_f16};

/// y = x / sqrt(mean(x²) + eps) * w, row by row (rows of `w.len()`: a token, or one
/// head of it). The sum of squares runs in f64, in order, as ggml's does.
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

/// [`rms_norm`] in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for xs in x.chunks_exact_mut(n) {
        let ss: f64 = xs.iter().map(|v| (v * v) as f64).sum();
        let mean = (ss / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in xs.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// gate = gelu(gate) · up, gelu by its tanh approximation read as ggml's CPU backend
/// reads it: from a table over f16 inputs (the input rounded to f16, the result
/// rounded to f16), 0 below −10 and the identity above 10.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            let x = f16_to_f32(f32_to_f16(x));
            let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
            f16_to_f32(f32_to_f16(y)) * u
        };
    }
}

/// x = cap · tanh(x · (1 / cap)), as ggml's scale, tanh, scale.
pub fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x {
        *v = (*v * inv).tanh() * cap;
    }
}
