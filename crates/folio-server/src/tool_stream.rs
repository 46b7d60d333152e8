//! Tool calls as they stream: what a growing output has revealed so far. A `required`
//! output is grammar-constrained JSON (`{"name", "arguments"}` or a list of them) that
//! [`CallStream`] follows; an `auto` output is the model's free text, where
//! [`AutoStream`] passes content through and follows each Hermes-style
//! `<tool_call>…</tool_call>` block with a `CallStream`. Either way each call's name
//! goes out once it is whole, then its arguments as they are generated.

/// What the streamed output of a `required` call has revealed.
#[derive(Debug, Clone, PartialEq)]
pub enum Reveal {
    /// Call `k` has begun: its name is whole.
    Begin { k: usize, name: String },
    /// More of call `k`'s arguments, as raw JSON text.
    Args { k: usize, text: String },
}

/// Follows the grammar-constrained JSON of `required` calls (`{"name", "arguments"}`,
/// or a list of them) as it streams, so each call's name goes out once it is whole and
/// its arguments as they are generated. The grammar guarantees the shape; this only
/// tracks strings and nesting.
#[derive(Debug, Default)]
pub struct CallStream {
    /// Nesting depth of objects and arrays outside the arguments.
    depth: usize,
    /// The depth inside a call object (1 for one call, 2 in a list); 0 until known.
    call_depth: usize,
    calls: usize,
    /// A string at call level (a key or the name) being read, raw.
    string: Option<String>,
    escape: bool,
    /// The last key read at call level.
    key: String,
    /// Inside the arguments value: its own depth, and whether in a string there.
    args: Option<(usize, bool)>,
    /// After `"arguments":`, waiting for the value's first character.
    args_next: bool,
}

impl CallStream {
    /// Feeds more output; returns what it reveals, in order.
    pub fn push(&mut self, text: &str) -> Vec<Reveal> {
        let mut out: Vec<Reveal> = Vec::new();
        let mut args = String::new();
        for ch in text.chars() {
            if let Some((depth, in_str)) = self.args.as_mut() {
                let ends = match (*in_str, ch) {
                    (true, _) if self.escape => {
                        self.escape = false;
                        false
                    }
                    (true, '\\') => {
                        self.escape = true;
                        false
                    }
                    (true, '"') => {
                        *in_str = false;
                        *depth == 0
                    }
                    (true, _) => false,
                    (false, '"') => {
                        *in_str = true;
                        false
                    }
                    (false, '{' | '[') => {
                        *depth += 1;
                        false
                    }
                    (false, '}' | ']') if *depth == 0 => {
                        // A bare value ends where its call object does.
                        self.args = None;
                        Self::flush(&mut out, self.calls, &mut args);
                        self.close();
                        continue;
                    }
                    (false, '}' | ']') => {
                        *depth -= 1;
                        *depth == 0
                    }
                    (false, ',') if *depth == 0 => {
                        self.args = None;
                        Self::flush(&mut out, self.calls, &mut args);
                        continue;
                    }
                    _ => false,
                };
                args.push(ch);
                if ends {
                    self.args = None;
                    Self::flush(&mut out, self.calls, &mut args);
                }
                continue;
            }
            if let Some(raw) = self.string.as_mut() {
                raw.push(ch);
                if self.escape {
                    self.escape = false;
                } else if ch == '\\' {
                    self.escape = true;
                } else if ch == '"' {
                    let raw = self.string.take().unwrap_or_default();
                    let value: String = serde_json::from_str(&raw).unwrap_or_default();
                    if self.key == "name" {
                        out.push(Reveal::Begin {
                            k: self.calls,
                            name: value,
                        });
                        self.key.clear();
                    } else {
                        self.key = value;
                    }
                }
                continue;
            }
            if self.args_next && !ch.is_whitespace() {
                self.args_next = false;
                self.args = Some((0, false));
                // Re-read this character as the value's first.
                out.extend(self.push(&ch.to_string()));
                continue;
            }
            match ch {
                '{' | '[' => {
                    self.depth += 1;
                    if self.call_depth == 0 {
                        self.call_depth = if ch == '[' { 2 } else { 1 };
                    }
                }
                '}' | ']' => self.close(),
                '"' if self.depth == self.call_depth => self.string = Some("\"".into()),
                ':' if self.depth == self.call_depth && self.key == "arguments" => {
                    self.args_next = true;
                    self.key.clear();
                }
                _ => {}
            }
        }
        Self::flush(&mut out, self.calls, &mut args);
        out
    }

    /// A `}` or `]` outside the arguments: a call object ends at call level.
    fn close(&mut self) {
        if self.depth == self.call_depth {
            self.calls += 1;
        }
        self.depth = self.depth.saturating_sub(1);
    }

    fn flush(out: &mut Vec<Reveal>, k: usize, args: &mut String) {
        if !args.is_empty() {
            out.push(Reveal::Args {
                k,
                text: std::mem::take(args),
            });
        }
    }
}

/// What an `auto` output's next piece reveals.
#[derive(Debug, Clone, PartialEq)]
pub enum AutoPiece {
    /// Plain text for the answer's `content`.
    Content(String),
    /// Something of a call (`k` counts calls across the whole output).
    Call(Reveal),
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Follows an `auto` output: text outside `<tool_call>` blocks is content, streamed at
/// once except a trailing piece that may begin a tag; each block is read by a
/// [`CallStream`]. Once a call has begun, whitespace-only content between calls is
/// dropped (the whole-output parse trims it too).
#[derive(Debug, Default)]
pub struct AutoStream {
    /// Text not yet passed on: a possible beginning of a tag.
    pending: String,
    /// The block being read: its reader, whether its call has revealed its name yet,
    /// and its raw text (content after all, if it holds no call).
    block: Option<(CallStream, bool, String)>,
    /// Argument pieces that came before their call's name (`arguments` first).
    early: Vec<String>,
    /// Calls begun so far.
    begun: usize,
}

impl AutoStream {
    /// Feeds more output; returns what it reveals, in order.
    pub fn push(&mut self, text: &str) -> Vec<AutoPiece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            let tag = if self.block.is_some() { CLOSE } else { OPEN };
            let (now, found) = match self.pending.find(tag) {
                Some(i) => (i, true),
                None => (self.pending.len() - partial_tag(&self.pending, tag), false),
            };
            let piece: String = self.pending.drain(..now).collect();
            self.pass(&piece, &mut out);
            if !found {
                return out;
            }
            self.pending.drain(..tag.len());
            if self.block.is_some() {
                self.end_block(true, &mut out);
            } else {
                self.block = Some((CallStream::default(), false, String::new()));
            }
        }
    }

    /// The output ended: what was held goes out (an unclosed block ends here).
    pub fn finish(&mut self) -> Vec<AutoPiece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        self.pass(&rest, &mut out);
        if self.block.is_some() {
            self.end_block(false, &mut out);
        }
        out
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.begun
    }

    fn pass(&mut self, text: &str, out: &mut Vec<AutoPiece>) {
        if text.is_empty() {
            return;
        }
        let Some((stream, named, raw)) = self.block.as_mut() else {
            if self.begun == 0 || !text.trim().is_empty() {
                out.push(AutoPiece::Content(text.to_string()));
            }
            return;
        };
        raw.push_str(text);
        for r in stream.push(text) {
            match r {
                Reveal::Begin { name, .. } if !*named => {
                    *named = true;
                    out.push(AutoPiece::Call(Reveal::Begin {
                        k: self.begun,
                        name,
                    }));
                    self.begun += 1;
                    for text in self.early.drain(..) {
                        out.push(AutoPiece::Call(Reveal::Args {
                            k: self.begun - 1,
                            text,
                        }));
                    }
                }
                Reveal::Args { text, .. } if *named => out.push(AutoPiece::Call(Reveal::Args {
                    k: self.begun - 1,
                    text,
                })),
                Reveal::Args { text, .. } => self.early.push(text),
                // A second call in one block: not Hermes' shape; ignored.
                Reveal::Begin { .. } => {}
            }
        }
    }

    /// The block ends (`closed`: at its closing tag, else at the end of the output). A
    /// block whose call never revealed a name was the model's text after all.
    fn end_block(&mut self, closed: bool, out: &mut Vec<AutoPiece>) {
        let Some((_, named, raw)) = self.block.take() else {
            return;
        };
        if !named {
            self.early.clear();
            let close = if closed { CLOSE } else { "" };
            out.push(AutoPiece::Content(format!("{OPEN}{raw}{close}")));
        }
    }
}

/// Bytes at the end of `s` that could begin `tag` (0 when none).
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tests::tools;
    use crate::tools::{extract, Call, Mode};
    use serde_json::{json, Value};

    /// Streamed in pieces of any size, the calls' names and arguments add up to what
    /// `extract` finds in the whole output.
    #[test]
    fn required_calls_stream_as_they_are_generated() {
        let t = tools(Mode::Required { parallel: true });
        for text in [
            r#"{"name":"get_weather","arguments":{"city":"Pa\"ris}","n":[1,{"a":2}]}}"#,
            r#"[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_weather","arguments":{}}]"#,
            r#"{"name": "get_weather", "arguments": 42}"#,
            r#"[ {"arguments": "x,}", "name": "get_weather"} ]"#,
        ] {
            let (want, _) = extract(&t, text).unwrap();
            for size in [1, 2, 3, 7, 1000] {
                let mut s = CallStream::default();
                let chars: Vec<char> = text.chars().collect();
                let mut got: Vec<Call> = Vec::new();
                let mut args: Vec<String> = Vec::new();
                for piece in chars.chunks(size) {
                    for r in s.push(&piece.iter().collect::<String>()) {
                        match r {
                            Reveal::Begin { k, name } => {
                                assert_eq!(k, got.len(), "{text}");
                                got.push(Call {
                                    name,
                                    arguments: String::new(),
                                });
                            }
                            Reveal::Args { k, text } => {
                                args.resize(args.len().max(k + 1), String::new());
                                args[k].push_str(&text);
                            }
                        }
                    }
                }
                assert_eq!(got.len(), want.len(), "{text} in pieces of {size}");
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.name, w.name);
                    let a: Value = serde_json::from_str(&args[k]).unwrap();
                    let b: Value = serde_json::from_str(&w.arguments).unwrap_or(json!(w.arguments));
                    assert_eq!(a, b, "{text} in pieces of {size}: call {k}");
                }
            }
        }
    }

    /// Streamed in pieces of any size, an `auto` output's content and calls add up to
    /// what `extract` finds in the whole output, and no tag text leaks into content.
    #[test]
    fn auto_calls_stream_as_they_are_generated() {
        let t = tools(Mode::Auto);
        for text in [
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa<ris\"}}\n</tool_call>",
            "<tool_call>{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}</tool_call>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>",
            "Two < three, and <tool_ is not a tag.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"n\": [1, 2]}}",
        ] {
            let (want, rest) = extract(&t, text).unwrap();
            for size in [1, 2, 3, 5, 11, 1000] {
                let mut s = AutoStream::default();
                let chars: Vec<char> = text.chars().collect();
                let (mut content, mut got, mut args) = (String::new(), Vec::<Call>::new(), Vec::<String>::new());
                let mut take = |pieces: Vec<AutoPiece>| {
                    for p in pieces {
                        match p {
                            AutoPiece::Content(c) => content.push_str(&c),
                            AutoPiece::Call(Reveal::Begin { k, name }) => {
                                assert_eq!(k, got.len());
                                got.push(Call { name, arguments: String::new() });
                                args.push(String::new());
                            }
                            AutoPiece::Call(Reveal::Args { k, text }) => args[k].push_str(&text),
                        }
                    }
                };
                for piece in chars.chunks(size) {
                    take(s.push(&piece.iter().collect::<String>()));
                }
                take(s.finish());
                assert_eq!(s.calls(), want.len(), "{text} in pieces of {size}");
                assert_eq!(got.len(), want.len());
                for (k, w) in want.iter().enumerate() {
                    assert_eq!(got[k].name, w.name);
                    let a: Value = serde_json::from_str(&args[k]).unwrap();
                    let b: Value = serde_json::from_str(&w.arguments).unwrap_or(json!(w.arguments));
                    assert_eq!(a, b, "{text} in pieces of {size}: call {k}");
                }
                assert_eq!(content.trim(), rest.as_deref().unwrap_or(""), "{text} in pieces of {size}");
            }
        }
    }

    #[test]
    fn auto_text_without_calls_streams_whole() {
        for text in [
            "plain answer",
            "a <tool_c",
            "x</tool_call>y",
            "<tool_call>not json</tool_call> after",
        ] {
            for size in [1, 4, 100] {
                let mut s = AutoStream::default();
                let mut content = String::new();
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(size) {
                    for p in s.push(&piece.iter().collect::<String>()) {
                        if let AutoPiece::Content(c) = p {
                            content.push_str(&c)
                        }
                    }
                }
                for p in s.finish() {
                    if let AutoPiece::Content(c) = p {
                        content.push_str(&c)
                    }
                }
                assert_eq!(s.calls(), 0, "{text}");
                assert_eq!(content, text, "pieces of {size}");
            }
        }
    }
}
