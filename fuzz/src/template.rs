//! The chat template target. The first byte picks what the rest is:
//! - even: template source (lossy UTF-8), compiled (which renders a probe
//!   conversation) and rendered on one message;
//! - odd: messages, fields separated by NUL bytes (role, content, role, ...), rendered
//!   with the default model's template (bit 1 clear) or ChatML (set), with the
//!   generation prompt when bit 3 is set; with bit 2 set the last field is parsed as
//!   JSON and passed as the tools.

use crate::fixtures;
use folio::tokenizer::{ChatTemplate, Message, CHATML};
use std::sync::OnceLock;

fn chatml() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| ChatTemplate::new(CHATML, "<s>", "</s>").expect("ChatML compiles"))
}

pub fn warm_up() {
    fixtures::template();
    chatml();
}

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let source = String::from_utf8_lossy(rest);
        if let Ok(t) = ChatTemplate::new(&source, "<s>", "</s>") {
            let _ = t.render(&[Message::new("user", "Hi")], true);
        }
        return;
    }
    let mut fields: Vec<String> = rest
        .split(|&b| b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let tools = if mode & 4 != 0 {
        fields
            .pop()
            .and_then(|f| serde_json::from_str::<serde_json::Value>(&f).ok())
    } else {
        None
    };
    let messages: Vec<Message> = fields
        .chunks(2)
        .map(|c| Message::new(&c[0], c.get(1).map_or("", String::as_str)))
        .collect();
    let t = if mode & 2 == 0 {
        fixtures::template()
    } else {
        chatml()
    };
    let _ = t.render_with_tools(&messages, mode & 8 != 0, tools.as_ref());
}
