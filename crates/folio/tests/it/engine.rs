//! The engine on the default model: concurrent requests return what each returns
//! alone, a pool far too small still completes everything (by preemption), cancelled
//! requests give their pages back, seeds reproduce under batching, `n > 1` forks the
//! prompt's pages, and bad requests get errors.

use crate::common;

use crate::common::{generate, GenerateParams, ModelExt};
use folio::engine::{Engine, EngineConfig, Event, Prompt, Request};
use folio::model::{Model, SamplingParams};
use folio::FinishReason;
use std::time::{Duration, Instant};

fn model() -> Model {
    Model::load(&common::model_path(), 2).unwrap()
}

/// One test at a time: each engine uses both cores with spinning workers, and two
/// of them at once on a 2-core machine mostly wait for each other.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn engine(pages: usize, max_batch_tokens: usize) -> Engine {
    let cfg = EngineConfig {
        kv_pages: pages,
        page_size: 16,
        max_batch_tokens,
        snapshot_dir: None,
        ..Default::default()
    };
    Engine::new(model(), cfg).unwrap()
}

/// 16 distinct prompts of different lengths.
fn prompts() -> Vec<String> {
    (0..16)
        .map(|i| {
            let topic = [
                "rivers", "bread", "stars", "chess", "glass", "bees", "salt", "wind",
            ][i % 8];
            format!(
                "Write {} short facts about {topic}.{}",
                1 + i % 3,
                " Be precise and clear.".repeat(1 + i % 4)
            )
        })
        .collect()
}

fn greedy(prompt: &str, max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Text(prompt.to_string()));
    r.max_tokens = max_tokens;
    r.sampling = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    r
}

/// What the single-sequence path (contiguous cache, no engine) generates.
fn alone(m: &Model, prompt: &str, max_tokens: usize, sampling: SamplingParams) -> Vec<u32> {
    let ids = m.tokenizer.encode(prompt, true);
    let mut cache = m.new_cache(2048);
    let params = GenerateParams {
        max_tokens,
        sampling,
        ..Default::default()
    };
    generate(m, &mut cache, &ids, &params, &mut |_| {})
        .unwrap()
        .ids
}

fn wait_idle(e: &Engine) {
    let t = Instant::now();
    while e.stats().unwrap().running + e.stats().unwrap().waiting > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "engine never went idle"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn concurrent_greedy_requests_equal_each_alone_even_in_a_tiny_pool() {
    let _serial = serial();
    let m = model();
    let want: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| alone(&m, p, 24, Default::default()))
        .collect();
    // A roomy pool, then one far too small for 16 sequences (each needs 3-5 pages).
    for (pages, batch) in [(1024, 512), (12, 64)] {
        let e = engine(pages, batch);
        let streams: Vec<_> = prompts()
            .iter()
            .map(|p| e.submit(greedy(p, 24)).unwrap())
            .collect();
        let handles: Vec<_> = streams
            .into_iter()
            .map(|s| std::thread::spawn(move || s.collect_all().unwrap()))
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let got = h.join().unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].ids, want[i], "request {i}, pool of {pages} pages");
            assert!(got[0].finish.is_some());
        }
        wait_idle(&e);
        let st = e.stats().unwrap();
        if pages == 12 {
            assert!(st.preemptions > 0, "a 12-page pool must preempt: {st:?}");
        }
        println!(
            "pool {pages}: {} preemptions, {} steps",
            st.preemptions, st.steps
        );
        // Every page is back: free or cached, none held.
        let (free, cached) = e.idle_pages().unwrap();
        assert_eq!(free + cached, pages, "{st:?}");
    }
}

#[test]
fn a_dropped_stream_cancels_and_frees_its_pages() {
    let _serial = serial();
    let e = engine(256, 512);
    let mut r = greedy("Tell me a very long story about a lighthouse keeper.", 400);
    r.ignore_eos = true;
    let mut s = e.submit(r).unwrap();
    // Two tokens arrive, then the client goes away.
    let mut n = 0;
    for ev in s.by_ref() {
        if matches!(ev, Event::Token { .. }) {
            n += 1;
            if n == 2 {
                break;
            }
        }
    }
    drop(s);
    wait_idle(&e);
    let (free, cached) = e.idle_pages().unwrap();
    assert_eq!(free + cached, 256);
    assert!(e.stats().unwrap().generated_tokens < 400);
}

#[test]
fn the_same_seed_gives_the_same_text_alone_and_in_a_batch() {
    let _serial = serial();
    let m = model();
    let sampling = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.0,
        seed: 1234,
        ..Default::default()
    };
    let prompt = "Once upon a time";
    let want = alone(&m, prompt, 20, sampling.clone());
    let e = engine(512, 512);
    let mut r = greedy(prompt, 20);
    r.sampling = sampling;
    let solo = e.submit(r.clone()).unwrap().collect_all().unwrap();
    assert_eq!(solo[0].ids, want);
    // Now in a batch with other work.
    let others: Vec<_> = prompts()
        .iter()
        .take(6)
        .map(|p| e.submit(greedy(p, 20)).unwrap())
        .collect();
    let batched = e.submit(r).unwrap().collect_all().unwrap();
    assert_eq!(batched[0].ids, want);
    drop(others);
}

#[test]
fn n_samples_fork_the_prompt_instead_of_prefilling_it_n_times() {
    let _serial = serial();
    let e = engine(512, 512);
    let prompt = "List three colours of the rainbow.".repeat(4);
    let mut r = greedy(&prompt, 12);
    r.n = 4;
    r.sampling = SamplingParams {
        temperature: 1.0,
        seed: 7,
        ..Default::default()
    };
    let before = e.stats().unwrap();
    let out = e.submit(r).unwrap().collect_all().unwrap();
    let after = e.stats().unwrap();
    let plen = e.model().tokenizer.encode(&prompt, true).len();
    assert_eq!(out.len(), 4);
    for c in &out {
        assert!(!c.ids.is_empty() && c.finish.is_some());
        assert_eq!(c.usage.prompt_tokens, plen);
    }
    // The prompt was computed once.
    assert_eq!(
        after.prefilled_tokens - before.prefilled_tokens,
        plen as u64
    );
    assert!(out.iter().skip(1).all(|c| c.usage.cached_tokens == plen));
}

#[test]
fn logprobs_and_stop_strings_and_usage() {
    let _serial = serial();
    let e = engine(256, 512);
    let mut r = greedy("Count: one, two, three, four,", 30);
    r.logprobs = Some(3);
    let out = e.submit(r.clone()).unwrap().collect_all().unwrap();
    let c = &out[0];
    assert_eq!(c.logprobs.len(), c.ids.len());
    for (lp, &id) in c.logprobs.iter().zip(&c.ids) {
        assert_eq!(lp.top.len(), 3);
        assert!(lp.logprob <= 0.0);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp.top[0].0, id);
    }
    // A stop string cuts the text before it and is never emitted.
    let stop = c.text.chars().skip(4).take(3).collect::<String>();
    r.stop = vec![stop.clone()];
    let cut = e.submit(r).unwrap().collect_all().unwrap();
    assert_eq!(cut[0].finish, Some(FinishReason::Stop));
    assert!(
        !cut[0].text.contains(&stop),
        "{:?} in {:?}",
        stop,
        cut[0].text
    );
    assert!(c.text.starts_with(&cut[0].text));
}

#[test]
fn bad_requests_get_errors_and_the_engine_goes_on() {
    let _serial = serial();
    let e = engine(64, 512);
    let window = e.model().config.context_length;
    let too_long = Request::new(Prompt::Tokens(vec![1; window + 5]));
    let bad_token = Request::new(Prompt::Tokens(vec![u32::MAX]));
    let empty = Request::new(Prompt::Tokens(vec![]));
    let mut zero = greedy("hi", 1);
    zero.max_tokens = 0;
    for r in [too_long, bad_token, empty, zero] {
        let mut s = e.submit(r).unwrap();
        assert!(matches!(s.next(), Some(Event::Error(_))));
    }
    // A request needing more pages than the pool has fails alone.
    let huge = Request::new(Prompt::Tokens(vec![5; 64 * 16 + 10]));
    let err = e.submit(huge).unwrap().collect_all();
    assert!(err.is_err(), "{err:?}");
    let ok = e.submit(greedy("Hello", 4)).unwrap().collect_all().unwrap();
    assert_eq!(ok[0].ids.len(), 4);
}

#[test]
fn non_finite_logits_fail_the_request_instead_of_sampling_a_token() {
    // A tiny model whose final norm is NaN: every logit is NaN.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nan.gguf");
    folio::tiny::write_model(&path, 3, folio::gguf::GgmlType::Q4_1).unwrap();
    let at = {
        let g = folio::gguf::Gguf::open(&path).unwrap();
        g.tensor("output_norm.weight").unwrap().offset as usize
    };
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let m = Model::load(&path, 1).unwrap();
    let e = Engine::new(m, EngineConfig::default()).unwrap();
    let events: Vec<Event> = e
        .submit(Request {
            max_tokens: 4,
            ..Request::new(Prompt::Tokens(vec![1, 2, 3]))
        })
        .unwrap()
        .collect();
    match &events[..] {
        [Event::Error(err)] => {
            assert!(
                matches!(err, folio::EngineError::Step(folio::StepError::NonFinite)),
                "{err}"
            );
            assert_eq!(err.kind(), folio::ErrorKind::Internal);
        }
        other => panic!("expected one error event, got {other:?}"),
    }
    wait_idle(&e);
    let (free, cached) = e.idle_pages().unwrap();
    assert_eq!(
        free + cached,
        EngineConfig::default().kv_pages,
        "pages leaked"
    );
}

/// Scoring: a request's prompt log-probabilities are the teacher-forced figures of
/// the same tokens on the contiguous oracle, bit for bit, whether the prompt was in
/// the prefix cache or not, chunked or whole, with `max_tokens` 0 (nothing sampled).
#[test]
fn prompt_logprobs_are_the_teacher_forced_figures_bit_for_bit() {
    let _g = serial();
    let m = model();
    let ids = m.tokenizer.encode("The quick brown fox jumps over the lazy dog. It was a sunny day in the park, and everyone was happy to be outside.", true);
    let mut cache = m.new_cache(256);
    let logits = folio::forward_one(&m, &mut cache, &ids, folio::Logits::All).unwrap();
    let vocab = m.config.vocab;
    let expect: Vec<f32> = (1..ids.len())
        .map(|t| {
            let lp = folio::model::sampler::log_softmax(&logits[(t - 1) * vocab..t * vocab]);
            lp[ids[t] as usize] as f32
        })
        .collect();
    // A small step budget chunks the prompt; the second run finds it cached.
    let e = engine(64, 8);
    for round in 0..2 {
        let mut req = Request::new(Prompt::Tokens(ids.clone()));
        req.prompt_logprobs = Some(2);
        req.max_tokens = 0;
        let out = e.submit(req).unwrap().collect_all().unwrap();
        let got: Vec<f32> = out[0].prompt_logprobs.iter().map(|l| l.logprob).collect();
        assert_eq!(got, expect, "round {round}");
        assert!(out[0].prompt_logprobs.iter().all(|l| l.top.len() == 2));
        assert!(out[0].ids.is_empty());
        assert_eq!(out[0].finish, Some(FinishReason::Length));
        assert_eq!(out[0].usage.cached_tokens, 0, "scored prompts are computed");
    }
    // With generation too: the samples are those of a plain request.
    let mut plain = Request::new(Prompt::Tokens(ids.clone()));
    plain.max_tokens = 6;
    let mut scored = plain.clone();
    scored.prompt_logprobs = Some(0);
    let a = e.submit(plain).unwrap().collect_all().unwrap();
    let b = e.submit(scored).unwrap().collect_all().unwrap();
    assert_eq!(a[0].ids, b[0].ids);
    assert_eq!(b[0].prompt_logprobs.len(), ids.len() - 1);
}

/// A long prompt does not hold a short one behind it until it is computed: each
/// step, one prompt's chunk takes at most half the budget while others wait, so the
/// short request (arriving second) finishes first. Counted in steps, not seconds.
#[test]
fn a_long_prompt_does_not_hold_a_short_one_back() {
    let _g = serial();
    let e = engine(512, 256);
    let m = e.model();
    let long: Vec<u32> = m
        .tokenizer
        .encode(
            &"The lighthouse keeper wrote in his log every night. ".repeat(120),
            true,
        )
        .into_iter()
        .take(1500)
        .collect();
    let mut big = Request::new(Prompt::Tokens(long));
    big.max_tokens = 1;
    let mut small = Request::new(Prompt::Text("Hello".into()));
    small.max_tokens = 2;
    let big = e.submit(big).unwrap();
    let small = e.submit(small).unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hs: Vec<_> = [("big", big), ("small", small)]
        .into_iter()
        .map(|(name, s)| {
            let order = order.clone();
            std::thread::spawn(move || {
                let out = s.collect_all().unwrap();
                let steps = out[0].usage.completion_tokens;
                order.lock().unwrap().push(name);
                steps
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["small", "big"]);
}
