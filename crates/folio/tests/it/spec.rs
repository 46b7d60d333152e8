//! Speculative decoding (issue 40) on the default model: with drafts the engine gives
//! the very tokens it gives without (greedy and sampled, with stop strings, grammars,
//! `n > 1`, log-probabilities, and preemption in a tiny pool), and on text that repeats
//! its input most drafted tokens are accepted, so steps yield several tokens.

use crate::common;
use folio::engine::{Completion, Engine, EngineConfig, Prompt, Request};
use folio::grammar::{GrammarSpec, Grammars};
use folio::model::{Model, SamplingParams};
use folio::SpecMode;

fn model() -> Model {
    Model::load(&common::model_path(), 2).unwrap()
}

fn engine(mode: SpecMode, pages: usize) -> Engine {
    let cfg = EngineConfig {
        kv_pages: pages,
        page_size: 16,
        max_batch_tokens: 256,
        speculative: mode,
        ..Default::default()
    };
    Engine::new(model(), cfg).unwrap()
}

/// Prompts whose continuations repeat their input (code, a list, a quote), and free
/// text that does not.
fn prompts() -> Vec<String> {
    vec![
        "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n\
         # The same two functions, with w renamed to width:\ndef area(width, h):\n"
            .into(),
        "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday, \
         Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,"
            .into(),
        "<|im_start|>user\nCopy this sentence exactly: The quick brown fox jumps over the \
         lazy dog near the old river bank.<|im_end|>\n<|im_start|>assistant\n"
            .into(),
        "Write a short story about a lighthouse keeper.".into(),
        "{\"name\": \"Ada\", \"age\": 36, \"city\": \"London\"}\nThe same object with \
         the keys sorted:\n{\"age\": 36,"
            .into(),
    ]
}

fn request(prompt: &str, sampling: &SamplingParams, max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Text(prompt.to_string()));
    r.max_tokens = max_tokens;
    r.sampling = sampling.clone();
    r
}

/// Every request at once; each one's samples.
fn run(e: &Engine, reqs: Vec<Request>) -> Vec<Vec<Completion>> {
    let streams: Vec<_> = reqs.into_iter().map(|r| e.submit(r).unwrap()).collect();
    let handles: Vec<_> = streams
        .into_iter()
        .map(|s| std::thread::spawn(move || s.collect_all().unwrap()))
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// What must be the same with and without drafts: everything but the draft counts.
fn same(a: &[Vec<Completion>], b: &[Vec<Completion>], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what}: request {i}: samples");
        for (s, (c, d)) in x.iter().zip(y).enumerate() {
            assert_eq!(c.ids, d.ids, "{what}: request {i} sample {s}: tokens");
            assert_eq!(c.text, d.text, "{what}: request {i} sample {s}: text");
            assert_eq!(c.finish, d.finish, "{what}: request {i} sample {s}");
            assert_eq!(c.logprobs, d.logprobs, "{what}: request {i} sample {s}");
            assert_eq!(c.usage.completion_tokens, d.usage.completion_tokens);
        }
    }
}

fn drafted(r: &[Vec<Completion>]) -> (usize, usize) {
    r.iter().flatten().fold((0, 0), |(d, a), c| {
        (d + c.usage.drafted_tokens, a + c.usage.accepted_tokens)
    })
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

#[test]
fn greedy_and_sampled_tokens_are_identical_with_and_without_drafts() {
    let _serial = crate::engine::serial();
    let (on, off) = (engine(SpecMode::Auto, 512), engine(SpecMode::Off, 512));
    let sampled = SamplingParams {
        temperature: 0.8,
        seed: 7,
        ..Default::default()
    };
    for (name, sampling) in [("greedy", greedy()), ("sampled", sampled)] {
        // One at a time (each request its own step: drafts of up to 8 rows), then
        // all at once (drafts share the step's rows with the other decoders).
        let alone = |e: &Engine| -> Vec<Vec<Completion>> {
            prompts()
                .iter()
                .map(|p| run(e, vec![request(p, &sampling, 64)]).remove(0))
                .collect()
        };
        let (a, b) = (alone(&on), alone(&off));
        same(&a, &b, &format!("{name}, one at a time"));
        let (d, acc) = drafted(&a);
        assert_eq!(drafted(&b), (0, 0), "speculation off drafts nothing");
        println!("{name}: {d} tokens drafted, {acc} accepted");
        assert!(acc > 0 && d > 0, "{name}: no draft was accepted");
        if name == "greedy" {
            // The repeating prompts (the first three) accept most of what they draft.
            let (d3, a3) = drafted(&a[..3]);
            assert!(
                a3 * 2 > d3,
                "repeating text: {a3} of {d3} drafted tokens accepted"
            );
        }
        let all = |e: &Engine| {
            let reqs = prompts()
                .iter()
                .map(|p| request(p, &sampling, 64))
                .collect();
            run(e, reqs)
        };
        same(&all(&on), &all(&off), &format!("{name}, all at once"));
    }
    let st = on.stats().unwrap();
    assert!(st.spec_drafts > 0 && st.spec_accepted_tokens > 0, "{st:?}");
    assert!(st.spec_accepted_tokens <= st.spec_drafted_tokens);
    assert_eq!(off.stats().unwrap().spec_drafted_tokens, 0);
}

#[test]
fn stops_grammars_forks_logprobs_and_preemption_give_the_same_tokens() {
    let _serial = crate::engine::serial();
    let m = model();
    let gs = Grammars::new(&m.tokenizer, m.config.vocab).unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"]});
    let grammar = gs.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mix = || -> Vec<Request> {
        let ps = prompts();
        let mut reqs = Vec::new();
        // Stop strings that the repeated text reaches.
        let mut r = request(&ps[1], &greedy(), 60);
        r.stop = vec!["Friday".into()];
        reqs.push(r);
        let mut r = request(&ps[0], &greedy(), 60);
        r.stop = vec!["return 2".into()];
        reqs.push(r);
        // A grammar over text that repeats its input.
        let mut r = request(&ps[4], &greedy(), 60);
        r.grammar = Some(grammar.clone());
        reqs.push(r);
        // n > 1, sampled, with log-probabilities.
        let mut r = request(
            &ps[2],
            &SamplingParams {
                temperature: 0.7,
                seed: 3,
                ..Default::default()
            },
            40,
        );
        r.n = 3;
        r.logprobs = Some(3);
        reqs.push(r);
        for p in &ps {
            let mut r = request(p, &greedy(), 48);
            r.logprobs = Some(2);
            reqs.push(r);
        }
        reqs
    };
    // A roomy pool, then one so small that samples are preempted and recompute.
    for pages in [512, 14] {
        let (on, off) = (engine(SpecMode::Auto, pages), engine(SpecMode::Off, pages));
        let (a, b) = (run(&on, mix()), run(&off, mix()));
        same(&a, &b, &format!("pool of {pages} pages"));
        let st = on.stats().unwrap();
        let per: Vec<Vec<usize>> = a
            .iter()
            .map(|r| r.iter().map(|c| c.usage.drafted_tokens).collect())
            .collect();
        println!(
            "pool {pages}: {} drafted, {} accepted, {} preemptions; drafted per request {per:?}",
            st.spec_drafted_tokens, st.spec_accepted_tokens, st.preemptions
        );
        assert!(st.spec_accepted_tokens > 0, "{st:?}");
        if pages == 512 {
            // The stop-string requests, the grammar and every one of the n = 3 forks
            // verified drafts (the mix is only a test of them if they did).
            for (i, what) in [(0, "stop"), (1, "stop"), (2, "grammar"), (3, "n = 3")] {
                assert!(
                    per[i].iter().all(|&d| d > 0),
                    "{what} (request {i}) drafted nothing: {per:?}"
                );
            }
        }
        if pages == 14 {
            assert!(st.preemptions > 0, "a 14-page pool must preempt: {st:?}");
        }
    }
}

#[test]
fn a_request_may_turn_drafts_off() {
    let _serial = crate::engine::serial();
    let on = engine(SpecMode::Auto, 256);
    let p = &prompts()[1];
    let mut r = request(p, &greedy(), 48);
    r.speculative = false;
    let plain = run(&on, vec![r]);
    assert_eq!(drafted(&plain), (0, 0));
    let spec = run(&on, vec![request(p, &greedy(), 48)]);
    same(&plain, &spec, "per-request switch");
    assert!(drafted(&spec).1 > 0, "{:?}", drafted(&spec));
}

/// Drafts near every limit: `max_tokens` of 1 to 3, a window that ends mid-draft, a
/// context's generation; the same tokens as without drafts, and the pool's invariants
/// hold after each (no slot of a rejected row is left behind).
#[test]
fn drafts_at_the_limits_keep_tokens_and_pages_right() {
    let _serial = crate::engine::serial();
    let p = &prompts()[1];
    let n = model().tokenizer.encode(p, true).len();
    for window in [n + 3, n + 9, n + 40] {
        let mk = |mode| {
            let cfg = EngineConfig {
                kv_pages: 64,
                page_size: 16,
                max_seq_tokens: Some(window),
                speculative: mode,
                ..Default::default()
            };
            Engine::new(model(), cfg).unwrap()
        };
        let (on, off) = (mk(SpecMode::Auto), mk(SpecMode::Off));
        for max_tokens in [1, 2, 3, 64] {
            let r = || request(p, &greedy(), max_tokens);
            let (a, b) = (run(&on, vec![r()]), run(&off, vec![r()]));
            same(&a, &b, &format!("window {window}, max_tokens {max_tokens}"));
            on.check_invariants().unwrap();
            if max_tokens == 64 && window > n + 3 {
                // The window ends the sample while drafts are being verified.
                assert!(drafted(&a).0 > 0, "window {window}: nothing drafted");
                assert_eq!(a[0][0].finish, Some(folio::FinishReason::Length));
            }
        }
        // A context's generation, twice: the second continues from the first's pages.
        let ctx = on.context(None).unwrap();
        let ctx_off = off.context(None).unwrap();
        for c in [&ctx, &ctx_off] {
            c.append_text(p).unwrap();
        }
        for _ in 0..2 {
            let mut r = request("", &greedy(), 8);
            r.prompt = Prompt::Tokens(Vec::new());
            let a = ctx.generate(r.clone()).and_then(|s| s.collect_all());
            let b = ctx_off.generate(r).and_then(|s| s.collect_all());
            match (a, b) {
                (Ok(a), Ok(b)) => same(&[a], &[b], &format!("context, window {window}")),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                (a, b) => panic!("window {window}: {a:?} against {b:?}"),
            }
            on.check_invariants().unwrap();
        }
    }
}
