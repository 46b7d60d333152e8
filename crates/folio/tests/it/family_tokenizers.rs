//! The tokenizers of the model families against llama.cpp, on llama.cpp's own
//! vocab-only GGUFs (fetched by `scripts/setup.sh`): Llama 3 (`llama-bpe`), Qwen2/2.5/3
//! (`qwen2`), SentencePiece with byte fallback (`llama-spm`: Llama 2, Mistral) and
//! Phi-3 (`phi-3`). Two references: the test texts that ship with each file (`.inp`,
//! and `.out`: Hugging Face tokenizers' ids, which llama.cpp's own test requires), and
//! `fixtures/family_tokenizers.json`, llama.cpp's ids and pieces for texts of the
//! parity harness (`scripts/parity/make_family_fixtures.py`).

use crate::common;

use folio::gguf::Gguf;
use folio::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;
use std::sync::OnceLock;

const VOCABS: [&str; 4] = ["llama-bpe", "qwen2", "llama-spm", "phi-3"];

fn tokenizer(name: &str) -> Tokenizer {
    let g = Gguf::open(&common::vocab_path(name)).expect("open the vocabulary");
    Tokenizer::from_gguf(&g).expect("its tokenizer")
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
    for name in VOCABS {
        let t = tokenizer(name);
        let cases = fixture()["vocabs"][name]["encode"].as_array().unwrap();
        assert!(cases.len() >= 100, "{name}");
        let mut failures = Vec::new();
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
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

#[test]
fn each_familys_decoding_and_streaming_match_llama_cpp_on_every_fixture() {
    for name in VOCABS {
        let t = tokenizer(name);
        let cases = fixture()["vocabs"][name]["decode"].as_array().unwrap();
        assert!(cases.len() >= 20, "{name}");
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
            let mut stream: Vec<String> = ids.iter().map(|&i| d.push(&t, i)).collect();
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
