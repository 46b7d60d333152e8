//! Rotary position embedding: the two layouts (adjacent pairs as llama rotates them,
//! halves as NeoX does), the frequency scaling the metadata states (linear, YaRN, and
//! Llama 3's per-frequency divisors, spelled as metadata or stored as the `rope_freqs`
//! tensor; Phi-3's long-context pair of divisor sets, [`LongRope`]), and the
//! per-position cos/sin table computed as ggml computes it.
//!
//! NOTE: with no scaling every factor below is exactly 1 (and YaRN's mix 0), so the
//! table has the bits of the plain recurrence `theta *= base^(-2/dims)`.
//!
//! Longrope's set is chosen once by the model's configured context
//! (`Model::with_context`; the engine sets its window there): short up to
//! `rope.scaling.original_context_length`, long beyond, as llama.cpp chooses by its
//! context per sequence. Never by a sequence's length, so every sequence rotates with
//! one table and the batching invariance holds; the chosen set is part of the model's
//! fingerprint, so K/V cached or saved under one set is never reused under the other.
//! Any other `rope.scaling.type` is `ModelError::UnsupportedRopeScaling`; a divisor
//! tensor of the wrong length is `BadShape`, a divisor that is not positive
//! `BadValues`.

use super::error::ModelError;
use crate::gguf::{Gguf, Value};
use crate::kernels::{self, Isa};

/// RoPE variants: llama rotates adjacent pairs, NeoX rotates halves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    Adjacent,
    Halves,
}

/// The scaling types folio reads from `<arch>.rope.scaling.type`.
/// (`longrope` scales as `linear` does; its divisors come from the tensors that
/// [`LongRope`] holds, read whatever the type.)
pub const SCALING_TYPES: &[&str] = &["none", "linear", "yarn", "llama3", "longrope"];

/// One RoPE as a layer applies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Rotated dimensions of each head (the first `dims`; the rest pass through).
    pub dims: usize,
    pub base: f32,
    /// 1 / the scaling factor (1 = none).
    pub freq_scale: f32,
    /// YaRN's ramp between interpolated and extrapolated angles (0 = none).
    pub ext_factor: f32,
    /// Multiplies cos and sin (YaRN's magnitude correction; 1 = none).
    pub attn_factor: f32,
    /// YaRN's correction range, in rotated pairs (from `yarn`, for this `base`).
    pub corr_dims: [f32; 2],
    /// YaRN's original context and (beta_fast, beta_slow).
    pub yarn: (usize, [f32; 2]),
    /// A divisor per frequency (`dims / 2` of them): Llama 3's scaling, or the set of
    /// [`LongRope`] the model's context chose.
    pub factors: Option<Vec<f32>>,
}

impl Rope {
    /// The RoPE of `arch` as the metadata states it. `base` and `freq_scale` may be
    /// overridden per layer afterwards (Gemma's local layers).
    pub fn from_gguf(
        g: &Gguf,
        arch: &str,
        style: RopeStyle,
        dims: usize,
        context_length: usize,
    ) -> Result<Self, ModelError> {
        let key = |k: &str| format!("{arch}.{k}");
        let float = |k: &str| g.get(&key(k)).and_then(Value::as_f64).map(|v| v as f32);
        let base = float("rope.freq_base").unwrap_or(10000.0);
        let ty = match g.get(&key("rope.scaling.type")) {
            None => "linear",
            Some(v) => v.as_str().ok_or_else(|| ModelError::BadMetadata {
                key: key("rope.scaling.type"),
                reason: "not a string".into(),
            })?,
        };
        let factor = float("rope.scaling.factor")
            .or_else(|| float("rope.scale_linear"))
            .filter(|&f| f != 0.0)
            .unwrap_or(1.0);
        if !(factor.is_finite() && factor > 0.0) {
            return Err(ModelError::BadMetadata {
                key: key("rope.scaling.factor"),
                reason: format!("{factor} is not a positive factor"),
            });
        }
        let n_ctx_orig = g
            .get(&key("rope.scaling.original_context_length"))
            .and_then(Value::as_u64)
            .map_or(context_length, |v| v as usize);
        let mut rope = Self {
            style,
            dims,
            base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: float("rope.scaling.attn_factor").unwrap_or(1.0),
            corr_dims: [0.0, 0.0],
            yarn: (n_ctx_orig, [32.0, 1.0]),
            factors: None,
        };
        match ty {
            "none" => {}
            // llama.cpp scales a longrope model's angles by the factor as it does a
            // linear one's (ext_factor 0); what makes it longrope is the divisors.
            "linear" | "longrope" => rope.freq_scale = 1.0 / factor,
            "yarn" => {
                rope.freq_scale = 1.0 / factor;
                rope.ext_factor = float("rope.scaling.yarn_ext_factor").unwrap_or(1.0);
                let beta_fast = float("rope.scaling.yarn_beta_fast").unwrap_or(32.0);
                let beta_slow = float("rope.scaling.yarn_beta_slow").unwrap_or(1.0);
                rope.yarn = (n_ctx_orig, [beta_fast, beta_slow]);
                rope = rope.with_base(base);
                if rope.ext_factor != 0.0 {
                    // The magnitude correction the table applies, cancelled here and
                    // replaced by the model's own (as llama.cpp sets its attn_factor).
                    let f = 1.0 / rope.freq_scale;
                    let mscale = |m: f32| {
                        if f <= 1.0 {
                            1.0
                        } else {
                            0.1 * m * f.ln() + 1.0
                        }
                    };
                    let log_mul = float("rope.scaling.yarn_log_multiplier").unwrap_or(0.0);
                    let want = if log_mul != 0.0 {
                        mscale(1.0) / mscale(log_mul)
                    } else {
                        mscale(1.0)
                    };
                    rope.attn_factor *= want * (1.0 / (1.0 + 0.1 * f.ln()));
                }
            }
            "llama3" => {
                let low = float("rope.scaling.low_freq_factor").unwrap_or(1.0);
                let high = float("rope.scaling.high_freq_factor").unwrap_or(4.0);
                rope.factors = Some(llama3_factors(dims, base, factor, low, high, n_ctx_orig));
            }
            other => {
                return Err(ModelError::UnsupportedRopeScaling {
                    ty: other.to_string(),
                    supported: SCALING_TYPES.join(", "),
                })
            }
        }
        Ok(rope)
    }

    /// The same RoPE on another base (YaRN's correction range follows it, as ggml
    /// computes it from each layer's base).
    pub fn with_base(mut self, base: f32) -> Self {
        let (n_ctx_orig, [fast, slow]) = self.yarn;
        self.base = base;
        self.corr_dims = corr_dims(self.dims, n_ctx_orig, base, fast, slow);
        self
    }

    /// cos/sin of every rotated pair at position `pos`, as ggml computes them: the angle
    /// advanced by repeated multiplication (so positions round the same way), divided
    /// by its frequency's factor, scaled, and for YaRN ramped between the two.
    pub fn table(&self, pos: usize, out: &mut Vec<(f32, f32)>) {
        out.clear();
        let theta_scale = self.base.powf(-2.0 / self.dims as f32);
        let mut theta = pos as f32;
        for i in 0..self.dims / 2 {
            let ff = self.factors.as_ref().map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let (mut t, mut mscale) = (interp, self.attn_factor);
            if self.ext_factor != 0.0 {
                let [low, high] = self.corr_dims;
                let y = (i as f32 - low) / 0.001f32.max(high - low);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                t = extrap.mul_add(mix, interp * (1.0 - mix));
                mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
            }
            out.push((t.cos() * mscale, t.sin() * mscale));
            theta *= theta_scale;
        }
    }

    /// Rotates every head (`head_dim` wide) of one token row in place.
    pub fn rotate(&self, isa: Isa, head_dim: usize, table: &[(f32, f32)], row: &mut [f32]) {
        let adjacent = self.style == RopeStyle::Adjacent;
        kernels::rope_rotate(isa, adjacent, self.dims / 2, head_dim, table, row);
    }
}

/// Phi-3's long-context RoPE (llama.cpp's "longrope", transformers' "su"): two sets of
/// per-frequency divisors, the tensors `rope_factors_short.weight` and
/// `rope_factors_long.weight` (`dims / 2` each), of which a model runs one. Beside
/// them the converter writes the extended context as `context_length`, the one trained
/// before as `rope.scaling.original_context_length`, and a magnitude correction as
/// `rope.scaling.attn_factor` (`sqrt(1 + ln(scale) / ln(original))`), which multiplies
/// cos and sin whichever set runs ([`Rope::attn_factor`]).
///
/// NOTE: the set is chosen by the context the model is configured for, `n_ctx` (the
/// most tokens one sequence may hold: the engine's window, `Model::with_context`),
/// never by a sequence's current length or by the batch: short while `n_ctx` is at most
/// the original context, long beyond it, as llama.cpp chooses by its context per
/// sequence. Every sequence of a model then rotates with the same table, so a
/// sequence's bits do not depend on what runs beside it, how its prompt is chunked,
/// or how long it has grown (choosing by the current length would re-rotate the
/// cached K/V of a sequence crossing the original length, or give two lengths two
/// answers for the same prefix). llama.cpp rounds its context up to a multiple of 256
/// first; folio compares the window itself, which chooses the same set whenever the
/// original context is a multiple of 256 (4096 in Phi-3's files).
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// Divisors for a context up to the original one (`None`: the tensor is absent,
    /// every divisor 1, as llama.cpp runs it).
    pub short: Option<Vec<f32>>,
    /// Divisors for a context beyond the original one (`None` as above).
    pub long: Option<Vec<f32>>,
    /// The context trained before the extension.
    pub n_ctx_orig: usize,
}

impl LongRope {
    /// Whether a model configured for `n_ctx` tokens per sequence runs the long set.
    pub fn is_long(&self, n_ctx: usize) -> bool {
        n_ctx > self.n_ctx_orig
    }

    /// The divisors a model configured for `n_ctx` tokens per sequence runs.
    pub fn factors_for(&self, n_ctx: usize) -> Option<&[f32]> {
        if self.is_long(n_ctx) {
            self.long.as_deref()
        } else {
            self.short.as_deref()
        }
    }
}

/// YaRN's correction range: the rotated pairs whose wavelength spans `beta` turns over
/// the original context, from `beta_fast` (start, floored) to `beta_slow` (end, ceiled).
fn corr_dims(
    dims: usize,
    n_ctx_orig: usize,
    base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let corr = |turns: f32| {
        dims as f32 * (n_ctx_orig as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    [
        corr(beta_fast).floor().max(0.0),
        corr(beta_slow).ceil().min(dims as f32 - 1.0),
    ]
}

/// Llama 3's divisor of each frequency: 1 above the high-frequency wavelength bound,
/// `factor` below the low one, and a smooth blend between (computed in f64).
pub fn llama3_factors(
    dims: usize,
    base: f32,
    factor: f32,
    low: f32,
    high: f32,
    n_ctx_orig: usize,
) -> Vec<f32> {
    let (factor, low, high, orig) = (factor as f64, low as f64, high as f64, n_ctx_orig as f64);
    (0..dims / 2)
        .map(|i| {
            let freq = (base as f64).powf(-((2 * i) as f64) / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < orig / high {
                1.0
            } else if wavelen > orig / low {
                factor as f32
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The NOTE at the top: unscaled, the table is the plain recurrence, bit for bit
    /// (the default model's RoPE did not move when scaling came in).
    #[test]
    fn unscaled_table_is_the_plain_recurrence_bit_for_bit() {
        let rope = Rope {
            style: RopeStyle::Adjacent,
            dims: 64,
            base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            corr_dims: [0.0, 0.0],
            yarn: (4096, [32.0, 1.0]),
            factors: None,
        };
        let mut table = Vec::new();
        for pos in [0, 1, 7, 1000, 8191] {
            rope.table(pos, &mut table);
            let scale = 10000f32.powf(-2.0 / 64.0);
            let mut theta = pos as f32;
            for &(cos, sin) in &table {
                assert_eq!(cos.to_bits(), theta.cos().to_bits(), "cos at {pos}");
                assert_eq!(sin.to_bits(), theta.sin().to_bits(), "sin at {pos}");
                theta *= scale;
            }
        }
    }

    /// Llama 3's divisors: 1 for the fastest frequencies, the factor for the slowest,
    /// never decreasing between.
    #[test]
    fn llama3_factors_run_from_one_to_the_factor() {
        let f = llama3_factors(64, 500000.0, 8.0, 1.0, 4.0, 8192);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[31], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    }

    /// The NOTE on [`LongRope`]: short up to the original context, long beyond it; an
    /// absent set is no divisors at all.
    #[test]
    fn longrope_runs_short_up_to_the_original_context_and_long_beyond() {
        let lr = LongRope {
            short: Some(vec![1.5; 4]),
            long: Some(vec![6.0; 4]),
            n_ctx_orig: 256,
        };
        assert_eq!(lr.factors_for(1), Some(&[1.5; 4][..]));
        assert_eq!(lr.factors_for(256), Some(&[1.5; 4][..]));
        assert_eq!(lr.factors_for(257), Some(&[6.0; 4][..]));
        assert_eq!(lr.factors_for(1 << 20), Some(&[6.0; 4][..]));
        let only_long = LongRope { short: None, ..lr };
        assert_eq!(only_long.factors_for(256), None);
        assert!(only_long.is_long(257));
    }

    /// A divisor set divides each pair's angle before the table takes cos and sin, and
    /// the magnitude correction multiplies both: the bits of `cos(theta / f) * m`.
    #[test]
    fn divisors_divide_the_angle_and_attn_factor_scales_cos_and_sin_bit_for_bit() {
        let factors: Vec<f32> = (0..8).map(|i| 1.0 + 1.7 * i as f32).collect();
        let rope = Rope {
            style: RopeStyle::Halves,
            dims: 16,
            base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.118034,
            corr_dims: [0.0, 0.0],
            yarn: (256, [32.0, 1.0]),
            factors: Some(factors.clone()),
        };
        let mut table = Vec::new();
        for pos in [0, 3, 63, 300] {
            rope.table(pos, &mut table);
            let scale = 10000f32.powf(-2.0 / 16.0);
            let mut theta = pos as f32;
            for (&(cos, sin), f) in table.iter().zip(&factors) {
                let t = theta / f;
                assert_eq!(
                    cos.to_bits(),
                    (t.cos() * 1.118034).to_bits(),
                    "cos at {pos}"
                );
                assert_eq!(
                    sin.to_bits(),
                    (t.sin() * 1.118034).to_bits(),
                    "sin at {pos}"
                );
                theta *= scale;
            }
        }
    }
}
