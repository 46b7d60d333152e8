//! Constrained decoding on the default model: the output always matches the grammar
//! (a JSON schema, any JSON object, a regex, a choice), under sampling, with n > 1
//! forks, and batched beside unconstrained requests; a bad source is an error first.
//! Asking the grammar about single tokens gives the tokens masking first gives, and
//! agrees with the mask token by token. Choosing a step's samples on several threads
//! gives the tokens of choosing them one after another.

use crate::common;
use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::grammar::{GrammarError, GrammarSpec, Grammars};
use folio::model::Model;
use serde_json::json;

fn setup() -> (Engine, Grammars) {
    let model = Model::load(&common::model_path(), 2).unwrap();
    let t = std::time::Instant::now();
    let g = Grammars::new(&model.tokenizer, model.config.vocab).unwrap();
    eprintln!("token table for grammars: {:?}", t.elapsed());
    let cfg = EngineConfig {
        kv_pages: 256,
        ..Default::default()
    };
    (Engine::new(model, cfg).unwrap(), g)
}

fn run(e: &Engine, prompt: &str, g: folio::grammar::Grammar, n: usize, temp: f32) -> Vec<String> {
    let mut r = Request::new(Prompt::Text(prompt.into()));
    r.max_tokens = 120;
    r.n = n;
    r.sampling.temperature = temp;
    r.sampling.seed = 7;
    r.grammar = Some(g);
    e.submit(r)
        .unwrap()
        .collect_all()
        .unwrap()
        .into_iter()
        .map(|c| c.text)
        .collect()
}

#[test]
fn the_engines_grammar_table_is_built_on_first_use_once_for_every_clone() {
    let model = Model::load(&common::model_path(), 2).unwrap();
    let cfg = EngineConfig {
        kv_pages: 64,
        ..Default::default()
    };
    let e = Engine::new(model, cfg).unwrap();
    let other = e.clone();
    // Plain generation never builds it (it is large; see `grammar::lazy`).
    let mut r = Request::new(Prompt::Text("Hello".into()));
    r.max_tokens = 4;
    e.submit(r).unwrap().collect_all().unwrap();
    assert!(!e.grammars().is_built() && !other.grammars().is_built());
    let g = other
        .grammars()
        .get()
        .expect("SmolLM2's vocabulary serves grammars");
    assert!(e.grammars().is_built());
    assert!(
        std::ptr::eq(g, e.grammars().get().unwrap()),
        "one table for every clone"
    );
    let spec = GrammarSpec::Regex("(yes|no)".into());
    let out = run(&e, "Answer:", g.compile(&spec).unwrap(), 1, 0.0);
    assert!(out[0] == "yes" || out[0] == "no", "{out:?}");
}

#[test]
fn outputs_match_their_grammar() {
    let (e, gs) = setup();
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                       "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
        "required": ["name", "age", "colours"],
        "additionalProperties": false
    });
    let g = gs.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    // Greedy and sampled, three samples forked from one prompt; a plain request beside.
    let plain = {
        let mut r = Request::new(Prompt::Text("Tell me a story.".into()));
        r.max_tokens = 40;
        e.submit(r).unwrap()
    };
    for (n, temp) in [(1, 0.0), (3, 1.0)] {
        for text in run(&e, "Describe a person as JSON:", g.clone(), n, temp) {
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|err| panic!("{err}: {text:?}"));
            assert!(
                v["name"].is_string() && v["age"].is_i64() && v["colours"].is_array(),
                "{v}"
            );
            assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
        }
    }
    assert!(plain.collect_all().unwrap()[0].finish.is_some());

    let any = gs.compile(&GrammarSpec::JsonObject).unwrap();
    let t = &run(&e, "A JSON object about the sea:", any, 1, 0.7)[0];
    assert!(
        serde_json::from_str::<serde_json::Value>(t)
            .unwrap()
            .is_object(),
        "{t}"
    );

    let rx = gs
        .compile(&GrammarSpec::Regex(r"[0-9]{3}-[0-9]{4}".into()))
        .unwrap();
    let t = &run(&e, "A phone number:", rx, 1, 1.0)[0];
    assert!(
        t.len() == 8
            && t.as_bytes()[3] == b'-'
            && t.chars().filter(char::is_ascii_digit).count() == 7,
        "{t:?}"
    );

    let choice = GrammarSpec::Choice(vec!["yes".into(), "no".into(), "maybe".into()]);
    for t in run(
        &e,
        "Is the sky green?",
        gs.compile(&choice).unwrap(),
        4,
        1.0,
    ) {
        assert!(["yes", "no", "maybe"].contains(&t.as_str()), "{t:?}");
    }
}

#[test]
fn a_source_that_does_not_compile_is_an_error_before_any_work() {
    let model = Model::load(&common::model_path(), 1).unwrap();
    let gs = Grammars::new(&model.tokenizer, model.config.vocab).unwrap();
    for bad in [
        GrammarSpec::JsonSchema(json!({"type": "frobnicate"})),
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::Lark("start: undefined_rule".into()),
        GrammarSpec::Choice(vec![]),
    ] {
        match gs.compile(&bad) {
            Err(GrammarError::Compile(msg)) => assert!(!msg.is_empty()),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

/// A pool so small that the constrained samples preempt each other: each keeps its
/// grammar state (the tokens it sampled stay; only their K/V is recomputed), so
/// every output still matches.
#[test]
fn constrained_samples_survive_preemption_and_run_in_contexts() {
    let model = Model::load(&common::model_path(), 2).unwrap();
    let gs = Grammars::new(&model.tokenizer, model.config.vocab).unwrap();
    let e = Engine::new(
        model,
        EngineConfig {
            kv_pages: 12,
            page_size: 16,
            max_batch_tokens: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let schema = json!({"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 6, "maxItems": 6});
    let g = gs.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let streams: Vec<_> = (0..4)
        .map(|i| {
            let mut r = Request::new(Prompt::Text(format!(
                "List six words about the number {i}:"
            )));
            r.max_tokens = 120;
            r.n = 2;
            r.sampling.temperature = 1.0;
            r.sampling.seed = i;
            r.grammar = Some(g.clone());
            e.submit(r).unwrap()
        })
        .collect();
    for s in streams {
        for c in s.collect_all().unwrap() {
            let v: serde_json::Value =
                serde_json::from_str(&c.text).unwrap_or_else(|err| panic!("{err}: {:?}", c.text));
            assert_eq!(v.as_array().map(Vec::len), Some(6), "{v}");
        }
    }
    let st = e.stats().unwrap();
    assert!(
        st.preemptions > 0,
        "the pool was meant to force preemption: {st:?}"
    );
    eprintln!("{} preemptions", st.preemptions);

    // A context generates under a grammar too, and keeps the result.
    let ctx = e.context(None).unwrap();
    ctx.append_text("Answer yes or no: is fire hot?").unwrap();
    let mut r = Request::new(Prompt::Tokens(vec![]));
    r.grammar = Some(
        gs.compile(&GrammarSpec::Choice(vec![" yes".into(), " no".into()]))
            .unwrap(),
    );
    let before = ctx.info().unwrap().seq_len;
    let out = ctx.generate(r).unwrap().collect_all().unwrap();
    assert!(
        [" yes", " no"].contains(&out[0].text.as_str()),
        "{:?}",
        out[0].text
    );
    assert_eq!(ctx.info().unwrap().seq_len, before + out[0].ids.len());
}

/// Three schemas of different shapes: objects with bounded strings and arrays,
/// enums, numbers with ranges and `anyOf`.
fn schemas() -> Vec<serde_json::Value> {
    vec![
        json!({"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 24},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "rating": {"type": "number", "minimum": 0, "maximum": 5}},
            "required": ["title", "tags", "year", "rating"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
            "required": ["name", "age", "colours"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
            "ok": {"type": "boolean"},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "kind": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer"}]}},
            "required": ["ok", "score", "kind"], "additionalProperties": false}),
    ]
}

fn engine_with_checks(checks: bool) -> Engine {
    engine(EngineConfig {
        grammar_checks: checks,
        ..Default::default()
    })
}

/// The default model on 2 threads with 512 pages and `cfg`'s other settings.
fn engine(cfg: EngineConfig) -> Engine {
    let model = Model::load(&common::model_path(), 2).unwrap();
    Engine::new(
        model,
        EngineConfig {
            kv_pages: 512,
            ..cfg
        },
    )
    .unwrap()
}

/// The test schemas compiled for the default model's vocabulary.
fn schema_grammars() -> Vec<folio::grammar::Grammar> {
    let model = Model::load(&common::model_path(), 1).unwrap();
    let gs = Grammars::new(&model.tokenizer, model.config.vocab).unwrap();
    schemas()
        .into_iter()
        .map(|s| gs.compile(&GrammarSpec::JsonSchema(s)).unwrap())
        .collect()
}

/// Submits `reqs` at once (one batch) and returns each sample's token ids and text.
fn batch(e: &Engine, reqs: Vec<Request>) -> Vec<(Vec<u32>, String)> {
    let streams: Vec<_> = reqs.into_iter().map(|r| e.submit(r).unwrap()).collect();
    streams
        .into_iter()
        .flat_map(|s| s.collect_all().unwrap())
        .map(|c| (c.ids, c.text))
        .collect()
}

/// Request `i` of a batch: schema `i % 3`, its own prompt and seed.
fn constrained(
    i: usize,
    grammars: &[folio::grammar::Grammar],
    sampling: &folio::model::SamplingParams,
) -> Request {
    let prompts = [
        "Describe a film as JSON:",
        "Describe a person as JSON:",
        "A verdict as JSON:",
    ];
    let mut r = Request::new(Prompt::Text(format!("{} (number {i})", prompts[i % 3])));
    r.max_tokens = 80;
    r.sampling = sampling.clone();
    r.sampling.seed = i as u64;
    r.grammar = Some(grammars[i % 3].clone());
    r
}

/// The keys each schema requires are there (outputs cut by max_tokens are skipped).
fn check_output(i: usize, text: &str) {
    let keys: [&[&str]; 3] = [
        &["title", "tags", "year", "rating"],
        &["name", "age", "colours"],
        &["ok", "score", "kind"],
    ];
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
        let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
        assert_eq!(o.len(), keys[i % 3].len(), "{text}");
        assert!(keys[i % 3].iter().all(|k| o.contains_key(*k)), "{text}");
    }
}

/// Greedy, and sampling with top-k/top-p/min-p cuts (where the sampler never draws a
/// rejection sample), give bit-identical token ids whether the sampler asks the
/// grammar about single tokens or masks every step; alone and in a batch of 16.
#[test]
fn asking_single_tokens_gives_the_tokens_masking_first_gives() {
    let (fast, slow) = (engine_with_checks(true), engine_with_checks(false));
    let grammars = schema_grammars();
    let greedy = folio::model::SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let cut = folio::model::SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        ..Default::default()
    };
    let nucleus = folio::model::SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 0.9,
        min_p: 0.0,
        ..Default::default()
    };
    for (label, sampling) in [("greedy", greedy), ("top-k", cut), ("top-p", nucleus)] {
        for i in 0..3 {
            let one = |e: &Engine| batch(e, vec![constrained(i, &grammars, &sampling)]);
            let got = one(&fast);
            assert_eq!(got, one(&slow), "{label}, alone, schema {i}");
            check_output(i, &got[0].1);
        }
        let sixteen = |e: &Engine| {
            batch(
                e,
                (0..16)
                    .map(|i| constrained(i, &grammars, &sampling))
                    .collect(),
            )
        };
        let got = sixteen(&fast);
        assert_eq!(got, sixteen(&slow), "{label}, batch of 16");
        for (i, (_, text)) in got.iter().enumerate() {
            check_output(i, text);
        }
    }
    let (f, s) = (fast.stats().unwrap(), slow.stats().unwrap());
    eprintln!(
        "asked: {} samples decided by single tokens, {} masked",
        f.grammar_checked, f.grammar_masked
    );
    assert!(f.grammar_checked > f.grammar_masked, "{f:?}");
    assert_eq!(s.grammar_checked, 0);
    assert_eq!(s.grammar_masked, f.grammar_checked + f.grammar_masked);
}

/// Sampling with temperature and no cuts (rejection draws) or min-p alone: a seed
/// gives the same tokens twice, n > 1 forks included, and every output matches.
#[test]
fn a_seed_gives_the_same_constrained_tokens_twice() {
    let e = engine_with_checks(true);
    let grammars = schema_grammars();
    for min_p in [0.0, 0.1] {
        let sampling = folio::model::SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p,
            ..Default::default()
        };
        let run = || {
            let reqs = (0..6)
                .map(|i| {
                    let mut r = constrained(i, &grammars, &sampling);
                    r.n = 2;
                    r
                })
                .collect();
            batch(&e, reqs)
        };
        let first = run();
        assert_eq!(first.len(), 12);
        assert_eq!(first, run(), "min_p {min_p}");
        for (k, (_, text)) in first.iter().enumerate() {
            check_output(k / 2, text);
        }
    }
    assert!(e.stats().unwrap().grammar_checked > 0);
}

/// Along walks through three schemas, the grammar takes a token exactly when its mask
/// allows it, for every token of the vocabulary: the single-token questions the
/// sampler asks stand for the mask.
#[test]
fn a_single_token_check_agrees_with_the_mask() {
    let model = Model::load(&common::model_path(), 1).unwrap();
    let gs = Grammars::new(&model.tokenizer, model.config.vocab).unwrap();
    let vocab = model.config.vocab as u32;
    let mut rng = folio::rng::SplitMix64(9);
    let mut states = 0;
    for schema in schemas() {
        let mut g = gs.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
        for _ in 0..30 {
            if g.is_done() {
                break;
            }
            let m = g.allowed().unwrap();
            let allowed: Vec<u32> = (0..vocab).filter(|&t| m.contains(t)).collect();
            for t in 0..vocab {
                assert_eq!(
                    g.accepts(t),
                    m.contains(t),
                    "token {t} after {states} states"
                );
            }
            states += 1;
            // Mostly short tokens, so the walk reaches deep into the schema.
            let pick = allowed[(rng.next_u64() % allowed.len() as u64) as usize];
            let short = allowed
                .iter()
                .copied()
                .filter(|&t| model.tokenizer.token_bytes(t).len() <= 2)
                .nth((rng.next_u64() % 4) as usize);
            assert!(g.advance(short.unwrap_or(pick)));
        }
    }
    assert!(states >= 60, "{states}");
}

fn engine_choosing(parallel: bool) -> Engine {
    engine(EngineConfig {
        parallel_sampling: parallel,
        ..Default::default()
    })
}

/// A step's samples chosen on the forward pass's threads give exactly the token ids
/// that choosing them one after another gives: greedy, cut, and sampling with no cuts
/// (the server's default, where rejection draws happen) or min-p alone; constrained
/// and plain requests in one batch of 16, a request of n = 4 forked from one prompt,
/// and one alone; a seed set per configuration (the sampled ones differ: a second set
/// per configuration doubled the test's time, the longest of the suite, for draws of
/// the same kinds).
#[test]
fn choosing_samples_on_threads_gives_the_serial_tokens() {
    let (threaded, serial) = (engine_choosing(true), engine_choosing(false));
    let grammars = schema_grammars();
    let params = |temperature, top_k, top_p, min_p| folio::model::SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..Default::default()
    };
    let configs = [
        ("greedy", params(0.0, 0, 1.0, 0.0)),
        ("top-k", params(0.9, 40, 0.9, 0.05)),
        ("no cuts", params(1.0, 0, 1.0, 0.0)),
        ("min-p", params(1.0, 0, 1.0, 0.1)),
    ];
    // Request `i`: constrained but for every fourth, which runs plain beside them.
    let request = |i: usize, seeds: u64, sampling: &folio::model::SamplingParams| {
        let mut r = constrained(i, &grammars, sampling);
        r.sampling.seed = seeds + i as u64;
        if i % 4 == 3 {
            r.grammar = None;
            r.max_tokens = 40;
        }
        r
    };
    let mut compared = 0;
    for (label, sampling) in &configs {
        // Greedy choices do not depend on the seed.
        let seed_sets: &[u64] = match *label {
            "greedy" => &[0],
            "top-k" => &[1000],
            "no cuts" => &[2000],
            _ => &[3000],
        };
        for &seeds in seed_sets {
            let sixteen =
                |e: &Engine| batch(e, (0..16).map(|i| request(i, seeds, sampling)).collect());
            let forked = |e: &Engine| {
                let mut r = request(seeds as usize % 3, seeds, sampling);
                r.n = 4;
                batch(e, vec![r])
            };
            let alone = |e: &Engine| batch(e, vec![request(1, seeds, sampling)]);
            for (what, run) in [
                (
                    "batch of 16",
                    &sixteen as &dyn Fn(&Engine) -> Vec<(Vec<u32>, String)>,
                ),
                ("n = 4", &forked),
                ("alone", &alone),
            ] {
                let got = run(&threaded);
                let want = run(&serial);
                let ids =
                    |v: &[(Vec<u32>, String)]| v.iter().map(|c| c.0.clone()).collect::<Vec<_>>();
                assert_eq!(ids(&got), ids(&want), "{label}, seeds {seeds}, {what}");
                compared += got.len();
            }
        }
    }
    assert_eq!(compared, configs.len() * (16 + 4 + 1));
    let (t, s) = (threaded.stats().unwrap(), serial.stats().unwrap());
    eprintln!(
        "{} samples chosen on threads; constrained: {} by single tokens, {} masked",
        t.samples_chosen_ahead, t.grammar_checked, t.grammar_masked
    );
    // The engine chooses on its forward pass's threads (two here), at most one a core.
    assert!(t.samples_chosen_ahead > 0, "{t:?}");
    assert_eq!(s.samples_chosen_ahead, 0);
    assert_eq!(t.generated_tokens, s.generated_tokens);
}
