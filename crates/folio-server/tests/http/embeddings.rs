//! `POST /v1/embeddings` and its alias `/embeddings`: OpenAI's answer shape, vectors
//! that are the float64 pooling of the engine's own token states (within float32
//! rounding), base64 that decodes to the floats, inputs answered in order, and every
//! user mistake a 400 naming its field.

use crate::client::post;
use crate::server::{engine, small_engine, start, start_with, Server};
use folio::{Engine, Pooling};
use folio_server::ServeConfig;
use serde_json::{json, Value};
use std::time::Duration;

const TEXT: &str = "Paged attention keeps every sequence's keys and values in fixed-size pages.";

/// A server on its own engine, and a handle to that engine for the test's own calls.
fn server() -> (Server, Engine) {
    let e = engine(small_engine());
    let e2 = e.clone();
    let (s, ready) = start_with(ServeConfig::default(), move || Ok(e2));
    ready
        .recv_timeout(Duration::from_secs(60))
        .expect("the server became ready");
    (s, e)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("an array of floats: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn vectors(answer: &Value) -> Vec<Vec<f32>> {
    answer["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], json!(i));
            floats(&d["embedding"])
        })
        .collect()
}

fn embed(s: &Server, body: Value) -> Value {
    let r = post(s.addr, "/v1/embeddings", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Standard base64 (with padding) decoded.
fn unbase64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for q in s.as_bytes().chunks(4) {
        let pad = q.iter().filter(|&&c| c == b'=').count();
        let n = q
            .iter()
            .map(|&c| if c == b'=' { 0 } else { val(c) as u32 })
            .fold(0u32, |n, v| (n << 6) | v);
        out.extend(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

/// The float64 pooling of `states`.
fn pool_f64(states: &[Vec<f32>], how: Pooling, normalize: bool) -> Vec<f64> {
    let dim = states[0].len();
    let mut v: Vec<f64> = match how {
        Pooling::Mean => (0..dim)
            .map(|j| states.iter().map(|s| s[j] as f64).sum::<f64>() / states.len() as f64)
            .collect(),
        Pooling::Last => states[states.len() - 1].iter().map(|&x| x as f64).collect(),
        Pooling::Cls => states[0].iter().map(|&x| x as f64).collect(),
    };
    if normalize {
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Within float32 rounding: one float32 ulp (relative 2^-23) of each value, and the
/// smallest normal float32 near zero.
fn assert_within_f32_rounding(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (j, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = w.abs() * f32::EPSILON as f64 + f32::MIN_POSITIVE as f64;
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}: value {j} is {g}, float64 pooling {w}"
        );
    }
}

#[test]
fn embeddings_have_openais_shape_and_pool_the_engines_states() {
    let (s, e) = server();
    let dim = e.model().config.dim;
    let toks = e.model().tokenizer.encode(TEXT, true);
    let states = e.embed(toks.clone()).unwrap();
    let a = embed(
        &s,
        json!({"input": TEXT, "model": "anything", "user": "u1"}),
    );
    assert_eq!(a["object"], "list");
    assert_eq!(a["model"], "folio");
    assert_eq!(a["usage"]["prompt_tokens"], json!(toks.len()));
    assert_eq!(a["usage"]["total_tokens"], json!(toks.len()));
    let v = vectors(&a);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].len(), dim);
    let norm: f64 = v[0].iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-6, "unit norm by default: {norm}");
    assert_within_f32_rounding(&v[0], &pool_f64(&states, Pooling::Mean, true), "mean");
    for (name, how) in [("mean", Pooling::Mean), ("last", Pooling::Last)] {
        for normalize in [false, true] {
            let body = json!({"input": TEXT, "pooling": name, "normalize": normalize,
                              "dimensions": dim, "encoding_format": "float"});
            let v = vectors(&embed(&s, body));
            let what = format!("{name}, normalize {normalize}");
            assert_within_f32_rounding(&v[0], &pool_f64(&states, how, normalize), &what);
        }
    }
}

#[test]
fn base64_decodes_to_the_float_answer() {
    let (s, _e) = server();
    for input in [json!(TEXT), json!(["one", "two words"])] {
        let f = vectors(&embed(&s, json!({"input": input})));
        let b = embed(&s, json!({"input": input, "encoding_format": "base64"}));
        let data = b["data"].as_array().unwrap();
        assert_eq!(data.len(), f.len());
        for (d, want) in data.iter().zip(&f) {
            let bytes = unbase64(d["embedding"].as_str().expect("a base64 string"));
            let got: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(&got, want);
        }
    }
}

#[test]
fn a_batch_answers_each_input_in_order_as_alone() {
    let (s, e) = server();
    let texts = [
        "first, a short one",
        TEXT,
        "third",
        "the fourth input, a little longer",
    ];
    let batch = vectors(&embed(&s, json!({"input": texts})));
    assert_eq!(batch.len(), texts.len());
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| e.model().tokenizer.encode(t, true))
        .collect();
    for (i, t) in texts.iter().enumerate() {
        let alone = vectors(&embed(&s, json!({"input": t})));
        assert_eq!(alone[0], batch[i], "input {i}");
        // Its token ids, alone and as a list of lists, are the same input.
        let by_ids = vectors(&embed(&s, json!({"input": ids[i]})));
        assert_eq!(by_ids[0], batch[i], "input {i} as ids");
    }
    let lists = vectors(&embed(&s, json!({"input": ids})));
    assert_eq!(lists, batch);
    let a = embed(&s, json!({"input": texts}));
    let total: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(a["usage"]["prompt_tokens"], json!(total));
    // llama.cpp's alias answers the same.
    let r = post(s.addr, "/embeddings", &json!({"input": texts}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(vectors(&r.json()), batch);
}

#[test]
fn bad_embedding_requests_are_400s_naming_the_field() {
    let s = start(ServeConfig::default(), small_engine());
    let bad = |body: Value, param: &str| {
        for path in ["/v1/embeddings", "/embeddings"] {
            let e = post(s.addr, path, &body).error(400);
            assert_eq!(e["param"], param, "{body}: {e}");
        }
    };
    bad(json!({}), "input");
    bad(json!({"input": ""}), "input");
    bad(json!({"input": []}), "input");
    bad(json!({"input": [[]]}), "input");
    bad(json!({"input": ["fine", ""]}), "input");
    bad(json!({"input": 5}), "input");
    bad(json!({"input": [1.5]}), "input");
    bad(json!({"input": [-1]}), "input");
    bad(json!({"input": {"text": "x"}}), "input");
    bad(json!({"input": [[1, 2], "x"]}), "input");
    bad(json!({"input": [49152]}), "input");
    bad(json!({"input": "x", "pooling": "max"}), "pooling");
    bad(json!({"input": "x", "pooling": 1}), "pooling");
    bad(json!({"input": "x", "dimensions": 100}), "dimensions");
    bad(json!({"input": "x", "dimensions": "576"}), "dimensions");
    bad(
        json!({"input": "x", "encoding_format": "int8"}),
        "encoding_format",
    );
    bad(json!({"input": "x", "normalize": "yes"}), "normalize");
    bad(json!({"input": "x", "model": 3}), "model");
    let too_many: Vec<&str> = vec!["a"; 2049];
    bad(json!({ "input": too_many }), "input");
    // Longer than the window (1024 tokens here).
    let e = post(
        s.addr,
        "/v1/embeddings",
        &json!({"input": vec![1u32; 1100]}),
    )
    .error(400);
    assert_eq!(e["param"], "input");
    assert_eq!(e["code"], "context_length_exceeded");
    // More tokens in all than one request takes, each within the window.
    let lists = vec![vec![1u32; 1000]; 66];
    bad(json!({ "input": lists }), "input");
    // This model's tokenizer puts no BOS first (add_bos_token is false): no CLS
    // token to pool, for text or ids.
    bad(json!({"input": "x", "pooling": "cls"}), "pooling");
    bad(json!({"input": [1, 2], "pooling": "cls"}), "pooling");
    // And after all that, a good request is answered.
    let r = post(s.addr, "/v1/embeddings", &json!({"input": "x"}));
    assert_eq!(r.status, 200, "{}", r.text());
}
