//! Sliding-window page freeing on the tiny Mistral-style model (every layer slides,
//! window 8): a sequence that gives up the pages its window has left computes the same
//! logits, bit for bit, as one that keeps them all, while holding a bounded number of
//! pages; in the engine the same requests give identical tokens and log-probabilities
//! with freeing on and off. Models with a global layer never free a page.

use crate::common;
use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::kv::{holders, KvDtype, KvError, Logits, PageTable, PagedKv, SnapshotError};
use folio::model::sampler::argmax;
use folio::model::{Model, SamplingParams};
use folio::{forward_one, Completion};
use std::path::PathBuf;

const PAGE: usize = 4;

fn load(name: &str) -> Model {
    let fx = common::fixtures("arch/arch.json");
    let file = fx["models"][name]["file"].as_str().unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/arch")
        .join(file);
    Model::load(&path, 2).unwrap_or_else(|e| panic!("load {file}: {e}"))
}

fn prompt(m: &Model, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1 + (i * 7) % (m.config.vocab as u32 - 1))
        .collect()
}

fn held(t: &PageTable) -> usize {
    (0..t.num_pages()).filter(|&i| t.holds(i)).count()
}

#[test]
fn window_start_is_where_the_attention_mask_starts() {
    let m = load("llama_swa");
    assert_eq!(m.config.sliding_window(), Some(8));
    // A query at position 20 sees keys 13..=20.
    assert_eq!(m.config.kv_needed_from(20), Some(13));
    assert_eq!(m.config.kv_needed_from(3), Some(0));
    for global in ["gemma2", "gemma3", "qwen3"] {
        assert_eq!(load(global).config.kv_needed_from(500), None, "{global}");
    }
}

/// Prefill in chunks of 5, then greedy decoding to 90 tokens, in two pools: one
/// forgets after every step, the other keeps every page.
#[test]
fn forgetting_pages_out_of_the_window_gives_identical_logits_and_bounded_pages() {
    let m = load("llama_swa");
    let total = 90;
    assert!(total <= m.config.context_length);
    let window = m.config.sliding_window().unwrap();
    let n_pages = 2 * total.div_ceil(PAGE);
    let pool = || PagedKv::with_shape(m.pool_shape(n_pages, PAGE, KvDtype::F16), total, b"swa");
    let (mut kv_free, mut kv_keep) = (pool(), pool());
    let (mut t_free, mut t_keep) = (kv_free.new_table(None), kv_keep.new_table(None));
    let mut input: Vec<Vec<u32>> = prompt(&m, 23).chunks(5).map(|c| c.to_vec()).collect();
    let mut released = 0;
    let mut most_held = 0;
    while t_free.len() < total {
        let step = input.remove(0);
        let a = forward_one(&m, &mut kv_free.seq(&mut t_free), &step, Logits::Last).unwrap();
        let b = forward_one(&m, &mut kv_keep.seq(&mut t_keep), &step, Logits::Last).unwrap();
        let (ab, bb): (Vec<u32>, Vec<u32>) = (
            a.iter().map(|x| x.to_bits()).collect(),
            b.iter().map(|x| x.to_bits()).collect(),
        );
        assert!(ab == bb, "logits differ at length {}", t_free.len());
        let pos = m.config.kv_needed_from(t_free.len()).unwrap();
        released += kv_free.forget(&mut t_free, pos).unwrap();
        most_held = most_held.max(held(&t_free));
        assert!(
            held(&t_free) <= window / PAGE + 2,
            "{} pages held at length {}",
            held(&t_free),
            t_free.len()
        );
        kv_free.check(&holders([&t_free], n_pages)).unwrap();
        if input.is_empty() {
            input.push(vec![argmax(&a) as u32]);
        }
    }
    // Without freeing the sequence holds every page; with it, the window's and the
    // rest went back to the cache.
    assert_eq!(held(&t_keep), total.div_ceil(PAGE));
    // After a step of length L the keys L-7..L-1 stay: 7 positions touch at most 3
    // pages of 4 (and the bound is reached).
    assert_eq!(most_held, (window - 1 - 1) / PAGE + 2);
    assert_eq!(released, total.div_ceil(PAGE) - held(&t_free));
    kv_keep.check(&holders([&t_keep], n_pages)).unwrap();
    // What needs the forgotten pages is a typed error.
    assert!(matches!(
        kv_free.read_tokens(&t_free),
        Err(KvError::Forgotten { .. })
    ));
    assert!(matches!(
        kv_free.save("swa", &mut t_free),
        Err(SnapshotError::Kv(KvError::Forgotten { .. }))
    ));
    assert!(matches!(
        kv_free.truncate(&mut t_free, total - 4),
        Err(KvError::Forgotten { .. })
    ));
    kv_free.check(&holders([&t_free], n_pages)).unwrap();
    // Dropping tokens of the held pages works as before.
    kv_free.truncate(&mut t_free, 2).unwrap();
    assert_eq!(t_free.len(), total - 2);
    kv_free.check(&holders([&t_free], n_pages)).unwrap();
    // Keeping a prefix that reaches into them empties the table instead.
    assert_eq!(kv_free.truncate_to(&mut t_free, 4), 0);
    assert_eq!(
        (t_free.len(), t_free.held_from(), t_free.num_pages()),
        (0, 0, 0)
    );
    kv_free.check(&holders([&t_free], n_pages)).unwrap();
    kv_free.release(t_free).unwrap();
    kv_keep.release(t_keep).unwrap();
    kv_free.check(&vec![0; n_pages]).unwrap();
    kv_keep.check(&vec![0; n_pages]).unwrap();
}

/// The completions, and (pages released by windows, forks made).
fn run(free_window_pages: bool, reqs: &[Request]) -> (Vec<Vec<Completion>>, (u64, u64)) {
    let e = engine(64, free_window_pages);
    let out = reqs
        .iter()
        .map(|r| e.submit(r.clone()).unwrap().collect_all().unwrap())
        .collect();
    e.check_invariants().unwrap();
    let stats = e.stats().unwrap();
    assert_eq!(stats.pages_free + stats.pages_cached, stats.pages_total);
    (out, (stats.window_pages_released, stats.forks))
}

fn engine(kv_pages: usize, free_window_pages: bool) -> Engine {
    Engine::new(
        load("llama_swa"),
        EngineConfig {
            kv_pages,
            page_size: PAGE,
            // Prompts are prefilled in chunks: pages are forgotten between chunks,
            // before `n > 1` forks the prompt.
            max_batch_tokens: 8,
            free_window_pages,
            ..Default::default()
        },
    )
    .unwrap()
}

fn bits(cs: &[Completion]) -> Vec<(Vec<u32>, Vec<u32>)> {
    cs.iter()
        .map(|c| {
            let lp = c
                .logprobs
                .iter()
                .flat_map(|l| {
                    std::iter::once(l.logprob.to_bits())
                        .chain(l.top.iter().flat_map(|&(t, p)| [t, p.to_bits()]))
                })
                .collect();
            (c.ids.clone(), lp)
        })
        .collect()
}

fn greedy(prompt_len: usize, max_tokens: usize) -> Request {
    let m = load("llama_swa");
    let mut r = Request::new(Prompt::Tokens(prompt(&m, prompt_len)));
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.logprobs = Some(3);
    r.sampling = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    r
}

#[test]
fn engine_gives_identical_tokens_with_page_freeing_on_and_off() {
    let greedy = greedy(30, 50);
    let mut two = greedy.clone();
    two.n = 2;
    two.sampling = SamplingParams {
        temperature: 1.0,
        seed: 3,
        ..Default::default()
    };
    let reqs = [greedy, two];
    let (on, (released_on, forks_on)) = run(true, &reqs);
    let (off, (released_off, forks_off)) = run(false, &reqs);
    for (a, b) in on.iter().zip(&off) {
        assert_eq!(a.len(), b.len());
        assert!(a.iter().all(|c| c.ids.len() == 50));
        assert!(bits(a) == bits(b), "completions differ");
    }
    // The `n = 2` sample forked the prompt's table (after it forgot pages) both times.
    assert_eq!((released_off, forks_off), (0, 1));
    assert!(released_on > 0);
    assert_eq!(forks_on, 1);
}

/// 90 tokens need 23 pages of 4; the pool has 16. Freeing, a sequence holds at most
/// (8 - 1 + 8) / 4 + 1 = 5 at once (window 8, steps of 8 tokens), so it is admitted
/// and runs to the end, with the same tokens as in a pool that holds it all.
#[test]
fn a_pool_too_small_for_the_whole_sequence_runs_it_when_pages_are_freed() {
    let r = greedy(30, 60);
    let small = engine(16, true);
    let out = small.submit(r.clone()).unwrap().collect_all().unwrap();
    small.check_invariants().unwrap();
    let (big, _) = run(false, std::slice::from_ref(&r));
    assert_eq!(out[0].ids.len(), 60);
    assert!(bits(&out) == bits(&big[0]), "completions differ");
    let refused = engine(16, false).submit(r).unwrap().collect_all();
    assert!(
        matches!(
            refused,
            Err(folio::EngineError::TooLargeForPool {
                needed: 23,
                pages: 16
            })
        ),
        "{refused:?}"
    );
}
