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
/// rounded to f16), 0 below −10 and the identity above 10. The table is made once, by
/// [`gelu_f16`] for each of the 65536 f16 values: a lookup in place of `tanhf` per
/// element (which took ~20% of Gemma 3's prefill), with the same bits.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    static TABLE: std::sync::OnceLock<Box<[u16]>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| (0..=u16::MAX).map(gelu_f16).collect());
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            f16_to_f32(table[f32_to_f16(x) as usize]) * u
        };
    }
}

/// gelu (tanh approximation, in f32) of the f16 value `h`, rounded to f16.
fn gelu_f16(h: u16) -> u16 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let x = f16_to_f32(h);
    let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
    f32_to_f16(y)
}

/// x = cap · tanh(x · (1 / cap)), as ggml's scale, tanh, scale.
pub fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x {
        *v = (*v * inv).tanh() * cap;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table gives what computing each element would: the input rounded to f16,
    /// gelu in f32, the result rounded to f16, times up; bit for bit, over inputs that
    /// sweep every f16 binade in (-10, 10), the edges, and non-finite values.
    #[test]
    fn geglu_table_gives_the_direct_formulas_bits() {
        let direct = |x: f32, u: f32| {
            if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * u
            } else {
                f16_to_f32(gelu_f16(f32_to_f16(x))) * u
            }
        };
        let mut xs: Vec<f32> = (0..200_000)
            .map(|i| -11.0 + 22.0 * i as f32 / 200_000.0)
            .collect();
        xs.extend((0..=u16::MAX).map(f16_to_f32));
        xs.extend([
            -10.0,
            10.0,
            9.999,
            -9.999,
            0.0,
            -0.0,
            1e-8,
            f32::NAN,
            f32::INFINITY,
        ]);
        let up: Vec<f32> = xs.iter().map(|x| 0.5 + x.abs().fract()).collect();
        let mut gate = xs.clone();
        geglu(&mut gate, &up);
        for ((&x, &u), &g) in xs.iter().zip(&up).zip(&gate) {
            let want = direct(x, u);
            assert!(
                want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                "gelu({x}) * {u}: table {g}, direct {want}"
            );
        }
    }
}
