//! Tests: a streamed answer with tools ([`ToolStream`]'s pieces, put back together as
//! an OpenAI client does) equals the whole output's answer (`tools::extract`), at
//! every split of the output, in every mode. They sit apart from both readers so
//! that neither imports the other.

use crate::tool_call::Mode;
use crate::tool_stream::{Piece, ToolStream, CLOSE, OPEN};
use crate::tools::extract;
use crate::tools::tests::tools;
use folio::rng::SplitMix64;

/// An answer as an OpenAI client holds it: content, and each call's name and
/// arguments.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    content: Option<String>,
    calls: Vec<(String, String)>,
}

fn answer(content: Option<&str>, calls: &[(&str, &str)]) -> Answer {
    Answer {
        content: content.map(str::to_string),
        calls: calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect(),
    }
}

/// The unstreamed answer, as `chat.rs` builds it from `extract`.
fn whole(mode: &Mode, text: &str) -> Answer {
    match extract(&tools(mode.clone()), text) {
        Some((calls, content)) => Answer {
            content,
            calls: calls.into_iter().map(|c| (c.name, c.arguments)).collect(),
        },
        None => Answer {
            content: Some(text.to_string()),
            calls: Vec::new(),
        },
    }
}

/// The streamed answer put back together as an OpenAI client does: the first
/// delta's content is null (`chat.rs` sends that with tools), content deltas are
/// concatenated, a call begins at a new index, and `function.arguments` deltas are
/// concatenated per index. `chat.rs` feeds the last text then `finish`.
fn streamed(mode: &Mode, pieces: &[&str]) -> Answer {
    let mut s = ToolStream::new(mode);
    let mut a = Answer {
        content: None,
        calls: Vec::new(),
    };
    let take = |ps: Vec<Piece>, a: &mut Answer| {
        for p in ps {
            match p {
                Piece::Content(c) => a.content.get_or_insert_with(String::new).push_str(&c),
                Piece::Begin { k, name } => {
                    assert_eq!(k, a.calls.len(), "a call begins at the next index");
                    a.calls.push((name, String::new()));
                }
                Piece::Args { k, text } => {
                    assert!(k < a.calls.len(), "arguments for call {k} before it began");
                    a.calls[k].1.push_str(&text);
                }
            }
        }
    };
    for p in pieces {
        take(s.push(p), &mut a);
    }
    take(s.finish(), &mut a);
    assert_eq!(s.calls(), a.calls.len());
    a
}

/// The char boundaries of `text`, 0 and its length included.
fn cuts(text: &str) -> Vec<usize> {
    (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

/// `text` cut at the given sorted boundaries.
fn pieces_at<'a>(text: &'a str, at: &[usize]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut from = 0;
    for &i in at {
        out.push(&text[from..i]);
        from = i;
    }
    out.push(&text[from..]);
    out
}

/// Every way the test splits `text`: in two at every char boundary (empty halves
/// included), one char at a time, and `random` random multi-piece splits (which
/// may repeat a boundary, giving empty pieces as an empty token does).
fn splits<'a>(text: &'a str, rng: &mut SplitMix64, random: usize) -> Vec<Vec<&'a str>> {
    let cuts = cuts(text);
    let mut out: Vec<Vec<&str>> = cuts.iter().map(|&i| pieces_at(text, &[i])).collect();
    if let [_, inner @ .., _] = cuts.as_slice() {
        out.push(pieces_at(text, inner));
    }
    for _ in 0..random {
        let n = rng.below(8) as usize + 2;
        let mut at: Vec<usize> = (0..n)
            .map(|_| cuts[rng.below(cuts.len() as u64) as usize])
            .collect();
        at.sort_unstable();
        out.push(pieces_at(text, &at));
    }
    out
}

/// Checks that every split of `text` streams to the unstreamed answer; returns how
/// many splits it checked.
fn check(mode: &Mode, text: &str, rng: &mut SplitMix64) -> usize {
    let want = whole(mode, text);
    let all = splits(text, rng, 8);
    for p in &all {
        assert_eq!(streamed(mode, p), want, "{mode:?} {text:?} split as {p:?}");
    }
    all.len()
}

/// `text`'s whole answer is `want`, and so is every split of it streamed.
fn assert_answer(mode: Mode, text: &str, want: Answer) {
    assert_eq!(whole(&mode, text), want, "unstreamed {text:?}");
    check(&mode, text, &mut SplitMix64(1));
}

fn auto(body: &str) -> String {
    format!("{OPEN}{body}{CLOSE}")
}

const AUTO: Mode = Mode::Auto;
const REQUIRED: Mode = Mode::Required { parallel: true };

// The probe's rows (server-2026-11-27, F13), each the same answer in both paths.

#[test]
fn trailing_junk_after_the_json_leaves_the_block_as_text() {
    let text = auto(r#"{"name": "f", "arguments": {"a": 1}} trailing junk"#);
    assert_answer(AUTO, &text, answer(Some(&text), &[]));
}

#[test]
fn duplicate_name_keys_call_the_first_name() {
    let text = auto(r#"{"name": "f", "name": "g", "arguments": {}}"#);
    assert_answer(AUTO, &text, answer(None, &[("f", "{}")]));
}

#[test]
fn missing_arguments_are_an_empty_object() {
    assert_answer(
        AUTO,
        &auto(r#"{"name": "f"}"#),
        answer(None, &[("f", "{}")]),
    );
    assert_answer(REQUIRED, r#"[{"name": "f"}]"#, answer(None, &[("f", "{}")]));
}

#[test]
fn arguments_given_as_a_string_stay_that_json_string() {
    let text = auto(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#);
    assert_answer(AUTO, &text, answer(None, &[("f", r#""{\"a\": 1}""#)]));
}

#[test]
fn two_objects_in_one_block_leave_it_as_text() {
    let text = auto(r#"{"name": "f", "arguments": {}}{"name": "g", "arguments": {}}"#);
    assert_answer(AUTO, &text, answer(Some(&text), &[]));
}

#[test]
fn a_closing_tag_inside_a_string_ends_the_block_and_leaves_it_as_text() {
    let text = auto(r#"{"name": "f", "arguments": {"s": "x</tool_call>y"}}"#);
    assert_answer(AUTO, &text, answer(Some(&text), &[]));
}

#[test]
fn nested_tool_call_tags_are_text() {
    let text = auto(&auto(r#"{"name": "f", "arguments": {}}"#));
    assert_answer(AUTO, &text, answer(Some(&text), &[]));
}

#[test]
fn required_with_string_parameters_gives_the_json_string() {
    let text = r#"{"name": "f", "arguments": "1.1.1"}"#;
    assert_answer(REQUIRED, text, answer(None, &[("f", r#""1.1.1""#)]));
    let named = Mode::Named("f".into());
    assert_answer(named, r#" "1.1.1" "#, answer(None, &[("f", r#""1.1.1""#)]));
}

#[test]
fn required_cut_by_max_tokens_keeps_the_begun_calls_or_is_content() {
    let text = r#"[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"s": "par"#;
    let want = answer(None, &[("f", r#"{"a":1}"#), ("g", r#"{"s":"par"#)]);
    assert_answer(REQUIRED, text, want);
    // Cut before the name's value ended: no call, the text is the content.
    let text = r#"[{"arguments": {"a": 1}, "name": "f"#;
    assert_answer(REQUIRED, text, answer(Some(text), &[]));
}

// The probe's minor differences.

#[test]
fn arguments_are_minified_the_same_in_every_mode() {
    let args = r#"{ "b" : [1, 2.50e1], "a": "x  y\" }", "n": null }"#;
    let want = r#"{"b":[1,2.50e1],"a":"x  y\" }","n":null}"#;
    let call = format!(r#"{{"name": "f", "arguments": {args}}}"#);
    assert_answer(AUTO, &auto(&call), answer(None, &[("f", want)]));
    assert_answer(REQUIRED, &call, answer(None, &[("f", want)]));
    assert_answer(Mode::Named("f".into()), args, answer(None, &[("f", want)]));
}

#[test]
fn content_is_null_with_calls_and_no_text_and_verbatim_without_calls() {
    let call = auto(r#"{"name": "f", "arguments": {}}"#);
    let text = format!("\n{call}\n \n{call}\n");
    assert_answer(AUTO, &text, answer(None, &[("f", "{}"), ("f", "{}")]));
    let text = format!("  Let me check.\n{call}\nDone. \n");
    let want = answer(Some("  Let me check.\n\nDone."), &[("f", "{}")]);
    assert_answer(AUTO, &text, want);
    assert_answer(AUTO, "", answer(Some(""), &[]));
    assert_answer(AUTO, " \n", answer(Some(" \n"), &[]));
    assert_answer(REQUIRED, "", answer(Some(""), &[]));
    assert_answer(Mode::Named("f".into()), "", answer(None, &[("f", "")]));
}

#[test]
fn an_unclosed_block_at_the_end_is_a_call_when_whole() {
    let text = format!("{OPEN}{}", r#"{"name": "f", "arguments": {"a": 1}}"#);
    assert_answer(AUTO, &text, answer(None, &[("f", r#"{"a":1}"#)]));
    let text = format!("{OPEN}{}", r#"{"name": "f", "arguments": {"a": 1}}</tool_"#);
    assert_answer(AUTO, &text, answer(Some(&text), &[]));
}

#[test]
fn a_name_that_is_not_a_string_makes_no_call() {
    let text = auto(r#"{"name": 5, "name": "f", "arguments": {}}"#);
    assert_answer(AUTO, &text, answer(Some(&text), &[]));
    let text = r#"{"x": "name", "y": "f", "name": "g"}"#;
    assert_answer(REQUIRED, text, answer(None, &[("g", "{}")]));
}

/// A random JSON-ish value: mostly valid, at times junk; whitespace between tokens.
fn value(rng: &mut SplitMix64, depth: u32, out: &mut String) {
    let ws = |rng: &mut SplitMix64, out: &mut String| {
        const WS: [&str; 6] = ["", "", "", " ", "\n", "\t "];
        out.push_str(WS[rng.below(WS.len() as u64) as usize]);
    };
    ws(rng, out);
    let pick = if depth >= 3 {
        rng.below(5)
    } else {
        rng.below(8)
    };
    match pick {
        0 => {
            const STR: [&str; 10] = [
                r#""Paris""#,
                r#""a \"q\" \\ b""#,
                r#""x</tool_call>y""#,
                r#""<tool_call>""#,
                r#""é日🙂""#,
                r#""\u00e9\n, }]""#,
                "\"\u{2028}\"",
                r#""""#,
                r#""name""#,
                r#""{\"a\": 1}""#,
            ];
            out.push_str(STR[rng.below(STR.len() as u64) as usize]);
        }
        1 => {
            const NUM: [&str; 6] = ["1", "-0.5", "2.50e1", "12345678901234567890123", "0", "1.0"];
            out.push_str(NUM[rng.below(NUM.len() as u64) as usize]);
        }
        2 => out.push_str(["true", "false", "null"][rng.below(3) as usize]),
        3 => out.push_str(["junk", "}", "]", ",", ":", "{"][rng.below(6) as usize]),
        4 | 5 => call(rng, depth + 1, out),
        6 => {
            out.push('[');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                value(rng, depth + 1, out);
            }
            ws(rng, out);
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..rng.below(4) {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                const KEY: [&str; 5] =
                    [r#""a""#, r#""name""#, r#""arguments""#, r#""s""#, r#""é""#];
                out.push_str(KEY[rng.below(KEY.len() as u64) as usize]);
                ws(rng, out);
                out.push(':');
                value(rng, depth + 1, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

/// A random call object: `name` and `arguments` in any order, at times twice or
/// missing, escaped, not a string, with other keys beside them.
fn call(rng: &mut SplitMix64, depth: u32, out: &mut String) {
    out.push('{');
    let n = rng.below(4) + 1;
    for i in 0..n {
        if i > 0 {
            out.push_str([",", ", ", ",\n"][rng.below(3) as usize]);
        }
        match rng.below(6) {
            0 | 1 => {
                const NAME: [&str; 7] = [
                    r#""f""#,
                    r#""get_weather""#,
                    r#""g""#,
                    r#""q\"uote""#,
                    "\"u\u{2028}n\"",
                    "5",
                    r#""\u0066""#,
                ];
                let key = [r#""name""#, r#""n\u0061me""#][usize::from(rng.below(6) == 0)];
                out.push_str(key);
                out.push_str([":", ": ", " : "][rng.below(3) as usize]);
                out.push_str(NAME[rng.below(NAME.len() as u64) as usize]);
            }
            2 | 3 => {
                out.push_str(r#""arguments":"#);
                value(rng, depth + 1, out);
            }
            4 => {
                out.push_str(r#""id":"#);
                value(rng, depth + 1, out);
            }
            _ => out.push_str(["junk", r#""x""#, r#""k": "v""#][rng.below(3) as usize]),
        }
    }
    out.push('}');
}

/// A random model output for `mode`: for `auto`, text mixed with `<tool_call>`
/// blocks (calls, junk, nested and unclosed tags, tag fragments); for the forced
/// modes, JSON (a call, a list of calls, any value) with text at times; cut short
/// at a random char boundary one time in four.
fn output(rng: &mut SplitMix64, mode: &Mode) -> String {
    let mut out = String::new();
    if matches!(mode, Mode::Auto) {
        const TEXT: [&str; 14] = [
            "Let me check.",
            " ",
            "\n",
            "é日🙂",
            "\u{2028}",
            "<",
            "<tool",
            "<tool_c",
            "</tool_call",
            "tool_call>",
            "a < b",
            "{\"name\": \"f\"}",
            "\n\n",
            "}",
        ];
        for _ in 0..rng.below(6) + 1 {
            match rng.below(8) {
                0 | 1 => out.push_str(TEXT[rng.below(TEXT.len() as u64) as usize]),
                2..=4 => {
                    out.push_str(OPEN);
                    out.push_str(["", "\n", " "][rng.below(3) as usize]);
                    if rng.below(2) == 0 {
                        out.push_str(r#"{"name": "get_weather", "arguments":"#);
                        value(rng, 1, &mut out);
                        out.push('}');
                    } else {
                        call(rng, 0, &mut out);
                    }
                    out.push_str(["", "\n", "\n", " junk", "}"][rng.below(5) as usize]);
                    out.push_str(CLOSE);
                }
                5 => out.push_str(OPEN),
                6 => out.push_str(CLOSE),
                _ => value(rng, 1, &mut out),
            }
        }
    } else {
        match rng.below(5) {
            0 | 1 => call(rng, 0, &mut out),
            2 | 3 => {
                out.push('[');
                for i in 0..rng.below(4) + 1 {
                    if i > 0 {
                        out.push_str([",", ", "][rng.below(2) as usize]);
                    }
                    call(rng, 0, &mut out);
                }
                out.push(']');
            }
            _ => value(rng, 0, &mut out),
        }
        if rng.below(8) == 0 {
            out.push_str([" junk", "{\"name\": \"h\"}", "\n"][rng.below(3) as usize]);
        }
    }
    if rng.below(4) == 0 {
        let cuts = cuts(&out);
        out.truncate(cuts[rng.below(cuts.len() as u64) as usize]);
    }
    out
}

/// The property: for every output, every split of it streams to exactly the
/// unstreamed answer (content and each call's name and arguments). Over the
/// probe's rows and 2,000 random outputs per mode.
#[test]
fn streamed_answers_equal_the_unstreamed_ones_at_every_split() {
    let mut rng = SplitMix64(0x5eed_7001);
    let probe = [
        auto(r#"{"name": "f", "arguments": {"a": 1}} trailing junk"#),
        auto(r#"{"name": "f", "name": "g", "arguments": {}}"#),
        auto(r#"{"name": "f"}"#),
        auto(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#),
        auto(r#"{"name": "f", "arguments": {}}{"name": "g", "arguments": {}}"#),
        auto(r#"{"name": "f", "arguments": {"s": "x</tool_call>y"}}"#),
        auto(&auto(r#"{"name": "f", "arguments": {}}"#)),
        r#"{"name": "f", "arguments": "1.1.1"}"#.to_string(),
        r#"[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"s": "pa"#
            .to_string(),
    ];
    let modes = [Mode::Auto, REQUIRED, Mode::Named("f".into())];
    let (mut outputs, mut splits) = (0, 0);
    for text in &probe {
        for mode in &modes {
            outputs += 1;
            splits += check(mode, text, &mut rng);
        }
    }
    let mut with_calls = [0; 3];
    for (m, mode) in modes.iter().enumerate() {
        for _ in 0..2000 {
            let text = output(&mut rng, mode);
            outputs += 1;
            splits += check(mode, &text, &mut rng);
            with_calls[m] += usize::from(extract(&tools(mode.clone()), &text).is_some());
        }
    }
    eprintln!("{outputs} outputs, {splits} splits; with calls per mode: {with_calls:?}");
    // The generator makes both kinds of output in the modes where both exist.
    assert!(
        with_calls[0] > 400 && with_calls[0] < 1600,
        "{with_calls:?}"
    );
    assert!(
        with_calls[1] > 400 && with_calls[1] < 1600,
        "{with_calls:?}"
    );
}
