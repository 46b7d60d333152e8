//! The tokenizer target, on the default model's tokenizer. The first byte picks what
//! the rest is:
//! - text (lossy UTF-8): encoded with and without specials parsed; properties: every
//!   id is in the vocabulary, and `decode_special` gives the text back, less the bytes
//!   the vocabulary has no token for (SmolLM2's lacks some control characters; they
//!   are dropped, as llama.cpp drops them);
//! - token ids (u16 each, little-endian, so some are outside the vocabulary): decoded
//!   whole and streamed;
//! - raw bytes, each as its byte token (bytes the vocabulary lacks left out):
//!   streamed; property: the text is the bytes, lossily decoded.
//!
//! Streaming property everywhere: the pieces of [`StreamDecoder`] add up to
//! [`Tokenizer::decode`] of the same ids.

use crate::fixtures::tokenizer;
use folio::tokenizer::{byte_to_char, StreamDecoder, Tokenizer};

pub fn warm_up() {
    tokenizer();
}

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tok = tokenizer();
    match mode % 3 {
        0 => text(tok, rest),
        1 => ids(tok, rest),
        _ => bytes(tok, rest),
    }
}

fn text(tok: &Tokenizer, rest: &[u8]) {
    let text = String::from_utf8_lossy(rest);
    let ids = tok
        .try_encode(&text, true)
        .expect("the input is under the cap");
    let vocab = tok.vocab_size();
    assert!(
        ids.iter().all(|&i| (i as usize) < vocab),
        "ids in the vocab"
    );
    // A byte the vocabulary has no token for is dropped (as llama.cpp drops it).
    let expected = String::from_utf8_lossy(&byte_tokens(tok, text.as_bytes()).0).into_owned();
    let plain = tok.encode(&text, false);
    assert_eq!(
        tok.decode_special(&plain),
        expected,
        "decode_special(encode(text))"
    );
    let literal = tok.encode_literal(&text, false);
    assert_eq!(
        tok.decode_special(&literal),
        expected,
        "decode_special(encode_literal(text))"
    );
    streamed(tok, &plain);
}

/// The bytes of `bytes` that have a byte token, in order, and those tokens' ids.
fn byte_tokens(tok: &Tokenizer, bytes: &[u8]) -> (Vec<u8>, Vec<u32>) {
    let chars = byte_to_char();
    bytes
        .iter()
        .filter_map(|&b| Some((b, tok.token_id(&chars[b as usize].to_string())?)))
        .unzip()
}

fn ids(tok: &Tokenizer, rest: &[u8]) {
    let ids: Vec<u32> = rest
        .chunks(2)
        .map(|c| u32::from(c[0]) | u32::from(*c.get(1).unwrap_or(&0)) << 8)
        .collect();
    let _ = tok.decode_special(&ids);
    streamed(tok, &ids);
}

fn bytes(tok: &Tokenizer, rest: &[u8]) {
    let (kept, ids) = byte_tokens(tok, rest);
    assert_eq!(streamed(tok, &ids), String::from_utf8_lossy(&kept));
}

/// The stream decoder's pieces, checked against the whole decode; returns the text.
fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut d = StreamDecoder::default();
    let mut out = String::new();
    for &id in ids {
        out.push_str(&d.push(tok, id));
    }
    out.push_str(&d.finish());
    assert_eq!(out, tok.decode(ids), "streamed pieces add up to decode");
    out
}
