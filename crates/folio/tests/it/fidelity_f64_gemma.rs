//! folio against the exact model on Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0
//! tensors): the float64 evaluation of its dequantized weights (`scripts/reference_f64.py`
//! on the gemma3 architecture, fixture `reference_f64_gemma3.json`: four prompts of
//! `llama_cpp_gemma3.json` with llama.cpp's 24-token greedy continuations, 205
//! teacher-forced positions), on every instruction-set path this CPU runs, held to the
//! same bounds as the default model in `fidelity_f64.rs` (whose check this runs): mean
//! and max |Δ logprob| over the exact model's top-5 no more than llama.cpp's, and a top
//! token other than the exact model's only where its top two are within
//! [`TOP_GAP`](super::fidelity_f64::TOP_GAP) nats.
//!
//! llama.cpp's figures are one build's: the AVX-512 build of the same commit
//! (`scripts/llama_vs_reference.py` measured it; no AVX2 build of it was at hand), so the
//! bound is that build's mean and max, not the farther of two builds.
//!
//! The prompts are all shorter than the model's 512-token sliding window: the fixture
//! exercises the Gemma 3 layer (Q/K norms, NEOX RoPE with base 10000 on local layers and
//! 1e6 on global ones, post-attention and post-FFN norms, GELU, embedding × sqrt(640),
//! tied head), not the window's mask (`sliding_window.rs` holds that).
//!
//! The model file is not in the repository: `scripts/fetch_gemma.sh` fetches it
//! (`scripts/test.sh` runs it first). A missing file fails the test; it never skips.

use super::fidelity_f64::no_farther_than_llama_cpp;
use crate::common;

/// Cases the scalar path runs.
const SCALAR_CASES: [&str; 2] = ["short", "chat_gemma"];

#[test]
fn gemma3_teacher_forced_logprobs_no_farther_from_exact_model_than_llama_cpp() {
    let model = common::root().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        model.exists(),
        "{} is missing: run `scripts/fetch_gemma.sh` (scripts/test.sh does)",
        model.display()
    );
    no_farther_than_llama_cpp("reference_f64_gemma3.json", &model, &SCALAR_CASES);
}
