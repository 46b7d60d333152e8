//! Issue 15's weight formats end to end: wide tiny models stored in Q5_0, Q5_1, IQ4_NL,
//! Q2_K, Q3_K, Q5_K and in Q4_K_M- / Q5_K_M-like mixes load, and on every path folio
//! runs them as llama.cpp does (fixture made by `scripts/make_format_fixtures.py` from
//! the same bytes, which this test builds itself and checks by hash): the same prompt
//! ids, the same greedy ids up to llama.cpp's first near-tie, the same top token at
//! every position where llama.cpp's is clear, top-5 log-probabilities within a stated
//! distance, and no farther than llama.cpp from the exact float64 model.

use crate::common::{self, ModelExt};
use folio::internals::runnable_isas;
use folio::kv::Logits;
use folio::model::sampler::argmax;
use folio::model::Model;
use folio::tiny::{self, Formats};

/// FNV-1a, 64 bits: the hash the fixture script records for each model file.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes model `name` into a temporary folder, checking its bytes are the fixture's.
fn write(name: &str, formats: Formats, want_hash: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let bytes = tiny::wide_model_bytes(tiny::FORMAT_SEED, formats);
    assert_eq!(
        format!("{:016x}", fnv1a64(&bytes)),
        want_hash,
        "{name}: the tiny model's bytes changed; rerun scripts/make_format_fixtures.py"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// llama.cpp's top two within this many nats: a near-tie either engine may take either
/// way. Both round every matmul input to 8 bits, each its own way; on these random
/// models that moves a log-probability by up to ~0.14 between them (MAX_DIFF below),
/// while each stays as far as the other from the exact model (EXACT_RATIO). The top
/// tokens measured to differ had llama.cpp's top two at most 0.146 apart.
const TIE: f64 = 0.2;

/// Bounds on |folio − llama.cpp| over llama.cpp's top-5 log-probabilities, every model
/// and path. Measured (AMD Zen 4, llama.cpp's AVX-512 build): max 0.142 (Q4_K_M on
/// the AVX-512 path), largest per-model mean 0.031 (Q5_K_M).
const MAX_DIFF: f64 = 0.2;
const MAX_MEAN: f64 = 0.05;

/// folio's mean distance from the exact float64 model (the fixture's `exact_top5`) may
/// exceed llama.cpp's by this factor plus 0.002 nats: folio approximates the model at
/// least about as well as llama.cpp does.
const EXACT_RATIO: f64 = 1.25;

#[test]
fn tiny_models_in_the_issue_15_formats_match_llama_cpp() {
    let fx = common::fixtures("llama_cpp_formats.json");
    let models = fx["models"].as_array().unwrap();
    assert_eq!(models.len(), tiny::FORMAT_MODELS.len());
    let (mut bad, mut worst, mut worst_mean) = (Vec::new(), 0f64, 0f64);
    for (name, formats) in tiny::FORMAT_MODELS {
        let model = models
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing from the fixture"));
        let (_dir, path) = write(name, formats, model["fnv1a64"].as_str().unwrap());
        for isa in runnable_isas() {
            let m = Model::load(&path, 2)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .with_isa(isa);
            let (mut max, mut sum, mut n) = (0f64, 0f64, 0usize);
            let (mut greedy_same, mut cases) = (0, 0);
            let mut exact_sum = 0f64;
            for case in model["cases"].as_array().unwrap() {
                let what = format!("{name} on {isa}, case {}", case["name"]);
                let prompt = common::ids(&case["prompt_ids"]);
                let text = case["text"].as_str().unwrap();
                assert_eq!(m.tokenizer.encode(text, true), prompt, "{what}: prompt ids");
                let exact = case["exact_top5"].as_array().unwrap();
                common::teacher_forced(&m, case, |i, row, top, diffs| {
                    let lp = folio::model::sampler::log_softmax(row);
                    for (e, x) in top.iter().zip(exact[i].as_array().unwrap()) {
                        let id = e[0].as_u64().unwrap() as usize;
                        exact_sum += (lp[id] - x.as_f64().unwrap()).abs();
                    }
                    for &d in diffs {
                        max = max.max(d);
                        sum += d;
                        n += 1;
                    }
                    let (t, want) = (argmax(row) as u64, top[0][0].as_u64().unwrap());
                    let gap = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
                    if gap > TIE && t != want {
                        bad.push(format!(
                            "{what}@{i}: top token {t}, llama.cpp {want} (gap {gap})"
                        ));
                    }
                });
                // Free-running greedy, one token per step as llama.cpp ran it: the same ids
                // up to a step where llama.cpp's own top two are within TIE (random
                // models have many near-ties); past a tie taken the other way the
                // sequences part, and the comparison stops there.
                let gen = common::ids(&case["greedy_ids"]);
                let tops = case["top5"].as_array().unwrap();
                let mut cache = m.new_cache(prompt.len() + gen.len() + 1);
                let mut l = m.run(&mut cache, &prompt, Logits::Last).unwrap();
                let mut same = true;
                for (k, &want) in gen.iter().enumerate() {
                    let t = argmax(&l);
                    if t != want {
                        let top = &tops[prompt.len() - 1 + k];
                        let gap = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
                        if gap >= TIE {
                            bad.push(format!(
                                "{what}: greedy step {k}: {t}, llama.cpp {want} (gap {gap})"
                            ));
                        }
                        same = false;
                        break;
                    }
                    l = m.run(&mut cache, &[t], Logits::Last).unwrap();
                }
                greedy_same += usize::from(same);
                cases += 1;
            }
            let (exact_mean, llama_exact) = (
                exact_sum / n as f64,
                model["llama_vs_exact"]["mean"].as_f64().unwrap(),
            );
            eprintln!(
                "{name} on {isa}: top-5 logprob |diff| max {max:.4}, mean {:.4}; greedy ids \
                 identical in {greedy_same}/{cases} cases; mean distance from the exact \
                 model {exact_mean:.4} (llama.cpp's {llama_exact:.4})",
                sum / n as f64
            );
            if exact_mean > EXACT_RATIO * llama_exact + 0.002 {
                bad.push(format!(
                    "{name} on {isa}: {exact_mean} from the exact model, llama.cpp {llama_exact}"
                ));
            }
            worst = worst.max(max);
            worst_mean = worst_mean.max(sum / n as f64);
        }
    }
    assert!(bad.is_empty(), "differs from llama.cpp: {bad:#?}");
    assert!(
        worst <= MAX_DIFF,
        "top-5 logprob |diff| max {worst} > {MAX_DIFF} (measured 0.142 when written)"
    );
    assert!(
        worst_mean <= MAX_MEAN,
        "top-5 logprob |diff| mean {worst_mean} > {MAX_MEAN} (measured 0.031 when written)"
    );
}

/// Batch invariance on the sixteen-row tile formats of the SIMD paths (Q4_0, IQ4_NL,
/// Q5_K, which the AVX2 paths keep in rows, the Q5_K_M-like mix: Q5_0, Q5_K, Q6_K, and a
/// Q8_0 embedding): on every path
/// the CPU runs, a prompt prefilled whole, in uneven chunks (tile widths 1..=4 and
/// their tails on the AVX2 paths, up to 16 on AVX-512) and one token at a time
/// (decode's one-row kernels) gives the same logits, bit for bit, with one thread or two.
#[test]
fn wide_tiny_models_in_the_tile_formats_batch_bit_for_bit_on_every_path() {
    use folio::gguf::GgmlType;
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let formats = [
        ("Q4_0", Formats::Uniform(GgmlType::Q4_0)),
        ("IQ4_NL", Formats::Uniform(GgmlType::IQ4_NL)),
        ("Q5_K", Formats::Uniform(GgmlType::Q5_K)),
        ("Q5_K_M", Formats::KMix(GgmlType::Q5_K)),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, f) in formats {
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(&path, tiny::wide_model_bytes(tiny::FORMAT_SEED, f)).unwrap();
        for isa in runnable_isas() {
            let one = Model::load(&path, 1).unwrap().with_isa(isa);
            let two = Model::load(&path, 2).unwrap().with_isa(isa);
            let v = one.config.vocab;
            let ids: Vec<u32> = (0..37).map(|i| (i * 7919 % v) as u32).collect();
            let what = format!("{name} on {isa}");
            let mut c = one.new_cache(64);
            let whole = bits(&one.run(&mut c, &ids, Logits::All).unwrap());
            let mut c = two.new_cache(64);
            let got = bits(&two.run(&mut c, &ids, Logits::All).unwrap());
            assert!(got == whole, "{what}: two threads");
            let mut c = two.new_cache(64);
            let mut at = 0;
            for len in [1, 2, 3, 4, 5, 6, 7, 9] {
                let got = bits(&two.run(&mut c, &ids[at..at + len], Logits::All).unwrap());
                assert!(
                    got[..] == whole[at * v..(at + len) * v],
                    "{what}: chunk at {at}"
                );
                at += len;
            }
            for (i, &t) in ids.iter().enumerate().skip(at) {
                let got = bits(&two.run(&mut c, &[t], Logits::Last).unwrap());
                assert!(
                    got[..] == whole[i * v..(i + 1) * v],
                    "{what}: token {i} alone"
                );
            }
        }
    }
}
