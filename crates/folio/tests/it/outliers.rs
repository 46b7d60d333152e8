//! The second pass over each matmul input's outlier blocks (`model/outliers.rs`): which
//! models get it, what it costs, and that `llama_arithmetic` is the model without it.
//! Its effect on fidelity is measured in `fidelity_f64*.rs`; that it keeps the batch,
//! chunk, page and thread invariance is `batch.rs`'s, whose tiny Q4_1 model has it.

use crate::common::{self, ModelExt};
use folio::gguf::GgmlType;
use folio::kv::Logits;
use folio::model::sampler::log_softmax;
use folio::model::Model;

#[test]
fn the_default_model_corrects_its_layers_inputs_and_the_head() {
    let m = Model::load(&common::model_path(), 0).expect("load the default model");
    let layers = m.config.n_layers;
    assert_eq!(
        m.outlier_passes(),
        2 * layers + 1,
        "two inputs a layer, and the head"
    );
    let plain = Model::load(&common::model_path(), 0)
        .unwrap()
        .llama_arithmetic();
    assert_eq!(plain.outlier_passes(), 0);
    let extra = m.bytes_per_token() - plain.bytes_per_token();
    let share = extra as f64 / plain.bytes_per_token() as f64;
    eprintln!(
        "outlier pass: {extra} more weight bytes per token ({:.1}%)",
        100.0 * share
    );
    assert!(
        share > 0.0 && share < 0.1,
        "the pass reads a few blocks: {share}"
    );
    // K/V made with one arithmetic is never reused under the other.
    assert_ne!(m.fingerprint(), plain.fingerprint());

    let ids = m.tokenizer.encode("The capital of France is", true);
    let run = |m: &Model| {
        let mut cache = m.new_cache(ids.len());
        m.run(&mut cache, &ids, Logits::Last).unwrap()
    };
    let (a, b) = (run(&m), run(&plain));
    assert_ne!(a, b, "the pass changes the logits");
    // A correction, not another model: the plain model's top five keep their
    // log-probabilities within 0.3 nats (llama.cpp's AVX2 and AVX-512 builds are up to
    // ~1 nat apart on the fixtures).
    let (la, lb) = (log_softmax(&a), log_softmax(&b));
    let mut top: Vec<usize> = (0..lb.len()).collect();
    top.sort_by(|&i, &j| lb[j].total_cmp(&lb[i]));
    for &t in &top[..5] {
        let d = (la[t] - lb[t]).abs();
        assert!(d < 0.3, "token {t}: |Δ logprob| {d}");
    }
}

#[test]
fn quantized_layers_get_the_pass_and_f32_ones_do_not() {
    // The tiny models' embedding (their tied head) is Q8_0: it has a pass either way.
    let dir = tempfile::tempdir().unwrap();
    for (ty, layer_passes) in [(GgmlType::Q4_1, 2), (GgmlType::F32, 0)] {
        let path = dir.path().join(format!("{ty}.gguf"));
        folio::tiny::write_model(&path, 5, ty).unwrap();
        let m = Model::load(&path, 2).unwrap();
        let want = layer_passes * m.config.n_layers + 1;
        assert_eq!(m.outlier_passes(), want, "{ty}");
    }
}
