//! The grammar module on the default model's vocabulary: choices of any size within
//! the caps are followed to the end, unsatisfiable grammars are refused at compile,
//! compiles at the caps are short, and a grammar that costs too much per token (or
//! that llguidance cannot follow) fails and takes no token.

use super::limits::{MAX_CHOICES, MAX_SOURCE_BYTES};
use super::*;
use std::sync::OnceLock;
use std::time::Duration;

/// The default model's tokenizer and grammar table, built once.
fn grammars() -> (&'static Tokenizer, &'static Grammars) {
    static G: OnceLock<Grammars> = OnceLock::new();
    let tok = crate::tokenizer::test_support::smollm();
    (
        tok,
        G.get_or_init(|| Grammars::new(tok, tok.vocab_size()).unwrap()),
    )
}

/// Feeds `text`'s tokens to `g`, each checked by `accepts` and by the mask first.
fn walk(g: &mut Grammar, tok: &Tokenizer, text: &str) {
    for id in tok.encode(text, false) {
        assert!(g.accepts(id), "{text:?}: token {id} refused");
        assert!(
            g.allowed().unwrap().contains(id),
            "{text:?}: {id} not in the mask"
        );
        assert!(
            g.advance(id),
            "{text:?}: advancing past {id}: {:?}",
            g.failure()
        );
    }
}

/// F5 of the 2026-11-27 probe: 2000 options or more, compiled as a Lark
/// alternation, broke after the first token. Each option is followed to its end, and
/// nothing else is taken.
#[test]
fn choices_of_thousands_of_options_are_followed_to_the_end() {
    let (tok, gs) = grammars();
    for (n, name) in [(2000, "item"), (5000, "option-"), (MAX_CHOICES, "o")] {
        let opts: Vec<String> = (0..n).map(|i| format!("{name}{i:04}")).collect();
        let g0 = gs.compile(&GrammarSpec::Choice(opts.clone())).unwrap();
        for pick in [&opts[0], &opts[n / 2], &opts[n - 1]] {
            let mut g = g0.clone();
            walk(&mut g, tok, pick);
            assert!(g.is_done(), "{n} options: {pick:?} is complete");
            assert!(g.failure().is_none());
        }
        let mut g = g0.clone();
        walk(&mut g, tok, name);
        for bad in ["x", "!", " "] {
            let id = tok.encode(bad, false)[0];
            assert!(!g.accepts(id), "{n} options: {bad:?} after {name:?}");
        }
    }
}

/// F16 of the 2026-11-27 probe: grammars no output matches gave 200 and empty text.
#[test]
fn unsatisfiable_grammars_are_refused_at_compile() {
    let (_, gs) = grammars();
    for spec in [
        GrammarSpec::JsonSchema(
            serde_json::json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),
        ),
        GrammarSpec::JsonSchema(serde_json::json!({"$ref": "#/$defs/a", "$defs": {
            "a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}})),
        GrammarSpec::Lark("start: a\na: a \"x\"".into()),
        GrammarSpec::Regex(r"[^\x00-\x{10FFFF}]".into()),
    ] {
        match gs.compile(&spec) {
            Err(GrammarError::Unsatisfiable) => {}
            other => panic!("{spec:?}: {other:?}"),
        }
    }
    // An empty output is an output: these match it.
    for spec in [
        GrammarSpec::Regex(String::new()),
        GrammarSpec::Choice(vec![String::new()]),
    ] {
        let mut g = gs.compile(&spec).unwrap();
        assert!(g.allowed().is_some(), "{spec:?}");
    }
}

/// F12 of the 2026-11-27 probe: compiles took up to 14.5 s and could not be stopped.
/// llguidance's compile cannot be interrupted, so the caps must keep the dearest
/// sources under them short: each of these takes under a second of CPU.
#[test]
fn compiles_at_the_caps_take_under_a_second_of_cpu() {
    let (_, gs) = grammars();
    let per = MAX_SOURCE_BYTES / MAX_CHOICES;
    let choices: Vec<String> = (0..MAX_CHOICES).map(|i| format!("{i:0per$}")).collect();
    let pieces = |w: usize, sep: usize| -> Vec<String> {
        (0..MAX_SOURCE_BYTES / (w + sep))
            .map(|i| format!("{:0w$}", i % 10usize.pow(w as u32)))
            .collect()
    };
    let lark = format!(
        "start: {}",
        pieces(6, 5)
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    assert!(lark.len() <= MAX_SOURCE_BYTES && lark.len() > MAX_SOURCE_BYTES - 16);
    let regex = pieces(2, 1).join("|");
    assert!(regex.len() <= MAX_SOURCE_BYTES && regex.len() > MAX_SOURCE_BYTES - 4);
    // `"00000000",` is 11 bytes; `{"enum":[]}` 11 more.
    let words: Vec<String> = pieces(8, 3)
        .into_iter()
        .take((MAX_SOURCE_BYTES - 11) / 11)
        .collect();
    let enum_ = serde_json::json!({ "enum": words });
    for (what, spec) in [
        ("choices", GrammarSpec::Choice(choices)),
        ("lark alternation", GrammarSpec::Lark(lark)),
        ("regex alternation", GrammarSpec::Regex(regex)),
        ("json enum", GrammarSpec::JsonSchema(enum_)),
    ] {
        limits::check_size(&spec).unwrap();
        let (cpu, wall) = (limits::thread_cpu_time(), std::time::Instant::now());
        let r = gs.compile(&spec);
        let (cpu, wall) = (limits::thread_cpu_time() - cpu, wall.elapsed());
        eprintln!(
            "{what}: {cpu:?} of CPU, {wall:?} of wall time: {:?}",
            r.as_ref().err()
        );
        assert!(r.is_ok(), "{what}: {r:?}");
        assert!(cpu < Duration::from_secs(1), "{what}: {cpu:?}");
    }
}

/// F4 of the 2026-11-27 probe: an ambiguous grammar costs more with every token,
/// without bound. Driven as the sampler drives it (questions, a mask, the token), it
/// fails once past its budget: it says why and takes no token.
#[test]
fn an_ambiguous_grammar_fails_once_past_its_time_budget() {
    let (tok, gs) = grammars();
    let a = tok.encode("a", false)[0];
    let mut g = gs
        .compile(&GrammarSpec::Lark(
            "start: e\ne: e e | e e e | \"a\"".into(),
        ))
        .unwrap();
    let mut steps = 0;
    while g.failure().is_none() && steps < 2000 {
        for id in 0..256 {
            g.accepts(id);
        }
        g.allowed();
        g.advance(a);
        steps += 1;
    }
    eprintln!("failed after {steps} tokens: {:?}", g.failure());
    match g.failure() {
        Some(GrammarError::Exceeded(why)) => assert!(why.contains("per token"), "{why}"),
        other => panic!("after {steps} tokens: {other:?}"),
    }
    assert!(!g.accepts(a));
    assert!(g.allowed().is_none());
    assert!(!g.advance(a));
    assert!(!g.is_done());
}

/// A thread descheduled past the whole reserve in the middle of grammar work (here
/// it sleeps, twice) does not fail the grammar: the CI flake of 2026-12-07, where
/// `choosing_samples_on_threads_gives_the_serial_tokens` failed a schema on 2 busy
/// cores. The budget then charges CPU time, and the grammar goes on to its end.
#[test]
fn a_thread_descheduled_in_grammar_work_does_not_fail_the_grammar() {
    let (tok, gs) = grammars();
    let mut g = gs.compile(&GrammarSpec::Regex("ab+c".into())).unwrap();
    for _ in 0..2 {
        let slept = g.run(true, |m| {
            std::thread::sleep(limits::BUDGET_RESERVE * 2);
            m.compute_mask_or_eos()
        });
        assert!(slept.is_some(), "{:?}", g.failure());
    }
    for text in ["a", "b", "b", "c"] {
        assert!(g.advance(tok.encode(text, false)[0]), "{:?}", g.failure());
    }
    assert!(g.is_done());
}

/// A limit llguidance meets while following a grammar (here 2000 items in an Earley
/// row) fails the grammar: it takes no token and says why.
#[test]
fn a_grammar_llguidance_cannot_follow_fails_and_says_why() {
    let (tok, gs) = grammars();
    let alts: Vec<String> = (0..2000).map(|i| format!("\"item{i:04}\"")).collect();
    let mut g = gs
        .compile(&GrammarSpec::Lark(format!("start: {}", alts.join(" | "))))
        .unwrap();
    let item = tok.encode("item", false)[0];
    assert!(!g.advance(item));
    match g.failure() {
        Some(GrammarError::Exceeded(why)) => assert!(why.contains("2000"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(g.allowed().is_none());
    assert!(!g.accepts(tok.encode("0", false)[0]));
}

#[test]
fn a_cancelled_compile_is_abandoned_before_llguidance_runs() {
    let (_, gs) = grammars();
    let cancel = CompileCancel::default();
    cancel.cancel();
    let e = gs
        .compile_with(&GrammarSpec::Regex("[a-z]+".into()), &cancel)
        .unwrap_err();
    assert_eq!(e, GrammarError::Cancelled);
    // A grammar compiled before a cancel is not affected by it.
    let cancel = CompileCancel::default();
    let mut g = gs
        .compile_with(&GrammarSpec::Regex("[a-z]+".into()), &cancel)
        .unwrap();
    cancel.cancel();
    assert!(g.allowed().is_some());
}
