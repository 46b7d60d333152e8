//! The tokenizers of the model families against llama.cpp, on llama.cpp's own
//! vocab-only GGUFs (fetched by `scripts/setup.sh`): Llama 3 (`llama-bpe`), Qwen2/2.5/3
//! (`qwen2`), SentencePiece with byte fallback (`llama-spm`: Llama 2, Mistral) and
//! Phi-3 (`phi-3`); and vocabularies derived from them for the families that have no
//! vocabulary file here (`scripts/parity/derived_vocabs.py`): Gemma 1/2/3's
//! SentencePiece (no space prefix, Gemma's control and user-defined tokens), Qwen2.5's
//! tool-call and fill-in-the-middle tokens, Mistral's tekken, and Llama 3's vocabulary
//! under every other pre-tokenizer name folio maps.
//! Each derived file is built here, with folio's `GgufWriter`, from the spec the
//! fixture holds. Two references: the test texts that ship with each file (`.inp`,
//! and `.out`: Hugging Face tokenizers' ids, which llama.cpp's own test requires), and
//! `fixtures/family_tokenizers.json`, llama.cpp's ids, pieces and end-of-generation
//! tokens for texts of the parity harness (`scripts/parity/make_family_fixtures.py`).

use crate::common;

use folio::gguf::{Gguf, GgufWriter, Value as Meta};
use folio::tokenizer::{Message, StreamDecoder, Tokenizer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

const VOCABS: [&str; 4] = ["llama-bpe", "qwen2", "llama-spm", "phi-3"];

/// The tokenizer of a fixture vocabulary: llama.cpp's file, or the file its spec derives.
/// All are built once, by the first test that asks (the tests run in parallel).
fn tokenizer(name: &str) -> &'static Tokenizer {
    static ALL: OnceLock<BTreeMap<String, Tokenizer>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        fixture_vocabs()
            .into_iter()
            .map(|name| {
                let t = match fixture()["vocabs"][name.as_str()].get("derive") {
                    Some(spec) => {
                        let path = derive(&name, spec);
                        let t = Tokenizer::from_gguf(&Gguf::open(&path).unwrap());
                        std::fs::remove_file(&path).unwrap();
                        t
                    }
                    None => Tokenizer::from_gguf(&Gguf::open(&common::vocab_path(&name)).unwrap()),
                };
                let t = t.unwrap_or_else(|e| panic!("{name}: its tokenizer: {e}"));
                (name, t)
            })
            .collect()
    });
    &all[name]
}

/// Writes the vocabulary `spec` derives (the fields are `derived_vocabs.py`'s): the
/// base's metadata in order, `llama.*` keys renamed for `arch`, `set` values replacing
/// (or following) the base's, tokens renamed and appended.
fn derive(name: &str, spec: &Value) -> PathBuf {
    let base = Gguf::open(&common::vocab_path(spec["base"].as_str().unwrap())).unwrap();
    let arch = spec["arch"].as_str();
    let mut sets: Vec<(String, Meta)> = spec
        .get("set")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let x = &v[1];
            let meta = match v[0].as_str().unwrap() {
                "bool" => Meta::Bool(x.as_bool().unwrap()),
                "string" => Meta::String(x.as_str().unwrap().into()),
                "u32" => Meta::U32(x.as_u64().unwrap() as u32),
                "i32" => Meta::I32(x.as_i64().unwrap() as i32),
                "f32" => Meta::F32(x.as_f64().unwrap() as f32),
                "template" => {
                    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("tests/fixtures/templates")
                        .join(x.as_str().unwrap());
                    Meta::String(std::fs::read_to_string(&p).expect("the template"))
                }
                other => panic!("{name}: metadata type {other}"),
            };
            (k.clone(), meta)
        })
        .collect();
    let empty = Vec::new();
    let append = spec
        .get("append")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let rename = |i: usize| spec.get("rename").and_then(|r| r[i.to_string()].as_str());
    let mut w = GgufWriter::new();
    for (key, value) in base.metadata() {
        let mut key = key.clone();
        let mut value = value.clone();
        if let Some(at) = sets.iter().position(|(k, _)| *k == key) {
            value = sets.remove(at).1;
        } else if key == "general.architecture" {
            value = arch.map_or(value, |a| Meta::String(a.into()));
        } else if let (Some(a), Some(rest)) = (arch, key.strip_prefix("llama.")) {
            key = format!("{a}.{rest}");
        }
        let n = append.len();
        match (key.as_str(), &mut value) {
            ("tokenizer.ggml.tokens", Meta::Array(a)) => {
                for (i, t) in a.iter_mut().enumerate() {
                    if let Some(text) = rename(i) {
                        *t = Meta::String(text.into());
                    }
                }
                a.extend(
                    append
                        .iter()
                        .map(|t| Meta::String(t[0].as_str().unwrap().into())),
                );
            }
            ("tokenizer.ggml.token_type", Meta::Array(a)) => {
                a.extend(
                    append
                        .iter()
                        .map(|t| Meta::I32(t[1].as_i64().unwrap() as i32)),
                );
            }
            ("tokenizer.ggml.scores", Meta::Array(a)) => {
                a.extend(
                    append
                        .iter()
                        .map(|t| Meta::F32(t[2].as_f64().unwrap() as f32)),
                );
            }
            (k, Meta::U32(v)) if k.ends_with(".vocab_size") => *v += n as u32,
            _ => {}
        }
        w.meta(&key, value);
    }
    for (key, value) in sets {
        w.meta(&key, value);
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ggml-vocab-{name}.gguf"));
    std::fs::write(&path, w.to_bytes()).expect("write the derived vocabulary");
    path
}

/// The fixture's vocabularies: llama.cpp's files, then the derived ones.
fn fixture_vocabs() -> Vec<String> {
    let vocabs = fixture()["vocabs"].as_object().unwrap();
    let names: Vec<String> = vocabs.keys().cloned().collect();
    assert!(names.len() >= 30, "{names:?}");
    for must in [
        "gemma",
        "gemma2",
        "gemma3",
        "qwen2.5",
        "tekken",
        "pre-default",
    ] {
        assert!(names.iter().any(|n| n == must), "{must} in the fixture");
    }
    names
}

fn fixture() -> &'static Value {
    static F: OnceLock<Value> = OnceLock::new();
    F.get_or_init(|| common::fixtures("family_tokenizers.json"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn each_familys_test_texts_encode_to_the_reference_ids() {
    for name in VOCABS {
        let t = tokenizer(name);
        let path = common::vocab_path(name);
        let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
        // As test-tokenizer-0 reads them: texts between separators, none after the last.
        let sep = "\n__ggml_vocab_test__\n";
        let texts: Vec<&str> = inp.strip_suffix(sep).unwrap_or(&inp).split(sep).collect();
        let ids: Vec<&str> = out.lines().collect();
        assert_eq!(texts.len(), ids.len(), "{name}: texts and id lines");
        assert!(texts.len() >= 40, "{name}");
        for (text, line) in texts.iter().zip(ids) {
            let want: Vec<u32> = line
                .split_whitespace()
                .map(|i| i.parse().unwrap())
                .collect();
            // As llama.cpp's test-tokenizer-0: no BOS, special-token text as text.
            assert_eq!(t.encode_literal(text, false), want, "{name}: {text:?}");
        }
    }
}

#[test]
fn each_familys_encoding_matches_llama_cpp_on_every_fixture() {
    let mut failures = Vec::new();
    for name in fixture_vocabs() {
        let name = name.as_str();
        let t = tokenizer(name);
        let cases = fixture()["vocabs"][name]["encode"].as_array().unwrap();
        assert!(cases.len() >= 60, "{name}");
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let add = case["add_special"].as_bool().unwrap();
            let want = common::ids(&case["ids"]);
            let parse = case["parse_special"].as_bool().unwrap();
            let got = if parse {
                t.encode(text, add)
            } else {
                t.encode_literal(text, add)
            };
            if got != want {
                failures.push(format!(
                    "{name}: {text:?} (add_special {add}, parse_special {parse}): \
                     folio {got:?}, llama.cpp {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn each_familys_decoding_and_streaming_match_llama_cpp_on_every_fixture() {
    for name in fixture_vocabs() {
        let name = name.as_str();
        let t = tokenizer(name);
        let cases = fixture()["vocabs"][name]["decode"].as_array().unwrap();
        // The pre-tokenizer variants share llama-bpe's pieces: a few cases each.
        assert!(
            cases.len() >= if name.starts_with("pre-") { 4 } else { 20 },
            "{name}"
        );
        for case in cases {
            let ids = common::ids(&case["ids"]);
            let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_bytes(i)).collect();
            assert_eq!(
                hex(&bytes),
                case["bytes"].as_str().unwrap(),
                "{name}: {ids:?}"
            );
            assert_eq!(
                t.decode(&ids),
                case["text"].as_str().unwrap(),
                "{name}: {ids:?}"
            );
            assert_eq!(
                t.decode_special(&ids),
                case["special_text"].as_str().unwrap(),
                "{name}: {ids:?} with control tokens as text"
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
            assert_eq!(stream, want, "{name}: streamed pieces of {ids:?}");
        }
    }
}

#[test]
fn each_familys_end_of_generation_tokens_are_llama_cpps() {
    for name in fixture_vocabs() {
        let t = tokenizer(&name);
        let want: Vec<u32> = common::ids(&fixture()["vocabs"][name.as_str()]["eog"]);
        assert!(!want.is_empty(), "{name}");
        let got: Vec<u32> = (0..t.vocab_size() as u32)
            .filter(|&i| t.is_eog(i))
            .collect();
        assert_eq!(got, want, "{name}: the tokens that end a generation");
    }
}

/// A chat prompt as llama.cpp's server makes it: the template's render (its leading
/// BOS text dropped, as the tokenizer adds the BOS), tokenized with special tokens. So
/// Gemma's and Mistral's templates, which write the BOS text, give one BOS, not two.
#[test]
fn each_familys_chat_prompt_has_llama_cpps_ids_and_one_bos() {
    let (mut n, mut with_bos) = (0, 0);
    for name in fixture_vocabs() {
        let Some(cases) = fixture()["vocabs"][name.as_str()].get("chat") else {
            continue;
        };
        let t = tokenizer(&name);
        let template = t.chat_template().expect("the template compiles");
        for case in cases.as_array().unwrap() {
            let messages: Vec<Message> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect();
            let text = template.render(&messages, true).unwrap();
            assert_eq!(text, case["text"].as_str().unwrap(), "{name}");
            let ids = t.encode(&text, true);
            assert_eq!(ids, common::ids(&case["ids"]), "{name}: {text:?}");
            if t.adds_bos() {
                let bos = t.bos.unwrap();
                assert_eq!(
                    ids.iter().filter(|&&i| i == bos).count(),
                    1,
                    "{name}: {ids:?}"
                );
                assert_eq!(ids[0], bos, "{name}");
                with_bos += 1;
            }
            n += 1;
        }
    }
    // Gemma 2, Gemma 3 and Mistral Nemo (tekken) write the BOS text and add a BOS.
    assert!(
        n >= 6 && with_bos >= 6,
        "{n} chat cases, {with_bos} with a BOS"
    );
}

#[test]
fn end_of_generation_tokens_of_each_family_stop_generation() {
    let stops = [
        ("llama-bpe", &["<|eot_id|>", "<|end_of_text|>"][..]),
        ("qwen2", &["<|im_end|>", "<|endoftext|>"][..]),
        ("llama-spm", &["</s>"][..]),
        ("phi-3", &["<|end|>", "<|endoftext|>", "</s>"][..]),
    ];
    for (name, texts) in stops {
        let t = tokenizer(name);
        for text in texts {
            let id = t.token_id(text).unwrap_or_else(|| panic!("{name}: {text}"));
            assert!(t.is_eog(id), "{name}: {text}");
        }
    }
}
