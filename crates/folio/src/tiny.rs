//! A tiny llama-family model with random weights, written as a real GGUF file: two
//! layers, width 64, a byte-level BPE vocabulary of 261 tokens and a ChatML template.
//! Tests use it to run the whole load → tokenize → forward → sample path in
//! milliseconds; its output is noise, but deterministic noise.

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

/// Random weight bytes of `rows` × `cols` in `ty` (F32, F16, Q4_1 or Q8_0).
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
        other => panic!("tiny model weights of type {other} are not generated"),
    }
}

/// The GGUF bytes of a tiny model with matrices of type `ty`.
pub fn model_bytes(seed: u64, ty: GgmlType) -> Vec<u8> {
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
        .meta("llama.embedding_length", Value::U32(DIM as u32))
        .meta("llama.feed_forward_length", Value::U32(FFN as u32))
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
        (0..DIM)
            .flat_map(|_| (1.0 + rng.signed_f32() * 0.1).to_le_bytes())
            .collect()
    };
    let kv = DIM / HEADS as u64 * KV_HEADS as u64;
    w.tensor(
        "token_embd.weight",
        &[DIM, vocab],
        GgmlType::Q8_0,
        weights(&mut rng, GgmlType::Q8_0, vocab, DIM),
    );
    for l in 0..LAYERS {
        let mut t = |name: &str, cols: u64, rows: u64, rng: &mut SplitMix64| {
            w.tensor(
                &format!("blk.{l}.{name}"),
                &[cols, rows],
                ty,
                weights(rng, ty, rows, cols),
            );
        };
        t("attn_q.weight", DIM, DIM, &mut rng);
        t("attn_k.weight", DIM, kv, &mut rng);
        t("attn_v.weight", DIM, kv, &mut rng);
        t("attn_output.weight", DIM, DIM, &mut rng);
        t("ffn_gate.weight", DIM, FFN, &mut rng);
        t("ffn_up.weight", DIM, FFN, &mut rng);
        t("ffn_down.weight", FFN, DIM, &mut rng);
        w.tensor(
            &format!("blk.{l}.attn_norm.weight"),
            &[DIM],
            GgmlType::F32,
            norm(&mut rng),
        );
        w.tensor(
            &format!("blk.{l}.ffn_norm.weight"),
            &[DIM],
            GgmlType::F32,
            norm(&mut rng),
        );
    }
    w.tensor("output_norm.weight", &[DIM], GgmlType::F32, norm(&mut rng));
    w.to_bytes()
}

/// Writes a tiny model to `path`.
pub fn write_model(path: &std::path::Path, seed: u64, ty: GgmlType) -> std::io::Result<()> {
    std::fs::write(path, model_bytes(seed, ty))
}
