//! Constrained decoding on the default model: the output always matches the grammar
//! (a JSON schema, any JSON object, a regex, a choice), under sampling, with n > 1
//! forks, and batched beside unconstrained requests; a bad source is an error first.

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
