//! folio against the exact model on long prompts (issue 20): the float64 reference of
//! `scripts/reference_f64_long.py` (fixture `reference_f64_long.json`: a 2048-token and
//! an 8000-token prompt, top-5 log-probabilities at every 64th position and the last 64),
//! on every SIMD path this CPU runs. Each case on its own must be no farther from the
//! exact model than the farther llama.cpp build on that case (mean and max |Δ logprob|
//! over the reference's top-5; `scripts/llama_vs_reference.py --long` measured both
//! builds, prefilling in batches of 512 as llama.cpp prefills a prompt), and the top token
//! may differ from the exact model's only where its top two are within
//! [`TOP_GAP`](super::fidelity_f64::TOP_GAP) nats, as in `fidelity_f64.rs`.
//!
//! The prompt is prefilled in chunks of at most 512, each ending at a scored position
//! (the head runs for those rows only): folio's logits do not depend on the chunking
//! (the invariance tests hold that bit for bit). The scalar path is skipped (an 8k
//! prefill there takes many minutes), and the 8k case runs on the fastest path only
//! (the 2k case covers every path; an 8k prefill on AVX2 took a minute of CI's time).

use super::fidelity_f64::TOP_GAP;
use crate::common::{self, ModelExt};
use folio::internals::{runnable_isas, Isa};
use folio::kv::{KvDtype, Logits};
use folio::model::sampler::{argmax, log_softmax};
use folio::model::Model;
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// folio's distance from the exact model on one case.
struct Distance {
    mean: f64,
    max: f64,
    /// The scored position of the largest |Δ|.
    max_at: usize,
    values: usize,
    /// Scored positions whose top token is not the exact model's, with the exact model's
    /// gap between its top two there.
    top_differs: Vec<(usize, f64)>,
}

/// folio's logits (one row per scored position) of `ids` at `positions` (sorted), over
/// K/V stored as `dtype`: the prompt prefilled in chunks of at most [`CHUNK`] tokens,
/// each ending at the next scored position, whose logits are the chunk's last (the
/// head runs for the scored rows only; folio's logits do not depend on the chunking:
/// the invariance tests hold that bit for bit).
fn scored_logits(m: &Model, ids: &[u32], positions: &[usize], dtype: KvDtype) -> Vec<Vec<f32>> {
    const CHUNK: usize = 512;
    let mut cache = m.new_cache_as(dtype, ids.len());
    let mut rows = Vec::with_capacity(positions.len());
    let mut next = positions.iter().copied().peekable();
    let mut at = 0;
    while at < ids.len() {
        let mut end = (at + CHUNK).min(ids.len());
        let scored = next.next_if(|&p| p < end);
        if let Some(p) = scored {
            end = p + 1;
        }
        let logits = if scored.is_some() {
            Logits::Last
        } else {
            Logits::None
        };
        let l = m.run(&mut cache, &ids[at..end], logits).unwrap();
        if scored.is_some() {
            rows.push(l);
        }
        at = end;
    }
    assert_eq!(rows.len(), positions.len(), "a row per scored position");
    rows
}

/// [`distance`] of `case` over f16 K/V. The 2k case on the fastest path is computed
/// once for the whole binary: it is both the every-path test's and the 8-bit K/V
/// test's baseline (a 2k prefill each); a second caller waits for the first's result.
fn f16_distance(m: &Model, case: &Value) -> Arc<Distance> {
    static FASTEST_2K: OnceLock<Arc<Distance>> = OnceLock::new();
    let fastest = runnable_isas().iter().max() == Some(&m.isa());
    if fastest && case["name"] == "long_2k" {
        FASTEST_2K
            .get_or_init(|| Arc::new(distance(m, case, KvDtype::F16)))
            .clone()
    } else {
        Arc::new(distance(m, case, KvDtype::F16))
    }
}

fn distance(m: &Model, case: &Value, dtype: KvDtype) -> Distance {
    let ids = common::ids(&case["prompt_ids"]);
    let positions: Vec<usize> = case["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap() as usize)
        .collect();
    let tops = case["top5"].as_array().unwrap();
    assert_eq!(tops.len(), positions.len(), "a top-5 per scored position");
    let rows = scored_logits(m, &ids, &positions, dtype);
    let (mut sum, mut max, mut values, mut max_at) = (0f64, 0f64, 0, 0);
    let mut top_differs = Vec::new();
    for ((&p, row), top) in positions.iter().zip(&rows).zip(tops) {
        let lp = log_softmax(row);
        let top = top.as_array().unwrap();
        for e in top {
            let d = (lp[e[0].as_u64().unwrap() as usize] - e[1].as_f64().unwrap()).abs();
            sum += d;
            if d > max {
                (max, max_at) = (d, p);
            }
            values += 1;
        }
        if argmax(row) as u64 != top[0][0].as_u64().unwrap() {
            let gap = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
            top_differs.push((p, gap));
        }
    }
    Distance {
        mean: sum / values as f64,
        max,
        max_at,
        values,
        top_differs,
    }
}

#[test]
fn a_2k_prompts_logprobs_are_no_farther_from_the_exact_model_than_llama_cpps() {
    check_long_case("long_2k", false);
}

/// Before folio's second pass over the outlier blocks (`model/outliers.rs`) this failed:
/// mean 0.0857 (avx2) and 0.0862 (avx512, max 0.659) against llama.cpp's 0.0843 (max
/// 0.565). With it (Intel Xeon, 2026-11-27): avx2 mean 0.0598 max 0.505, avx512 mean
/// 0.0585 max 0.442; with the AVX-512 sixteen-row kernels, avx512 mean 0.0602 max 0.460.
/// The max is a chaotic figure: two variants of those kernels that differ only in the
/// order of float additions gave 0.705 and 0.553.
#[test]
fn an_8k_prompts_logprobs_are_no_farther_from_the_exact_model_than_llama_cpps() {
    check_long_case("long_8k", true);
}

/// 8-bit K/V (`--kv-dtype q8_0`, issue 39) on the 2k case: mean |Δ logprob| from the
/// exact model no more than 10% above f16 K/V's, on the fastest path this CPU runs only
/// (two 2k prefills; the kernels' paths give the same bits as their scalar twins, which
/// the kernel tests hold).
#[test]
fn q8_kv_at_2k_tokens_is_within_10_percent_of_f16s_distance_from_the_exact_model() {
    let fx = common::fixtures("reference_f64_long.json");
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "long_2k")
        .expect("the fixture has long_2k");
    let isa = *runnable_isas().iter().max().expect("a path");
    let m = Model::load(&common::model_path(), 0)
        .expect("load the default model")
        .with_isa(isa);
    let t = Instant::now();
    let f16 = f16_distance(&m, case);
    let q8 = distance(&m, case, KvDtype::Q8);
    let line = format!(
        "{isa}, long_2k: mean |Δ logprob| f16 K/V {:.5} (max {:.4}), q8_0 K/V {:.5} (max {:.4}): q8_0 / f16 = {:.4}; top token differs at {} (f16) and {} (q8_0) of {} scored positions; {:.1}s",
        f16.mean,
        f16.max,
        q8.mean,
        q8.max,
        q8.mean / f16.mean,
        f16.top_differs.len(),
        q8.top_differs.len(),
        q8.values / 5,
        t.elapsed().as_secs_f64()
    );
    println!("{line}");
    assert!(
        q8.mean <= 1.1 * f16.mean,
        "q8_0 farther than 1.1x f16's mean: {line}"
    );
    let wide: Vec<_> = q8.top_differs.iter().filter(|x| x.1 > TOP_GAP).collect();
    assert!(
        wide.is_empty(),
        "q8_0: the top token differs where the exact model's top two are more than {TOP_GAP} apart: {wide:?}; {line}"
    );
}

/// Holds folio, on every SIMD path this CPU runs (the fastest only when `fastest_only`),
/// to llama.cpp's distance on the case named `only`.
fn check_long_case(only: &str, fastest_only: bool) {
    let fx = common::fixtures("reference_f64_long.json");
    let builds = fx["llama_cpp"]["builds"].as_object().expect(
        "reference_f64_long.json holds llama.cpp's figures (scripts/llama_vs_reference.py --long)",
    );
    assert!(!builds.is_empty(), "at least one llama.cpp build measured");
    let cases = fx["cases"].as_array().unwrap();
    assert!(
        cases.iter().any(|c| c["name"] == only),
        "the fixture has {only}"
    );
    let runnable = runnable_isas();
    println!("exact-model fidelity at long context on scalar: skipped, too slow (an 8k prefill takes many minutes there)");
    let mut failures = Vec::new();
    let mut lines = Vec::new();
    let paths = [Isa::Avx2, Isa::Avx512];
    let fastest = paths.into_iter().rfind(|i| runnable.contains(i));
    for isa in paths {
        if fastest_only && Some(isa) != fastest {
            println!("exact-model fidelity on {only} on {isa}: skipped, the fastest path only (the 2k case runs on every path)");
            continue;
        }
        if !runnable.contains(&isa) {
            println!("exact-model fidelity at long context on {isa}: skipped, this CPU cannot run that path");
            continue;
        }
        let m = Model::load(&common::model_path(), 0)
            .expect("load the default model")
            .with_isa(isa);
        assert_eq!(m.isa(), isa, "the model runs the path asked for");
        for case in cases.iter().filter(|c| c["name"] == only) {
            let name = case["name"].as_str().unwrap();
            let n = case["prompt_ids"].as_array().unwrap().len();
            assert!(
                n <= m.config.context_length,
                "{name}: {n} tokens fit the context"
            );
            let t = Instant::now();
            let d = f16_distance(&m, case);
            let secs = t.elapsed().as_secs_f64();
            // Each build's figures on this case: [sum, max, count].
            let mut llama = Vec::new();
            let (mut far_mean, mut far_max) = (0f64, 0f64);
            for (build, b) in builds {
                let c = &b["per_case"][name];
                let mean =
                    c[0].as_f64().expect("llama.cpp's per-case figures") / c[2].as_f64().unwrap();
                let max = c[1].as_f64().unwrap();
                far_mean = far_mean.max(mean);
                far_max = far_max.max(max);
                llama.push(format!("{build} mean {mean:.4} max {max:.4}"));
            }
            let worst_gap = d.top_differs.iter().map(|x| x.1).fold(0f64, f64::max);
            let line = format!(
                "folio on {isa}, {name} ({n} tokens): top-5 logprob |Δ| mean {:.4} max {:.4} \
                 (at {}) over {} values; top token differs at {} of {} scored positions (exact \
                 model's top-two gap there ≤ {worst_gap:.3}); {secs:.1}s. llama.cpp: {}",
                d.mean,
                d.max,
                d.max_at,
                d.values,
                d.top_differs.len(),
                d.values / 5,
                llama.join(", "),
            );
            println!("{line}");
            lines.push(line);
            // As fidelity_f64.rs: numpy's log-softmax of llama.cpp's logits against folio's.
            const ARITHMETIC: f64 = 1e-4;
            if d.mean > far_mean + ARITHMETIC {
                failures.push(format!(
                    "{isa} {name}: mean {:.6} > llama.cpp's {far_mean:.6}",
                    d.mean
                ));
            }
            if d.max > far_max + ARITHMETIC {
                failures.push(format!(
                    "{isa} {name}: max {:.6} > llama.cpp's {far_max:.6}",
                    d.max
                ));
            }
            let wide: Vec<_> = d.top_differs.iter().filter(|x| x.1 > TOP_GAP).collect();
            if !wide.is_empty() {
                failures.push(format!(
                    "{isa} {name}: top token differs where the exact model's top two are \
                     more than {TOP_GAP} apart: {wide:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "farther from the exact model than llama.cpp at long context: {}\n{}",
        failures.join("; "),
        lines.join("\n")
    );
}
