//! Embeddings on the default model: the engine hands back every token's hidden state
//! after the final norm, pools them as float64 pooling of those states says (within
//! float32 rounding), is causal (a prefix's last state is the longer prompt's state at
//! that position), gives the same bits alone and batched with other work (through the
//! scheduler, in a pool small enough to preempt), frees its pages, and refuses bad
//! input with typed errors.

use crate::common::{self, ModelExt};
use folio::engine::pooling;
use folio::engine::{Engine, EngineConfig, EngineError, Pooling, Prompt, Request};
use folio::internals::QMatrix;
use folio::kv::Logits;
use folio::model::{Model, SamplingParams};

/// One engine at a time (each keeps both cores busy).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn engine(pages: usize, max_batch_tokens: usize) -> Engine {
    let model = Model::load(&common::model_path(), 2).unwrap();
    let cfg = EngineConfig {
        kv_pages: pages,
        page_size: 16,
        max_batch_tokens,
        max_seq_tokens: Some(512),
        snapshot_dir: None,
        ..Default::default()
    };
    Engine::new(model, cfg).unwrap()
}

fn tokens(e: &Engine, text: &str) -> Vec<u32> {
    e.model().tokenizer.encode(text, true)
}

const TEXT: &str =
    "The quick brown fox jumps over the lazy dog, and the dog sleeps on in the warm afternoon sun.";

/// The float64 pooling of `states`, written out here rather than taken from
/// `folio::engine::pooling`.
fn pool_f64(states: &[Vec<f32>], how: Pooling, normalize: bool) -> Vec<f64> {
    let dim = states[0].len();
    let mut v: Vec<f64> = match how {
        Pooling::Mean => (0..dim)
            .map(|j| states.iter().map(|s| s[j] as f64).sum::<f64>() / states.len() as f64)
            .collect(),
        Pooling::Last => states[states.len() - 1].iter().map(|&x| x as f64).collect(),
        Pooling::Cls => states[0].iter().map(|&x| x as f64).collect(),
    };
    if normalize {
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// The tolerance of "within float32 rounding": one float32 ulp of each value
/// (relative 2^-23; rounding to nearest is half of that), and the smallest normal
/// float32 for values near zero.
fn within_f32_rounding(got: &[f32], want: &[f64]) -> Result<(), String> {
    assert_eq!(got.len(), want.len());
    for (j, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = w.abs() * f32::EPSILON as f64 + f32::MIN_POSITIVE as f64;
        if (g as f64 - w).abs() > tol {
            return Err(format!(
                "value {j}: {g} against float64 {w} (tolerance {tol:e})"
            ));
        }
    }
    Ok(())
}

#[test]
fn pooled_embeddings_are_the_float64_pooling_of_every_tokens_state() {
    let _s = serial();
    let e = engine(256, 64);
    let dim = e.model().config.dim;
    let toks = tokens(&e, TEXT);
    assert!(
        toks.len() > 16,
        "a prompt of several chunks (64-token steps)"
    );
    let states = e.embed(toks.clone()).unwrap();
    assert_eq!(states.len(), toks.len());
    assert!(states.iter().all(|s| s.len() == dim));
    assert!(states.iter().flatten().all(|x| x.is_finite()));
    // Distinct positions have distinct states, and the final norm leaves no row zero.
    assert_ne!(states[0], states[1]);
    assert!(states
        .iter()
        .all(|s| s.iter().map(|x| x * x).sum::<f32>() > 0.0));
    // Again: the same bits.
    assert_eq!(e.embed(toks.clone()).unwrap(), states);
    for how in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
        for normalize in [false, true] {
            let got = e
                .submit_embedding(toks.clone())
                .unwrap()
                .wait_pooled(how, normalize)
                .unwrap();
            let want = pool_f64(&states, how, normalize);
            within_f32_rounding(&got, &want)
                .unwrap_or_else(|m| panic!("{how:?}, normalize {normalize}: {m}"));
            if normalize {
                let norm: f64 = got.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
                assert!((norm - 1.0).abs() < 1e-6, "{how:?}: norm {norm}");
            }
        }
    }
    // The handle's pooling is the pooling module's.
    let flat: Vec<f32> = states.concat();
    let mean = pooling::pool(&flat, dim, Pooling::Mean, true).unwrap();
    assert_eq!(
        e.submit_embedding(toks)
            .unwrap()
            .wait_pooled(Pooling::Mean, true)
            .unwrap(),
        mean
    );
    e.check_invariants().unwrap();
}

/// The states are the LM head's input: the head applied to the last token's state in
/// float64 (its matrix dequantized from the file) gives the model's logits for that
/// position, up to the 8-bit rounding of the head's input in the model's matmul
/// (held to 2% of the largest logit: 0.8% measured on the default model; a state
/// before the norm, or any other, misses by the size of the logits), and the same top
/// token.
#[test]
fn the_head_applied_to_the_last_state_gives_the_models_logits() {
    let _s = serial();
    let e = engine(64, 64);
    let toks = tokens(&e, TEXT);
    let states = e.embed(toks.clone()).unwrap();
    let last = &states[states.len() - 1];
    let m = e.model();
    let mut cache = m.new_cache(toks.len());
    let logits = m.run(&mut cache, &toks, Logits::Last).unwrap();
    let g = folio::gguf::Gguf::open(&common::model_path()).unwrap();
    let t = g
        .tensor("output.weight")
        .or_else(|| g.tensor("token_embd.weight"))
        .unwrap();
    let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
    assert_eq!((cols, rows), (m.config.dim, m.config.vocab));
    let head = QMatrix::new(t.ty, rows, cols, g.tensor_bytes(t)).unwrap();
    let mut row = vec![0f32; cols];
    let exact: Vec<f64> = (0..rows)
        .map(|v| {
            head.dequant_row(v, &mut row);
            row.iter()
                .zip(last)
                .map(|(&w, &x)| w as f64 * x as f64)
                .sum()
        })
        .collect();
    let scale = logits.iter().fold(0f32, |a, x| a.max(x.abs())) as f64;
    let worst = exact
        .iter()
        .zip(&logits)
        .fold(0f64, |a, (&x, &l)| a.max((x - l as f64).abs()));
    println!(
        "head(state) against the model's logits: max |Δ| {worst:.4} (largest logit {scale:.2})"
    );
    assert!(worst <= 0.02 * scale, "max |Δ| {worst} against {scale}");
    let top = |v: &[f64]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
    let model_top = top(&logits.iter().map(|&x| x as f64).collect::<Vec<_>>());
    assert_eq!(top(&exact), model_top);
}

/// Causality: the state at position k depends only on tokens 0..=k, so `last` pooling
/// of a prefix is the longer prompt's state at the prefix's last position. Both run as
/// one sequence through the same batched step code, so the bits agree; the test holds
/// them to 1e-5 of the row's largest value, what a different chunking could move.
#[test]
fn last_pooling_of_a_prefix_is_the_longer_prompts_state_there() {
    let _s = serial();
    let e = engine(256, 32);
    let long = tokens(&e, TEXT);
    let states = e.embed(long.clone()).unwrap();
    let mut worst = 0f32;
    for k in [1, 2, 7, 16, 17, long.len() - 1] {
        let last = e
            .submit_embedding(long[..k].to_vec())
            .unwrap()
            .wait_pooled(Pooling::Last, false)
            .unwrap();
        let at = &states[k - 1];
        let scale = at.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = last
            .iter()
            .zip(at)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff / scale);
        assert!(
            diff <= 1e-5 * scale,
            "prefix of {k}: |Δ| {diff} against the row's largest value {scale}"
        );
    }
    println!("causality: largest |Δ| / row max over the prefixes: {worst:e}");
}

/// Through the scheduler: embeddings submitted together with generations, in a pool
/// small enough that sequences are preempted, give the bits they give alone, every
/// generation still finishes, and every page comes back.
#[test]
fn embeddings_batch_with_other_work_and_give_the_bits_they_give_alone() {
    let _s = serial();
    let texts: Vec<String> = (0..6)
        .map(|i| {
            format!(
                "{TEXT} Sentence number {i}.{}",
                " More words here.".repeat(i)
            )
        })
        .collect();
    let alone: Vec<Vec<Vec<f32>>> = {
        let e = engine(256, 64);
        texts
            .iter()
            .map(|t| e.embed(tokens(&e, t)).unwrap())
            .collect()
    };
    // 10 pages of 16 tokens: far less than everything at once.
    let e = engine(10, 64);
    let streams: Vec<_> = (0..3)
        .map(|i| {
            let mut r = Request::new(Prompt::Text(format!("Count to ten, take {i}:")));
            r.max_tokens = 48;
            r.ignore_eos = true;
            r.sampling = SamplingParams {
                temperature: 0.0,
                ..Default::default()
            };
            e.submit(r).unwrap()
        })
        .collect();
    let handles: Vec<_> = texts
        .iter()
        .map(|t| e.submit_embedding(tokens(&e, t)).unwrap())
        .collect();
    for (h, want) in handles.into_iter().zip(&alone) {
        assert_eq!(&h.wait().unwrap(), want);
    }
    for s in streams {
        let c = s.collect_all().unwrap();
        assert!(c[0].finish.is_some());
    }
    let stats = e.stats().unwrap();
    println!(
        "steps {}, preemptions {}, prefilled {}",
        stats.steps, stats.preemptions, stats.prefilled_tokens
    );
    e.check_invariants().unwrap();
    let (free, cached) = e.idle_pages().unwrap();
    assert_eq!(free + cached, 10, "every page back");
}

#[test]
fn bad_embeddings_are_typed_errors() {
    let _s = serial();
    let e = engine(8, 64);
    let vocab = e.model().config.vocab as u32;
    assert!(matches!(e.embed(vec![]), Err(EngineError::EmptyPrompt)));
    assert!(matches!(
        e.embed(vec![1; 600]),
        Err(EngineError::PromptTooLong { len: 600, .. })
    ));
    // A whole window (512) is embedded: nothing is generated after it (the fifth
    // hostile probe found it refused); one token more is not.
    let big = engine(40, 64);
    assert_eq!(big.embed(vec![1; 512]).unwrap().len(), 512);
    assert!(matches!(
        big.embed(vec![1; 513]),
        Err(EngineError::PromptTooLong { len: 513, .. })
    ));
    drop(big);
    // 8 pages of 16 tokens hold 128: 200 tokens never fit.
    assert!(matches!(
        e.embed(vec![1; 200]),
        Err(EngineError::TooLargeForPool { .. })
    ));
    assert!(matches!(
        e.embed(vec![1, vocab]),
        Err(EngineError::Tokenizer(_))
    ));
    // cls pooling only where the tokenizer puts a BOS/CLS token first, and the input
    // starts with it.
    let toks = tokens(&e, "hello");
    match e.cls_token() {
        Some(cls) => {
            assert_eq!(toks[0], cls);
            assert!(e.embed_pooled(toks, Pooling::Cls, true).is_ok());
            assert!(matches!(
                e.embed_pooled(vec![cls + 1, cls], Pooling::Cls, true),
                Err(EngineError::Param {
                    name: "pooling",
                    ..
                })
            ));
        }
        None => assert!(matches!(
            e.embed_pooled(toks, Pooling::Cls, true),
            Err(EngineError::Param {
                name: "pooling",
                ..
            })
        )),
    }
    // A cancelled embedding gives its pages back.
    let h = e.submit_embedding(vec![1; 100]).unwrap();
    drop(h);
    e.check_invariants().unwrap();
    let (free, cached) = e.idle_pages().unwrap();
    assert_eq!(free + cached, 8);
    // And the engine still embeds.
    assert_eq!(e.embed(vec![1, 2, 3]).unwrap().len(), 3);
}
