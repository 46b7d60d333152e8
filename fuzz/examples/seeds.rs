//! Writes the seed inputs of every target under `<dir>/<target>/` (default
//! `fuzz/corpus`): a few small, valid inputs that `scripts/fuzz.sh` starts from.
//! `cargo run --release -p folio-fuzz --example seeds [dir]`

use folio::gguf::{GgmlType, GgufWriter, Value};
use folio_fuzz::snapshot;
use std::path::{Path, PathBuf};

fn main() {
    let root = std::env::args().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus"),
        PathBuf::from,
    );
    let write = |target: &str, name: &str, data: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("the corpus folder");
        std::fs::write(dir.join(format!("seed-{name}")), data).expect("a seed");
    };
    for (name, data) in gguf() {
        write("gguf", &name, &data);
    }
    for (name, data) in tokenizer() {
        write("tokenizer", &name, &data);
    }
    for (name, data) in template() {
        write("template", &name, &data);
    }
    for (name, data) in snapshots() {
        write("snapshot", &name, &data);
    }
    for (name, data) in http() {
        write("http", &name, &data);
    }
    println!("seeds written under {}", root.display());
}

fn gguf() -> Vec<(String, Vec<u8>)> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("general.alignment", Value::U32(32))
        .meta("a.u8", Value::U8(1))
        .meta("a.i8", Value::I8(-1))
        .meta("a.u16", Value::U16(2))
        .meta("a.i16", Value::I16(-2))
        .meta("a.i32", Value::I32(-3))
        .meta("a.f32", Value::F32(0.5))
        .meta("a.bool", Value::Bool(true))
        .meta("a.u64", Value::U64(4))
        .meta("a.i64", Value::I64(-4))
        .meta("a.f64", Value::F64(0.25))
        .meta(
            "a.arr",
            Value::Array(vec![Value::Array(vec![Value::String("x".into())])]),
        )
        .tensor("f32", &[2, 2], GgmlType::F32, vec![0; 16])
        .tensor("f16", &[4], GgmlType::F16, vec![0; 8])
        .tensor("q4_1", &[32], GgmlType::Q4_1, vec![0; 20])
        .tensor("q8_0", &[32], GgmlType::Q8_0, vec![0; 34]);
    vec![
        ("meta-and-tensors".into(), w.to_bytes()),
        (
            "tiny-model-q8_0".into(),
            folio::tiny::model_bytes(1, GgmlType::Q8_0),
        ),
    ]
}

fn tokenizer() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let texts = [
        "Hello, world! It's 3.14 o'clock.",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "héllo wörld 日本語 🎉 \u{200d}",
        "    fn main() {\n\tprintln!(\"{}\", 12345);\n}\n\n",
    ];
    for (i, t) in texts.iter().enumerate() {
        let mut d = vec![0u8];
        d.extend_from_slice(t.as_bytes());
        out.push((format!("text-{i}"), d));
    }
    let mut ids = vec![1u8];
    for id in [1u16, 28, 4, 49151, 49152, 65535, 0, 2] {
        ids.extend_from_slice(&id.to_le_bytes());
    }
    out.push(("ids".into(), ids));
    let mut bytes = vec![2u8];
    bytes.extend_from_slice("ok é 日 🎉".as_bytes());
    bytes.extend_from_slice(&[0xff, 0xe6, 0x97, b'x', 0xf0, 0x9f]);
    out.push(("bytes".into(), bytes));
    out
}

fn template() -> Vec<(String, Vec<u8>)> {
    let sources = [
        folio::tokenizer::CHATML,
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]{% elif m.role == 'system' %}{{ raise_exception('no system') }}{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}",
        "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}{{ m['content'].split(' ') | join(',') }}{{ m.role.upper() }}{% endfor %}{{ messages | tojson(ensure_ascii=true, separators=(',', ':'), sort_keys=true) }}",
    ];
    let mut out = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        let mut d = vec![0u8];
        d.extend_from_slice(s.as_bytes());
        out.push((format!("source-{i}"), d));
    }
    let convo = "system\0You are helpful.\0user\0Hello\0assistant\0Hi!\0user\0Bye";
    for mode in [1u8, 3, 9, 11] {
        let mut d = vec![mode];
        d.extend_from_slice(convo.as_bytes());
        out.push((format!("messages-{mode}"), d));
    }
    let mut d = vec![13u8];
    d.extend_from_slice(b"user\0What is the weather?\0");
    d.extend_from_slice(
        br#"[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#,
    );
    out.push(("messages-tools".into(), d));
    out
}

/// Snapshot files as the target's pool writes them (less the checksum, which the
/// target appends): written by hand from the documented format, then checked to
/// restore.
fn snapshots() -> Vec<(String, Vec<u8>)> {
    let mut kv = snapshot::pool();
    let halves = kv.storage().slot_halves();
    let page = kv.page_size();
    let mut out = Vec::new();
    for n in [0usize, 3, 9] {
        let mut b = Vec::new();
        b.extend_from_slice(b"FOLIOSNP");
        b.extend_from_slice(&1u32.to_le_bytes());
        let mut fp = snapshot::FINGERPRINT.to_vec();
        fp.resize(16, 0);
        b.extend_from_slice(&fp);
        b.extend_from_slice(&(page as u32).to_le_bytes());
        b.extend_from_slice(&(halves as u32).to_le_bytes());
        b.extend_from_slice(&(n as u64).to_le_bytes());
        for t in 0..n as u32 {
            b.extend_from_slice(&(t * 7 + 1).to_le_bytes());
        }
        for i in 0..n * halves {
            b.extend_from_slice(&(0x3c00u16 + i as u16).to_le_bytes());
        }
        check_restores(&b);
        out.push((format!("tokens-{n}"), b));
    }
    out
}

fn check_restores(body: &[u8]) {
    let dir = folio_fuzz::fixtures::scratch("seeds");
    let mut file = body.to_vec();
    file.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(body).to_le_bytes());
    std::fs::write(Path::new(&dir).join("seed.snap"), file).expect("a seed file");
    let (names, skipped) = snapshot::pool()
        .open_snapshot_dir(&dir)
        .expect("the seed's directory");
    assert!(
        names == ["seed"] && skipped.is_empty(),
        "the seed restores: {skipped:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn http() -> Vec<(String, Vec<u8>)> {
    use folio_server::fuzzing::BodyRoute;
    let bodies: [(BodyRoute, &str); 45] = [
        (
            BodyRoute::Completions,
            r#"{"prompt":"Once upon a time","max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"stop":["\n","."],"seed":42,"n":2,"logprobs":2,"echo":true,"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
        (
            BodyRoute::Completions,
            r#"{"prompt":[[1,2,3],[4,5]],"max_tokens":0,"echo":true,"logprobs":1,"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":0.5,"cache_salt":"abc","ignore_eos":true}"#,
        ),
        (
            BodyRoute::Completions,
            r#"{"prompt":["a","b"],"guided_regex":"[a-z]{1,5}","max_tokens":4}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_completion_tokens":16,"logprobs":true,"top_logprobs":3}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"type":"string"}}},"required":["a"]}}}}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"tool_choice":"required","parallel_tool_calls":false}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"user","content":"pick"}],"guided_choice":["yes","no"]}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"user","content":"j"}],"response_format":{"type":"json_object"},"stop":"x","n":3}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"user","content":"g"}],"guided_grammar":"root ::= \"a\" | \"b\""}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[{"role":"user","content":"w"}],"tools":[{"type":"function","function":{"name":"f","description":"d"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}"#,
        ),
        (
            BodyRoute::ContextCreate,
            r#"{"cache_salt":"s","system":"You are a cat."}"#,
        ),
        (
            BodyRoute::ContextAppend,
            r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}]}"#,
        ),
        (BodyRoute::ContextAppend, r#"{"tokens":[1,2,3]}"#),
        (BodyRoute::ContextTruncate, r#"{"tokens":5}"#),
        (
            BodyRoute::ContextGenerate,
            r#"{"prompt":"go on","chat":false,"max_tokens":3,"n":1,"json_schema":{"type":"string","maxLength":4}}"#,
        ),
        (
            BodyRoute::SnapshotSave,
            r#"{"context":"ctx-1","name":"agent-1"}"#,
        ),
        // Every body route, valid and near-valid (a wrong type, a missing or extra
        // field, a bad value), so the fuzzer starts at each route's checks.
        (
            BodyRoute::Tokenize,
            r#"{"content":"Hello world","with_pieces":true}"#,
        ),
        (
            BodyRoute::Tokenize,
            r#"{"prompt":"<|im_start|>x","add_special":false}"#,
        ),
        (
            BodyRoute::Tokenize,
            r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}],"with_pieces":true}"#,
        ),
        (
            BodyRoute::Tokenize,
            r#"{"content":"a","messages":[{"role":"user","content":"b"}]}"#,
        ),
        (BodyRoute::Tokenize, r#"{"messages":[{"role":7}]}"#),
        (BodyRoute::Detokenize, r#"{"tokens":[1,2,3,49151]}"#),
        (BodyRoute::Detokenize, r#"{"tokens":[49152]}"#),
        (BodyRoute::Detokenize, r#"{"tokens":[-1,4294967296]}"#),
        (BodyRoute::Detokenize, r#"{"tokens":"abc"}"#),
        (
            BodyRoute::SnapshotSave,
            r#"{"context":"ctx-1","name":"../etc/x"}"#,
        ),
        (BodyRoute::SnapshotSave, r#"{"context":"ctx-1","name":""}"#),
        (BodyRoute::ContextCreate, " \n"),
        (BodyRoute::ContextCreate, r#"{"cache_salt":5}"#),
        (
            BodyRoute::ContextAppend,
            r#"{"text":"Once upon a time<|im_end|>"}"#,
        ),
        (BodyRoute::ContextAppend, r#"{"text":"a","tokens":[1]}"#),
        (
            BodyRoute::ContextAppend,
            r#"{"messages":[{"role":"tool","content":"x"}]}"#,
        ),
        (BodyRoute::ContextTruncate, r#"{"tokens":-1}"#),
        (
            BodyRoute::ContextGenerate,
            r#"{"chat":true,"max_tokens":99999,"stop":["a",1]}"#,
        ),
        (
            BodyRoute::Completions,
            r#"{"prompt":[],"max_tokens":-3,"n":0,"temperature":"hot"}"#,
        ),
        (
            BodyRoute::Chat,
            r#"{"messages":[],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"nope"}}}}"#,
        ),
        (
            BodyRoute::Messages,
            r#"{"max_tokens":8,"system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}}"#,
        ),
        (
            BodyRoute::Messages,
            r#"{"max_tokens":8,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}"#,
        ),
        (
            BodyRoute::Messages,
            r#"{"messages":[{"role":"user","content":[{"type":"image"}]}]}"#,
        ),
        (
            BodyRoute::Responses,
            r#"{"input":"Hi","instructions":"Be brief.","max_output_tokens":8,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}"#,
        ),
        (
            BodyRoute::Responses,
            r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"w?"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}],"tools":[{"type":"function","name":"f"}],"tool_choice":"required"}"#,
        ),
        (
            BodyRoute::Responses,
            r#"{"input":[{"type":"reasoning"}],"truncation":"auto"}"#,
        ),
        (
            BodyRoute::Embeddings,
            r#"{"input":["one","two words"],"model":"m","encoding_format":"base64","pooling":"last","normalize":false,"dimensions":576}"#,
        ),
        (
            BodyRoute::Embeddings,
            r#"{"input":[[1,2,3],[4]],"pooling":"cls","user":"u"}"#,
        ),
        (
            BodyRoute::Embeddings,
            r#"{"input":["",[1]],"dimensions":-1,"encoding_format":"int8"}"#,
        ),
    ];
    bodies
        .iter()
        .enumerate()
        .map(|(i, (route, body))| {
            let pick = BodyRoute::ALL
                .iter()
                .position(|r| r == route)
                .expect("a route") as u8;
            let mut d = vec![pick];
            d.extend_from_slice(body.as_bytes());
            (format!("{i:02}-{route:?}").to_lowercase(), d)
        })
        .collect()
}
