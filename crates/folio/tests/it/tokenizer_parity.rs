//! The cases the tokenizer parity harness (`scripts/parity/`) found, and their
//! neighbours, checked without llama.cpp or jinja2: `fixtures/tokenizer_parity.json`
//! holds llama.cpp's ids and bytes for the default model and jinja2's rendering of
//! its chat template (and of folio's fallback and two probe templates), made by
//! `scripts/parity/make_fixtures.py`.

use crate::common;

use folio::gguf::Gguf;
use folio::tokenizer::{ChatTemplate, Message, StreamDecoder, Tokenizer};
use serde_json::Value;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let g = Gguf::open(&common::model_path()).expect("open the default model");
        Tokenizer::from_gguf(&g).expect("its tokenizer")
    })
}

fn fixture() -> &'static Value {
    static F: OnceLock<Value> = OnceLock::new();
    F.get_or_init(|| common::fixtures("tokenizer_parity.json"))
}

fn cases(key: &str) -> &'static [Value] {
    fixture()[key].as_array().expect("a list of cases")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn encoding_matches_llama_cpp_on_every_fixture() {
    let t = tokenizer();
    let mut failures = Vec::new();
    for case in cases("encode") {
        let text = case["text"].as_str().unwrap();
        let want = common::ids(&case["ids"]);
        let got = if case["parse_special"].as_bool().unwrap() {
            t.encode(text, false)
        } else {
            t.encode_literal(text, false)
        };
        if got != want {
            failures.push(format!(
                "{text:?} (parse_special {}): folio {got:?}, llama.cpp {want:?} ({})",
                case["parse_special"], case["why"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases("encode").len() >= 100);
}

#[test]
fn decoding_and_streaming_match_llama_cpp_on_every_fixture() {
    let t = tokenizer();
    for case in cases("decode") {
        let ids = common::ids(&case["ids"]);
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_bytes(i)).collect();
        assert_eq!(
            hex(&bytes),
            case["bytes"].as_str().unwrap(),
            "bytes of {ids:?}"
        );
        assert_eq!(t.decode(&ids), case["text"].as_str().unwrap(), "{ids:?}");
        assert_eq!(
            t.decode_special(&ids),
            case["special_text"].as_str().unwrap(),
            "{ids:?} with control tokens as text"
        );
        let mut d = StreamDecoder::default();
        let mut stream: Vec<String> = ids.iter().map(|&i| d.push(t, i)).collect();
        stream.push(d.finish());
        let want: Vec<&str> = case["stream"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        assert_eq!(stream, want, "streamed pieces of {ids:?} ({})", case["why"]);
    }
}

#[test]
fn chat_templates_render_as_jinja2_does_on_every_fixture() {
    let t = tokenizer();
    let model_template = t.chat_template().expect("the model's template compiles");
    let text = |id: Option<u32>| id.and_then(|i| t.token_text(i)).unwrap_or("");
    let mut n = 0;
    for case in cases("templates") {
        let own;
        let template = match case["source"].as_str() {
            Some(source) => {
                own = ChatTemplate::new(source, text(t.bos), text(t.eos)).expect("compiles");
                &own
            }
            None => &model_template,
        };
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let tools = case.get("tools").filter(|v| !v.is_null());
        let got = template.render_with_tools(
            &messages,
            case["add_generation_prompt"].as_bool().unwrap(),
            tools,
        );
        match case["text"].as_str() {
            Some(want) => assert_eq!(
                got.as_deref().map_err(|e| e.to_string()),
                Ok(want),
                "template {} on {messages:?}",
                case["template"]
            ),
            None => assert!(
                got.is_err(),
                "template {} should refuse {messages:?} as jinja2 does",
                case["template"]
            ),
        }
        n += 1;
    }
    assert!(n >= 30);
}
