//! The whole path on a tiny random model (milliseconds): load, tokenize, forward,
//! generate; batch-invariance of the forward pass; cache bounds.

use crate::common::{generate, GenerateParams, ModelExt};
use folio::error::PoolError;
use folio::gguf::GgmlType;
use folio::kv::{KvSeq, Logits};
use folio::model::{Model, SamplingParams};
use folio::ModelError;
use folio::{EngineError, FinishReason, KvError, StepError};

fn tiny(ty: GgmlType) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    folio::tiny::write_model(&path, 1, ty).unwrap();
    let m = Model::load(&path, 2).unwrap();
    (dir, m)
}

#[test]
fn tiny_models_of_every_weight_type_load_and_run() {
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q4_1, GgmlType::Q8_0] {
        let (_d, m) = tiny(ty);
        assert_eq!(m.config.n_layers, 2);
        let ids = m.tokenizer.encode("the cat", true);
        let mut cache = m.new_cache(64);
        let logits = m.run(&mut cache, &ids, Logits::Last).unwrap();
        assert_eq!(logits.len(), m.config.vocab);
        assert!(logits.iter().all(|v| v.is_finite()), "{ty}");
    }
}

#[test]
fn logits_do_not_depend_on_batching() {
    // Prefill in one pass, in chunks, and one token at a time: bit-identical logits.
    let (_d, m) = tiny(GgmlType::Q4_1);
    let ids = m
        .tokenizer
        .encode("in the beginning the tiny model spoke", true);
    let v = m.config.vocab;
    let mut whole = m.new_cache(64);
    let all = m.run(&mut whole, &ids, Logits::All).unwrap();
    let mut one = m.new_cache(64);
    for (i, &t) in ids.iter().enumerate() {
        let l = m.run(&mut one, &[t], Logits::Last).unwrap();
        assert_eq!(l, all[i * v..(i + 1) * v], "token {i}");
    }
    let mut chunked = m.new_cache(64);
    let (a, b) = ids.split_at(5);
    m.run(&mut chunked, a, Logits::Last).unwrap();
    let l = m.run(&mut chunked, b, Logits::All).unwrap();
    assert_eq!(l[..], all[5 * v..]);
}

#[test]
fn a_full_cache_is_an_error_not_an_overwrite() {
    let (_d, m) = tiny(GgmlType::Q4_1);
    let mut cache = m.new_cache(4);
    m.run(&mut cache, &[1, 2, 3], Logits::Last).unwrap();
    let err = m.run(&mut cache, &[4, 5], Logits::Last).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Kv(KvError::SequenceFull { len: 5, max: 4 })
        ),
        "{err}"
    );
    assert_eq!(cache.len(), 3, "a failed step stores nothing");
    assert!(matches!(
        m.run(&mut cache, &[], Logits::Last),
        Err(EngineError::Step(StepError::Empty { seq: 0 }))
    ));
    assert!(matches!(
        m.run(&mut cache, &[99_999], Logits::Last),
        Err(EngineError::Step(StepError::BadToken(99_999)))
    ));
}

#[test]
fn generation_stops_at_max_tokens_and_reuses_the_cached_prefix() {
    let (_d, m) = tiny(GgmlType::Q4_1);
    let params = GenerateParams {
        max_tokens: 7,
        ignore_eos: true,
        ..Default::default()
    };
    let prompt = m.tokenizer.encode("the theme", true);
    let mut cache = m.new_cache(64);
    let mut streamed = String::new();
    let out = generate(&m, &mut cache, &prompt, &params, &mut |t| {
        streamed.push_str(t)
    })
    .unwrap();
    assert_eq!(out.ids.len(), 7);
    assert_eq!(out.finish, FinishReason::Length);
    assert_eq!(streamed, out.text);
    // Same prompt again: all but the last prompt token come from the cache, and greedy
    // output is the same.
    let again = generate(&m, &mut cache, &prompt, &params, &mut |_| {}).unwrap();
    assert_eq!(again.prefix_hit_tokens, prompt.len() - 1);
    assert_eq!(again.ids, out.ids);
}

#[test]
fn a_prompt_longer_than_the_context_is_refused() {
    let (_d, m) = tiny(GgmlType::Q4_1);
    let mut cache = m.new_cache(8);
    let prompt = vec![5u32; 20];
    let err = generate(
        &m,
        &mut cache,
        &prompt,
        &GenerateParams::default(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(err, EngineError::PromptTooLong { len: 20, window: 8 }),
        "{err}"
    );
}

#[test]
fn an_absurd_thread_count_is_a_typed_error_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    folio::tiny::write_model(&path, 1, GgmlType::Q4_1).unwrap();
    let limit = folio::model::MAX_THREADS;
    match Model::load(&path, 100_000_000) {
        Err(ModelError::Pool(PoolError::TooManyThreads {
            requested: 100_000_000,
            limit: l,
        })) => assert_eq!(l, limit),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("100000000 threads were accepted"),
    }
    assert_eq!(Model::load(&path, limit).unwrap().threads(), limit);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (_d, m) = tiny(GgmlType::Q4_1);
    let params = |seed| GenerateParams {
        max_tokens: 12,
        ignore_eos: true,
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..Default::default()
        },
    };
    let prompt = m.tokenizer.encode("a", true);
    let run = |seed| {
        let mut cache = m.new_cache(64);
        generate(&m, &mut cache, &prompt, &params(seed), &mut |_| {})
            .unwrap()
            .ids
    };
    assert_eq!(run(9), run(9));
    assert_ne!(run(9), run(10));
}

#[test]
fn the_tiny_tokenizer_round_trips_and_parses_specials() {
    let (_d, m) = tiny(GgmlType::Q4_1);
    let t = &m.tokenizer;
    for text in ["the theme", "  in a\n\tb ", "naïve 日本 🎉", ""] {
        assert_eq!(t.decode(&t.encode(text, true)), text);
    }
    let ids = t.encode("<|im_start|>the<|im_end|>", true);
    assert_eq!(ids.first(), t.bos.as_ref());
    assert_eq!(ids.last(), t.eos.as_ref());
    assert_eq!(t.encode(" the", false), vec![t.token_id("Ġthe").unwrap()]);
}
