//! The model families' chat templates (the publishers' own, copied from llama.cpp's
//! `models/templates/` into `fixtures/templates/`) load, and render as Python's jinja2
//! renders them for transformers: `fixtures/family_templates.json` holds jinja2's text
//! (or its refusal) for conversations with system, user, assistant and tool messages,
//! tool calls and `tools`, made by `scripts/parity/family_templates.py --write-fixture`
//! with `strftime_now` pinned to the fixture's `now`.

use crate::common;

use folio::tokenizer::{ChatTemplate, Message};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn template_source(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/templates")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn message(m: &Value) -> Message {
    let text = |k: &str| m[k].as_str().unwrap_or("");
    let mut msg = Message::new(text("role"), text("content"));
    for (k, v) in m.as_object().unwrap() {
        msg = msg.with(k, v.clone());
    }
    msg
}

#[test]
fn each_familys_template_renders_as_jinja2_does_on_every_fixture() {
    let fixture = common::fixtures("family_templates.json");
    let now = fixture["now"].as_i64().unwrap();
    let mut templates: BTreeMap<String, ChatTemplate> = BTreeMap::new();
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let template = templates.entry(name.to_string()).or_insert_with(|| {
            ChatTemplate::new(
                &template_source(name),
                case["bos_token"].as_str().unwrap(),
                case["eos_token"].as_str().unwrap(),
            )
            .unwrap_or_else(|e| panic!("{name} loads: {e}"))
            .with_now(now)
        });
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message)
            .collect();
        let tools = case.get("tools").filter(|v| !v.is_null());
        let got = template.render_with_tools(
            &messages,
            case["add_generation_prompt"].as_bool().unwrap(),
            tools,
        );
        let count = counts.entry(name.to_string()).or_default();
        count.0 += 1;
        match (case["text"].as_str(), got) {
            (Some(want), Ok(got)) if got == want => {}
            (None, Err(_)) => count.1 += 1,
            (want, got) => failures.push(format!(
                "{name} on {messages:?} (tools {tools:?}):\n  jinja2 {want:?} {}\n  folio  {got:?}",
                case["error"]
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every family, each with conversations it renders (not only refusals).
    assert_eq!(counts.len(), 10, "{counts:?}");
    for (name, (n, refused)) in &counts {
        assert!(
            *n >= 10 && refused < n,
            "{name}: {n} cases, {refused} refused"
        );
    }
}

#[test]
fn each_familys_template_loads_with_the_probe_render() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        if let Err(e) = ChatTemplate::new(&source, "<s>", "</s>") {
            panic!("{}: {e}", path.display());
        }
        n += 1;
    }
    assert_eq!(n, 10);
}
