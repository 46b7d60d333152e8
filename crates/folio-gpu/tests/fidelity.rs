//! The GPU backend against the exact model, as every backend is held (the backend
//! contract in `folio::model::Backend`): teacher-forced top-5 log-probabilities of the
//! float64 evaluation of the default model (`crates/folio/tests/fixtures/
//! reference_f64.json`, `scripts/reference_f64.py`) no farther from it than
//! llama.cpp's farther build (mean and max |Δ|) over the same cases; and the same
//! on Gemma 3 270M against its own fixture. The CPU backend's distance is printed
//! beside it. One case runs ([`CASES`]), of the default model's nine:
//! on lavapipe (a software rasterizer, CI's device) four of them took 2.5 minutes on
//! 2 cores, "short" and "digits" 45–86 s; docs/gpu.md has the wider figures.
//!
//! Without a Vulkan adapter the test says so and returns.

use folio::kv::{BasicCache, KvDtype, Logits};
use folio::model::sampler::log_softmax;
use folio::Model;
use folio_gpu::{Gpu, GpuBackend};
use serde_json::Value;
use std::path::PathBuf;

/// The cases run (the fixture's "long" alone is half its positions).
const CASES: [&str; 1] = ["short"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// (mean, max) |Δ logprob| over every case's positions' reference top-5.
fn distance(m: &Model, cases: &[Value]) -> (f64, f64) {
    let (mut sum, mut max, mut n) = (0f64, 0f64, 0usize);
    let c = &m.config;
    for case in cases {
        let seq: Vec<u32> = ids(&case["prompt_ids"])
            .into_iter()
            .chain(ids(&case["greedy_ids"]))
            .collect();
        let mut cache =
            BasicCache::with_dtype(c.n_layers, c.kv_dim(), c.head_dim, seq.len(), KvDtype::F16);
        let logits = folio::forward_one(m, &mut cache, &seq[..seq.len() - 1], Logits::All).unwrap();
        for (i, top) in case["top5"].as_array().unwrap().iter().enumerate() {
            let lp = log_softmax(&logits[i * c.vocab..(i + 1) * c.vocab]);
            for e in top.as_array().unwrap() {
                let d = (lp[e[0].as_u64().unwrap() as usize] - e[1].as_f64().unwrap()).abs();
                sum += d;
                max = max.max(d);
                n += 1;
            }
        }
    }
    (sum / n as f64, max)
}

/// The GPU's default arithmetic (f32 matmul inputs), on the default model.
#[test]
fn the_gpu_is_no_farther_from_the_exact_model_than_llama_cpp() {
    let path = std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    no_farther_than_llama_cpp("reference_f64.json", &path);
}

/// The same on Gemma 3 270M (Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 in their blocks; Q/K
/// norms, post-norms, GELU, local and global RoPE, a 262144-token tied head), against
/// its own float64 fixture and llama.cpp's four builds' figures on it
/// (`crates/folio/tests/it/fidelity_f64_gemma.rs` holds the CPU to the same). The model
/// is fetched by `scripts/fetch_gemma.sh` (`scripts/test.sh` runs it); missing, the
/// test fails.
#[test]
fn on_gemma3_the_gpu_is_no_farther_from_the_exact_model_than_llama_cpp() {
    let path = root().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch_gemma.sh",
        path.display()
    );
    no_farther_than_llama_cpp("reference_f64_gemma3.json", &path);
}

/// The GPU's distance from the exact model of `fixture` over [`CASES`], the CPU's
/// printed beside it, against llama.cpp's farthest build's.
fn no_farther_than_llama_cpp(fixture: &str, path: &std::path::Path) {
    let gpu = match Gpu::open(true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            return;
        }
    };
    let fixture = root().join("crates/folio/tests/fixtures").join(fixture);
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let builds = fx["llama_cpp"]["builds"].as_object().unwrap();
    // Each build's (mean, max) over the cases run, from its per-case (sum, max, count).
    let figures = builds.values().map(|b| {
        let (mut sum, mut max, mut n) = (0f64, 0f64, 0f64);
        for name in CASES {
            let c = &b["per_case"][name];
            sum += c[0].as_f64().unwrap();
            max = max.max(c[1].as_f64().unwrap());
            n += c[2].as_f64().unwrap();
        }
        (sum / n, max)
    });
    let (bound_mean, bound_max) = figures.fold((0f64, 0f64), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let cases: Vec<Value> = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| CASES.contains(&c["name"].as_str().unwrap()))
        .cloned()
        .collect();
    assert_eq!(cases.len(), CASES.len());
    let cpu = Model::load(path, 2).unwrap();
    let (cm, cx) = distance(&cpu, &cases);
    let on_gpu = {
        let (m, r) = GpuBackend::put_on(Model::load(path, 2).unwrap(), path, gpu, false);
        r.unwrap();
        m
    };
    let (gm, gx) = distance(&on_gpu, &cases);
    eprintln!(
        "{}: |Δ logprob| vs the exact model over {} cases: gpu mean {gm:.4} max {gx:.4}; \
         cpu mean {cm:.4} max {cx:.4}; llama.cpp's farthest build mean {bound_mean:.4} \
         max {bound_max:.4} (cases {CASES:?})",
        cpu.config.arch,
        cases.len()
    );
    assert!(gm <= bound_mean, "gpu mean {gm} > llama.cpp's {bound_mean}");
    assert!(gx <= bound_max, "gpu max {gx} > llama.cpp's {bound_max}");
}
