//! A tiny llama-family model with random weights, written as a real GGUF file: two
//! layers, width 64, a byte-level BPE vocabulary of 261 tokens and a ChatML template.
//! Tests use it to run the whole load → tokenize → forward → sample path in
//! milliseconds; its output is noise, but deterministic noise.
//!
//! A wider variant (width 256, FFN 512: the K-quants need rows of 256) stores its
//! matrices in any weight format folio computes with, one format throughout or a mix
//! like llama.cpp's Q4_K_M / Q5_K_M ([`Formats`]); `scripts/make_format_fixtures.py`
//! runs llama.cpp on the same files.

use crate::gguf::{GgmlType, GgufWriter, Value};
use crate::kernels::quant::f32_to_f16;
use crate::rng::SplitMix64;

/// Shape of the tiny model.
pub const DIM: u64 = 64;
pub const FFN: u64 = 128;
pub const HEADS: u32 = 4;
pub const KV_HEADS: u32 = 2;
pub const LAYERS: u32 = 2;
pub const CONTEXT: u32 = 512;

/// Shape of the wide variant.
pub const WIDE_DIM: u64 = 256;
pub const WIDE_FFN: u64 = 512;

/// Which format each matrix of a wide tiny model takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formats {
    /// Every matrix, the token embedding (also the output head) included.
    Uniform(GgmlType),
    /// A K-quant mix as llama.cpp's `_M` presets make it: the token embedding (tied
    /// output head) and layer 0's `attn_v` and `ffn_down` in Q6_K, the rest in `base`.
    KMix(GgmlType),
}

/// The seed of the wide models compared with llama.cpp.
pub const FORMAT_SEED: u64 = 15;

/// The wide models compared with llama.cpp, by name: each format of issue 15 alone,
/// and Q4_K_M- and Q5_K_M-like mixes.
pub const FORMAT_MODELS: [(&str, Formats); 8] = [
    ("Q5_0", Formats::Uniform(GgmlType::Q5_0)),
    ("Q5_1", Formats::Uniform(GgmlType::Q5_1)),
    ("IQ4_NL", Formats::Uniform(GgmlType::IQ4_NL)),
    ("Q2_K", Formats::Uniform(GgmlType::Q2_K)),
    ("Q3_K", Formats::Uniform(GgmlType::Q3_K)),
    ("Q5_K", Formats::Uniform(GgmlType::Q5_K)),
    ("Q4_K_M", Formats::KMix(GgmlType::Q4_K)),
    ("Q5_K_M", Formats::KMix(GgmlType::Q5_K)),
];

impl Formats {
    /// The format of tensor `name` (without the `blk.N.` prefix) of layer `layer`
    /// (`None` for the token embedding).
    fn of(self, layer: Option<u32>, name: &str) -> GgmlType {
        match self {
            Formats::Uniform(ty) => ty,
            Formats::KMix(base) => match (layer, name) {
                (None, _) => GgmlType::Q6_K,
                (Some(0), "attn_v.weight" | "ffn_down.weight") => GgmlType::Q6_K,
                _ => base,
            },
        }
    }
}

/// Offsets and magnitudes (low, spread) of the f16 scale fields of a block of `ty`:
/// chosen so that weights come out with a standard deviation near 0.05 (the narrow
/// model's 0.12 scaled by 1/√width: larger weights make attention nearly one-hot and
/// the random model chaotic, its outputs swinging with every rounding).
fn scale_fields(ty: GgmlType) -> &'static [(usize, f32, f32)] {
    match ty {
        GgmlType::Q4_0 => &[(0, 0.01, 0.01)],
        GgmlType::Q5_0 => &[(0, 0.004, 0.004)],
        GgmlType::Q5_1 => &[(0, 0.004, 0.001), (2, -0.07, 0.0)],
        GgmlType::IQ4_NL => &[(0, 0.0006, 0.0003)],
        GgmlType::Q2_K => &[(80, 0.003, 0.001), (82, 0.003, 0.001)],
        GgmlType::Q3_K => &[(108, 0.0008, 0.0004)],
        GgmlType::Q4_K => &[(0, 0.0002, 0.0001), (2, 0.0015, 0.0007)],
        GgmlType::Q5_K => &[(0, 0.0001, 0.00005), (2, 0.0015, 0.0007)],
        GgmlType::Q6_K => &[(208, 0.00003, 0.00001)],
        _ => &[],
    }
}

/// Narrows the random integer sub-block scales (and mins) of a K-quant block to the
/// upper half of their range, with either sign where they are signed: a quantizer gives
/// the sub-blocks of normal weights scales of one order of magnitude, whereas random
/// bytes give some sub-blocks tens of times the scale of their neighbours: outliers that make a
/// random model sensitive to every rounding (its log-probabilities then move by tenths
/// of a nat between two correct implementations).
fn narrow_sub_scales(ty: GgmlType, b: &mut [u8]) {
    match ty {
        // Low nibble the scale, high the min: both 8..16.
        GgmlType::Q2_K => b[..16].iter_mut().for_each(|x| *x |= 0x88),
        // 6-bit scale = (4 low bits | 2 high bits << 4) - 32: the high fields 0 or 3
        // give -32..-16 or 16..32.
        GgmlType::Q3_K => b[104..108].iter_mut().for_each(|x| *x = (*x & 0x55) * 3),
        // Bit 5 of every 6-bit scale and min (bits 5 and 7 of the first eight bytes).
        GgmlType::Q4_K | GgmlType::Q5_K => b[4..12].iter_mut().for_each(|x| *x |= 0xA0),
        // i8 scales: 64..128 or -128..-64.
        GgmlType::Q6_K => b[192..208].iter_mut().for_each(|x| {
            *x = if *x & 0x80 != 0 {
                0x80 | (*x & 0x3F)
            } else {
                0x40 | (*x & 0x3F)
            }
        }),
        _ => {}
    }
}

/// Random weight bytes of `rows` × `cols` in `ty` (F32, F16, Q4_1, Q8_0, or a format
/// listed in [`scale_fields`]).
fn weights(rng: &mut SplitMix64, ty: GgmlType, rows: u64, cols: u64) -> Vec<u8> {
    let n = (rows * cols) as usize;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| (rng.signed_f32() * 0.2).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f32_to_f16(rng.signed_f32() * 0.2).to_le_bytes())
            .collect(),
        GgmlType::Q4_1 => (0..n / 32)
            .flat_map(|_| {
                let mut b = f32_to_f16(0.02 + rng.signed_f32().abs() * 0.02)
                    .to_le_bytes()
                    .to_vec();
                b.extend(f32_to_f16(-0.15).to_le_bytes());
                b.extend((0..16).map(|_| rng.next_u64() as u8));
                b
            })
            .collect(),
        GgmlType::Q8_0 => (0..n / 32)
            .flat_map(|_| {
                let mut b = f32_to_f16(0.002 + rng.signed_f32().abs() * 0.002)
                    .to_le_bytes()
                    .to_vec();
                b.extend((0..32).map(|_| (rng.next_u64() % 255) as u8));
                b
            })
            .collect(),
        other if !scale_fields(other).is_empty() => {
            let (be, bb) = other.block_layout();
            (0..n / be as usize)
                .flat_map(|_| {
                    let mut b: Vec<u8> = (0..bb).map(|_| rng.next_u64() as u8).collect();
                    narrow_sub_scales(other, &mut b);
                    for &(at, low, spread) in scale_fields(other) {
                        let v = low + rng.signed_f32().abs() * spread;
                        b[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
                    }
                    b
                })
                .collect()
        }
        other => panic!("tiny model weights of type {other} are not generated"),
    }
}

/// The GGUF bytes of a tiny model with matrices of type `ty`.
pub fn model_bytes(seed: u64, ty: GgmlType) -> Vec<u8> {
    build(seed, DIM, FFN, |layer, _| match layer {
        None => GgmlType::Q8_0,
        Some(_) => ty,
    })
}

/// The GGUF bytes of a wide tiny model (width [`WIDE_DIM`], FFN [`WIDE_FFN`]) whose
/// matrices take `formats`.
pub fn wide_model_bytes(seed: u64, formats: Formats) -> Vec<u8> {
    build(seed, WIDE_DIM, WIDE_FFN, |layer, name| {
        formats.of(layer, name)
    })
}

/// A tiny model of width `dim` and FFN `ffn`; `ty(layer, name)` gives each matrix's
/// format (`None`: the token embedding).
fn build(seed: u64, dim: u64, ffn: u64, ty: impl Fn(Option<u32>, &str) -> GgmlType) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let byte_char = crate::tokenizer::byte_to_char();
    let mut tokens: Vec<String> = byte_char.iter().map(|c| c.to_string()).collect();
    let merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    let vocab = tokens.len() as u64;
    let mut types = vec![1i32; tokens.len()];
    let n = types.len();
    types[n - 2] = 3;
    types[n - 1] = 3;
    let s = |v: &str| Value::String(v.to_string());
    let mut w = GgufWriter::new();
    w.meta("general.architecture", s("llama"))
        .meta("general.name", s("folio-tiny"))
        .meta("llama.block_count", Value::U32(LAYERS))
        .meta("llama.context_length", Value::U32(CONTEXT))
        .meta("llama.embedding_length", Value::U32(dim as u32))
        .meta("llama.feed_forward_length", Value::U32(ffn as u32))
        .meta("llama.attention.head_count", Value::U32(HEADS))
        .meta("llama.attention.head_count_kv", Value::U32(KV_HEADS))
        .meta("llama.rope.freq_base", Value::F32(10000.0))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("tokenizer.ggml.model", s("gpt2"))
        .meta("tokenizer.ggml.pre", s("smollm"))
        .meta(
            "tokenizer.ggml.tokens",
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        )
        .meta(
            "tokenizer.ggml.merges",
            Value::Array(merges.iter().map(|m| s(m)).collect()),
        )
        .meta("tokenizer.ggml.bos_token_id", Value::U32(vocab as u32 - 2))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(vocab as u32 - 1))
        .meta("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .meta("tokenizer.chat_template", s(crate::tokenizer::CHATML));
    let norm = |rng: &mut SplitMix64| -> Vec<u8> {
        (0..dim)
            .flat_map(|_| (1.0 + rng.signed_f32() * 0.1).to_le_bytes())
            .collect()
    };
    let kv = dim / HEADS as u64 * KV_HEADS as u64;
    let embd = ty(None, "token_embd.weight");
    w.tensor(
        "token_embd.weight",
        &[dim, vocab],
        embd,
        weights(&mut rng, embd, vocab, dim),
    );
    for l in 0..LAYERS {
        let mut t = |name: &str, cols: u64, rows: u64, rng: &mut SplitMix64| {
            let ty = ty(Some(l), name);
            w.tensor(
                &format!("blk.{l}.{name}"),
                &[cols, rows],
                ty,
                weights(rng, ty, rows, cols),
            );
        };
        t("attn_q.weight", dim, dim, &mut rng);
        t("attn_k.weight", dim, kv, &mut rng);
        t("attn_v.weight", dim, kv, &mut rng);
        t("attn_output.weight", dim, dim, &mut rng);
        t("ffn_gate.weight", dim, ffn, &mut rng);
        t("ffn_up.weight", dim, ffn, &mut rng);
        t("ffn_down.weight", ffn, dim, &mut rng);
        w.tensor(
            &format!("blk.{l}.attn_norm.weight"),
            &[dim],
            GgmlType::F32,
            norm(&mut rng),
        );
        w.tensor(
            &format!("blk.{l}.ffn_norm.weight"),
            &[dim],
            GgmlType::F32,
            norm(&mut rng),
        );
    }
    w.tensor("output_norm.weight", &[dim], GgmlType::F32, norm(&mut rng));
    w.to_bytes()
}

/// Writes a tiny model to `path`.
pub fn write_model(path: &std::path::Path, seed: u64, ty: GgmlType) -> std::io::Result<()> {
    std::fs::write(path, model_bytes(seed, ty))
}
