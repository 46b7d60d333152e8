//! Tool calls as they stream. [`ToolStream`] turns a growing output into pieces of the
//! answer that `tools::extract` gives for the whole output: content, each
//! call's name, and its arguments. Put back together as an OpenAI client does
//! (content concatenated, `function.arguments` concatenated per call index) the
//! pieces are exactly that answer, however the output was split. The rule that makes
//! it so: nothing goes out before the whole output could no longer change it.
//!
//! - Named function: the output is the arguments. The call begins at once; the
//!   arguments go out as they are generated.
//! - `required`: the output is grammar-constrained JSON (a call object or a list of
//!   them) that [`CallStream`] reads. A call goes out once its `name` value has ended,
//!   then its arguments as they are generated. The text is also held, and goes out as
//!   content at the end only if no call came (an output cut before any name).
//! - `auto`: the model's free text ([`AutoStream`]). Content goes out at once, except a
//!   trailing piece that may begin `<tool_call>` and trailing whitespace (both wait for
//!   what follows). A `<tool_call>` block is held whole until its first `</tool_call>`
//!   (or the end of the output), then [`block_call`] decides: a call, or content.
//!
//! The canonical forms, the same in both paths:
//! - arguments: the JSON text of the `arguments` value with the whitespace outside
//!   strings removed ([`minify`]); the model's own numbers, escapes and key order are
//!   kept, so nothing is lost. A string value stays a JSON string (`"1.1.1"`). A call
//!   object without `arguments` has `{}`.
//! - a call object's keys: the first `name` and the first `arguments` count (a
//!   streamed call's name goes out as soon as it is read); a `name` that is not a
//!   string makes no call.
//! - content: with calls, the text outside them with trailing whitespace removed, and
//!   null when nothing is left; with no call, the whole output as it is (`""` too).

use crate::tool_call::{Call, Mode};

/// A piece of an answer with tools, in the order it goes out.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Text for the answer's `content`.
    Content(String),
    /// Call `k` (counted across the whole output) begins: its name.
    Begin { k: usize, name: String },
    /// More of call `k`'s arguments, in canonical form.
    Args { k: usize, text: String },
}

/// The calls that pieces add up to, in order (`Content` is ignored).
pub fn calls_of(pieces: impl IntoIterator<Item = Piece>) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    for p in pieces {
        match p {
            Piece::Begin { name, .. } => calls.push(Call {
                name,
                arguments: String::new(),
            }),
            Piece::Args { k, text } => {
                if let Some(c) = calls.get_mut(k) {
                    c.arguments.push_str(&text);
                }
            }
            Piece::Content(_) => {}
        }
    }
    calls
}

/// Appends `p`, merged into the last piece when both are content or both are the same
/// call's arguments (fewer, larger chunks).
fn emit(out: &mut Vec<Piece>, p: Piece) {
    match (out.last_mut(), p) {
        (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
        (Some(Piece::Args { k: j, text: a }), Piece::Args { k, text: b }) if *j == k => {
            a.push_str(&b)
        }
        (_, p) => out.push(p),
    }
}

/// Whitespace as JSON has it (outside strings).
const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Where a character of JSON text stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    /// Part of a string: its opening quote, a character or an escape.
    Str,
    /// The closing quote of a string.
    StrEnd,
    /// Whitespace outside strings.
    Space,
    /// Anything else outside strings: punctuation, numbers, literals, junk.
    Other,
}

/// Tells strings from the rest, one character at a time.
#[derive(Debug, Default, Clone)]
struct Lexer {
    in_str: bool,
    escape: bool,
}

impl Lexer {
    fn class(&mut self, ch: char) -> Class {
        if self.in_str {
            if self.escape {
                self.escape = false;
            } else if ch == '\\' {
                self.escape = true;
            } else if ch == '"' {
                self.in_str = false;
                return Class::StrEnd;
            }
            return Class::Str;
        }
        match ch {
            '"' => {
                self.in_str = true;
                Class::Str
            }
            c if JSON_WS.contains(&c) => Class::Space,
            _ => Class::Other,
        }
    }
}

/// The canonical form of arguments: `text` without the JSON whitespace outside its
/// strings. Defined on any text (a cut one too), and piecewise:
/// `minify(a + b) == minify(a) + minify(b)` when the lexer state carries over, which
/// is how the streamed paths use [`Lexer`].
pub fn minify(text: &str) -> String {
    let mut lx = Lexer::default();
    text.chars()
        .filter(|&c| lx.class(c) != Class::Space)
        .collect()
}

/// What a member's value means to its call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    /// The first `name`: kept (minified) until it ends, then decoded.
    Name,
    /// The first `arguments`: goes out as it comes.
    Args,
    /// Anything else.
    Skip,
}

/// A member value being read inside a call object.
#[derive(Debug)]
struct Member {
    role: Role,
    /// Nesting inside the value.
    depth: usize,
    /// The value's text so far (for `name`).
    raw: String,
}

/// A call object being read.
#[derive(Debug, Default)]
struct Obj {
    /// The current key's raw text (quotes included), while and after it is read.
    key: String,
    /// The key has ended; a `:` is next.
    keyed: bool,
    value: Option<Member>,
    name_seen: bool,
    args_seen: bool,
    /// The call's index, once it has begun (its name has ended).
    k: Option<usize>,
    /// Arguments read before the name.
    early: String,
}

impl Obj {
    /// A character of the current value, outside JSON whitespace.
    fn keep(&mut self, ch: char, out: &mut Vec<Piece>) {
        let Some(v) = self.value.as_mut() else {
            return;
        };
        match (v.role, self.k) {
            (Role::Name, _) => v.raw.push(ch),
            (Role::Args, Some(k)) => emit(
                out,
                Piece::Args {
                    k,
                    text: ch.to_string(),
                },
            ),
            (Role::Args, None) => self.early.push(ch),
            (Role::Skip, _) => {}
        }
    }

    /// The current value has ended; returns whether the call began (as call `k`).
    fn end_value(&mut self, k: usize, out: &mut Vec<Piece>) -> bool {
        let Some(v) = self.value.take() else {
            return false;
        };
        if v.role != Role::Name {
            return false;
        }
        let Ok(name) = serde_json::from_str::<String>(&v.raw) else {
            return false;
        };
        out.push(Piece::Begin { k, name });
        self.k = Some(k);
        if !self.early.is_empty() {
            let text = std::mem::take(&mut self.early);
            emit(out, Piece::Args { k, text });
        }
        true
    }

    /// A value begins after the current key's `:` (or, for junk, without one).
    fn begin_value(&mut self, keyed: bool) {
        let key = if keyed {
            serde_json::from_str::<String>(&self.key).ok()
        } else {
            None
        };
        let role = match key.as_deref() {
            Some("name") if !self.name_seen => {
                self.name_seen = true;
                Role::Name
            }
            Some("arguments") if !self.args_seen => {
                self.args_seen = true;
                Role::Args
            }
            _ => Role::Skip,
        };
        self.key.clear();
        self.keyed = false;
        self.value = Some(Member {
            role,
            depth: 0,
            raw: String::new(),
        });
    }
}

/// Reads tool calls out of JSON text as it streams: a call object `{"name", "arguments"}`,
/// or a list of them (the shape the first bracket of the text says). Each call's
/// [`Piece::Begin`] goes out once its `name` value has ended, its arguments as they
/// come ([`minify`]d; held until the name when they come first; `{}` when the object
/// closes without any). An object whose first `name` is missing or not a string is
/// no call; a call whose object never closes (a cut output) keeps what it has. It
/// only tracks strings and nesting, so it reads any text, valid JSON or not, and
/// gives the same pieces (up to how they are cut) however the text is split.
#[derive(Debug, Default)]
pub struct CallStream {
    lex: Lexer,
    /// Nesting outside call objects.
    depth: usize,
    /// The depth of call objects: 1 for a lone object, 2 in a list; 0 until known.
    call_depth: usize,
    obj: Option<Obj>,
    /// Calls begun.
    calls: usize,
}

impl CallStream {
    /// Feeds more text; returns what it reveals, in order.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        for ch in text.chars() {
            self.step(ch, &mut out);
        }
        out
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn step(&mut self, ch: char, out: &mut Vec<Piece>) {
        let class = self.lex.class(ch);
        let k = self.calls;
        let Some(obj) = self.obj.as_mut() else {
            self.outside(ch, class);
            return;
        };
        if let Some(v) = obj.value.as_mut() {
            let ends = match class {
                Class::Space => return,
                Class::Str | Class::StrEnd => false,
                Class::Other => match ch {
                    '{' | '[' => {
                        v.depth += 1;
                        false
                    }
                    '}' | ']' if v.depth > 0 => {
                        v.depth -= 1;
                        false
                    }
                    ',' | '}' | ']' => v.depth == 0,
                    _ => false,
                },
            };
            if !ends {
                obj.keep(ch, out);
                return;
            }
            if obj.end_value(k, out) {
                self.calls += 1;
            }
        }
        // At call level: keys, `:`, `,` and the object's end.
        match class {
            Class::Space => {}
            Class::Str | Class::StrEnd if !obj.keyed => {
                obj.key.push(ch);
                obj.keyed = class == Class::StrEnd;
            }
            Class::Other if ch == ':' && obj.keyed => obj.begin_value(true),
            Class::Other if ch == ',' => {
                obj.key.clear();
                obj.keyed = false;
            }
            Class::Other if ch == '}' || ch == ']' => self.end_call(out),
            // Junk where a key or `:` belongs: read as a value that counts for nothing.
            _ => {
                obj.begin_value(false);
                if let Some(v) = obj.value.as_mut() {
                    if class == Class::Other && (ch == '{' || ch == '[') {
                        v.depth += 1;
                    }
                }
            }
        }
    }

    /// Outside call objects: only nesting matters, and where a call object begins.
    fn outside(&mut self, ch: char, class: Class) {
        if class != Class::Other {
            return;
        }
        match ch {
            '{' | '[' => {
                if self.call_depth == 0 && self.depth == 0 {
                    self.call_depth = if ch == '{' { 1 } else { 2 };
                }
                self.depth += 1;
                if ch == '{' && self.depth == self.call_depth {
                    self.obj = Some(Obj::default());
                }
            }
            '}' | ']' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
    }

    /// The call object closes.
    fn end_call(&mut self, out: &mut Vec<Piece>) {
        if let Some(obj) = self.obj.take() {
            if let (Some(k), false) = (obj.k, obj.args_seen) {
                out.push(Piece::Args {
                    k,
                    text: "{}".into(),
                });
            }
        }
        self.depth = self.depth.saturating_sub(1);
    }
}

/// The call a `<tool_call>` block's body holds: exactly one valid JSON object (JSON
/// whitespace around it allowed, nothing else) with a string `name`, read by
/// [`CallStream`]. Both paths of `auto` decide with this.
pub fn block_call(body: &str) -> Option<Call> {
    let is_call = body.trim_start_matches(JSON_WS).starts_with('{')
        && serde_json::from_str::<serde::de::IgnoredAny>(body).is_ok();
    let mut calls = if is_call {
        calls_of(CallStream::default().push(body))
    } else {
        Vec::new()
    };
    if calls.len() != 1 {
        tracing::debug!(
            bytes = body.len(),
            "a <tool_call> block holds no call: kept as content"
        );
        return None;
    }
    calls.pop()
}

/// The tag that opens a call in `auto` output (Hermes style).
pub const OPEN: &str = "<tool_call>";
/// The tag that closes it.
pub const CLOSE: &str = "</tool_call>";

/// Follows an `auto` output: see the module doc. Content is the text outside call
/// blocks (blocks that hold no call included, tags and all); with calls its trailing
/// whitespace is dropped, so whitespace waits until text follows it.
#[derive(Debug, Default)]
pub struct AutoStream {
    /// Text not yet decided: a possible beginning of `<tool_call>`, or a block's body.
    pending: String,
    /// Inside a block (after its `<tool_call>`).
    in_block: bool,
    /// How far into `pending` a block's `</tool_call>` is known not to begin.
    searched: usize,
    /// Trailing whitespace of the content so far, not yet sent.
    space: String,
    /// Whether any content has gone out.
    sent: bool,
    /// Calls so far.
    calls: usize,
}

impl AutoStream {
    /// Feeds more output; returns what it reveals, in order.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_block {
                let Some(i) = self.pending[self.searched..].find(CLOSE) else {
                    let mut from = self.pending.len().saturating_sub(CLOSE.len() - 1);
                    while !self.pending.is_char_boundary(from) {
                        from -= 1;
                    }
                    self.searched = from.max(self.searched);
                    return out;
                };
                let end = self.searched + i;
                let body: String = self.pending.drain(..end).collect();
                self.pending.drain(..CLOSE.len());
                self.end_block(&body, true, &mut out);
            } else {
                match self.pending.find(OPEN) {
                    Some(i) => {
                        let before: String = self.pending.drain(..i).collect();
                        self.pending.drain(..OPEN.len());
                        self.content(&before, &mut out);
                        self.in_block = true;
                        self.searched = 0;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, OPEN);
                        let now: String = self.pending.drain(..self.pending.len() - keep).collect();
                        self.content(&now, &mut out);
                        return out;
                    }
                }
            }
        }
    }

    /// The output ended: what was held is decided (an unclosed block ends here).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        if self.in_block {
            self.end_block(&rest, false, &mut out);
        } else {
            self.content(&rest, &mut out);
        }
        let space = std::mem::take(&mut self.space);
        if self.calls == 0 && (!space.is_empty() || !self.sent) {
            // No call: the content is the whole output, as it is.
            self.sent = true;
            emit(&mut out, Piece::Content(space));
        }
        out
    }

    /// Calls so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn content(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        self.space.push_str(text);
        let keep = self.space.trim_end().len();
        if keep > 0 {
            let now: String = self.space.drain(..keep).collect();
            self.sent = true;
            emit(out, Piece::Content(now));
        }
    }

    /// A block ends (`closed`: at its `</tool_call>`, else at the end of the output).
    fn end_block(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        self.in_block = false;
        self.searched = 0;
        match block_call(body) {
            Some(call) => {
                let k = self.calls;
                self.calls += 1;
                out.push(Piece::Begin { k, name: call.name });
                out.push(Piece::Args {
                    k,
                    text: call.arguments,
                });
            }
            None => {
                let close = if closed { CLOSE } else { "" };
                self.content(&format!("{OPEN}{body}{close}"), out);
            }
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

/// One choice's answer as it streams, in any tool mode.
#[derive(Debug)]
pub struct ToolStream(Kind);

#[derive(Debug)]
enum Kind {
    /// A named function: the output is its arguments.
    Named {
        name: String,
        begun: bool,
        lex: Lexer,
    },
    /// `required`: JSON calls; the text is held in case no call comes.
    Required { calls: CallStream, held: String },
    /// `auto`: the model's text and its `<tool_call>` blocks.
    Auto(AutoStream),
}

impl ToolStream {
    /// A stream for an output made under `mode`.
    pub fn new(mode: &Mode) -> Self {
        ToolStream(match mode {
            Mode::Named(name) => Kind::Named {
                name: name.clone(),
                begun: false,
                lex: Lexer::default(),
            },
            Mode::Required { .. } => Kind::Required {
                calls: CallStream::default(),
                held: String::new(),
            },
            Mode::Auto => Kind::Auto(AutoStream::default()),
        })
    }

    /// Feeds more output; returns what it reveals, in order.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        match &mut self.0 {
            Kind::Named { name, begun, lex } => {
                let mut out = Vec::new();
                if !*begun {
                    *begun = true;
                    out.push(Piece::Begin {
                        k: 0,
                        name: name.clone(),
                    });
                }
                let text: String = text
                    .chars()
                    .filter(|&c| lex.class(c) != Class::Space)
                    .collect();
                if !text.is_empty() {
                    out.push(Piece::Args { k: 0, text });
                }
                out
            }
            Kind::Required { calls, held } => {
                held.push_str(text);
                calls.push(text)
            }
            Kind::Auto(a) => a.push(text),
        }
    }

    /// The output ended: what was held goes out.
    pub fn finish(&mut self) -> Vec<Piece> {
        match &mut self.0 {
            Kind::Named { .. } => self.push(""),
            Kind::Required { calls, held } => {
                if calls.calls() == 0 {
                    vec![Piece::Content(std::mem::take(held))]
                } else {
                    Vec::new()
                }
            }
            Kind::Auto(a) => a.finish(),
        }
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        match &self.0 {
            Kind::Named { begun, .. } => usize::from(*begun),
            Kind::Required { calls, .. } => calls.calls(),
            Kind::Auto(a) => a.calls(),
        }
    }
}

/// The pieces a piece of an answer's text makes: with tools (`stream`), what the call
/// reader finds in it (`last`: the answer ends here); without, the text as content.
pub fn pieces_of(stream: &mut Option<ToolStream>, text: &str, last: bool) -> Vec<Piece> {
    match stream {
        Some(s) => {
            let mut p = s.push(text);
            if last {
                p.extend(s.finish());
            }
            p
        }
        None => vec![Piece::Content(text.to_string())],
    }
}
