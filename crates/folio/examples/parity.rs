//! folio's tokenizer and chat template as a filter, for differential testing
//! (`scripts/parity/`): one JSON request per line on stdin, one JSON answer per line on
//! stdout, in order. No server, no weights: only the GGUF's tokenizer metadata is read.
//!
//! `cargo run --release -p folio --example parity [MODEL.gguf] < requests.jsonl`
//!
//! Requests (`op`):
//! - `encode` `{text, add_special, parse_special}` → `{ids}`: with `parse_special`
//!   special-token text becomes the token ([`Tokenizer::encode`]), without it stays text
//!   ([`Tokenizer::encode_literal`]).
//! - `decode` `{ids}` → `{pieces, bytes, text, special_text, stream}`: each token's
//!   bytes and all of them (hex), [`Tokenizer::decode`], [`Tokenizer::decode_special`],
//!   and the text pieces a streamed answer shows, token by token, from the
//!   [`StreamDecoder`] the engine streams with (one piece per token, then the final
//!   flush: no stop strings, so nothing else is held back).
//! - `render` `{messages: [{role, content, ...}], add_generation_prompt, tools?, template?,
//!   bos_token?, eos_token?, now?}` (`now`: `strftime_now`'s time, with `template`)
//!   → `{text}` or `{error}`: the model's chat template, or `template` (source) if given.
//! - `info` → `{vocab, bos, eos, adds_bos, template}`.
//!
//! A malformed request is answered `{error}`; the filter goes on.

use folio::gguf::Gguf;
use folio::tokenizer::{ChatTemplate, Message, StreamDecoder, Tokenizer};
use serde_json::{json, Value};
use std::io::{BufRead, BufWriter, Write};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn flag(req: &Value, key: &str) -> bool {
    req.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// The request's token ids (each must fit folio's `u32`; any value is a valid request).
fn ids(req: &Value) -> Result<Vec<u32>, String> {
    req.get("ids")
        .and_then(Value::as_array)
        .ok_or("ids is missing")?
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| format!("{v} is not a token id"))
        })
        .collect()
}

fn answer(tok: &Tokenizer, model_template: &Option<ChatTemplate>, req: &Value) -> Value {
    let result = match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "encode" => {
            let text = req.get("text").and_then(Value::as_str).unwrap_or("");
            let add = flag(req, "add_special");
            let ids = if flag(req, "parse_special") {
                tok.encode(text, add)
            } else {
                tok.encode_literal(text, add)
            };
            Ok(json!({ "ids": ids }))
        }
        "decode" => ids(req).map(|ids| {
            let pieces: Vec<Vec<u8>> = ids.iter().map(|&i| tok.token_bytes(i)).collect();
            let mut d = StreamDecoder::default();
            let mut stream: Vec<String> = ids.iter().map(|&i| d.push(tok, i)).collect();
            stream.push(d.finish());
            json!({
                "pieces": pieces.iter().map(|p| hex(p)).collect::<Vec<_>>(),
                "bytes": hex(&pieces.concat()),
                "text": tok.decode(&ids),
                "special_text": tok.decode_special(&ids),
                "stream": stream,
            })
        }),
        "render" => render(tok, model_template, req),
        "info" => Ok(json!({
            "vocab": tok.vocab_size(),
            "bos": tok.bos,
            "eos": tok.eos,
            "adds_bos": tok.adds_bos(),
            "template": model_template.is_some(),
        })),
        other => Err(format!("unknown op {other:?}")),
    };
    result.unwrap_or_else(|e| json!({ "error": e }))
}

fn render(
    tok: &Tokenizer,
    model_template: &Option<ChatTemplate>,
    req: &Value,
) -> Result<Value, String> {
    let messages: Vec<Message> = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages is missing")?
        .iter()
        .map(|m| {
            let field = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("");
            let mut msg = Message::new(field("role"), field("content"));
            for (k, v) in m.as_object().into_iter().flatten() {
                msg = msg.with(k, v.clone());
            }
            msg
        })
        .collect();
    let own;
    let template = match req.get("template").and_then(Value::as_str) {
        Some(source) => {
            let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("");
            let given = |k: &str, id| req.get(k).and_then(Value::as_str).unwrap_or(text(id));
            let mut t = ChatTemplate::new(
                source,
                given("bos_token", tok.bos),
                given("eos_token", tok.eos),
            )
            .map_err(|e| e.to_string())?;
            if let Some(now) = req.get("now").and_then(Value::as_i64) {
                t = t.with_now(now);
            }
            own = t;
            &own
        }
        None => model_template
            .as_ref()
            .ok_or("the model has no usable template")?,
    };
    let tools = req.get("tools").filter(|t| !t.is_null());
    template
        .render_with_tools(&messages, flag(req, "add_generation_prompt"), tools)
        .map(|text| json!({ "text": text }))
        .map_err(|e| e.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let tok = Tokenizer::from_gguf(&Gguf::open(path.as_ref())?)?;
    let model_template = match tok.chat_template() {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("the chat template does not compile: {e}");
            None
        }
    };
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::new(std::io::stdout().lock());
    for line in stdin.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => answer(&tok, &model_template, &req),
            Err(e) => json!({ "error": format!("bad request: {e}") }),
        };
        serde_json::to_writer(&mut out, &reply)?;
        out.write_all(b"\n")?;
        // Answer each line at once: the harness may wait for it before sending more.
        out.flush()?;
    }
    Ok(())
}
