//! The chat template: the model's own Jinja template from `tokenizer.chat_template`,
//! rendered with minijinja (plus Python string methods, which most templates use).
//!
//! Templates are written for Hugging Face transformers, which renders them with Python's
//! jinja2, so the environment is set up as transformers sets up its own:
//! `trim_blocks` and `lstrip_blocks` on (a block tag's line leaves no blank line or
//! indentation behind), `{% break %}` / `{% continue %}`, `raise_exception(msg)`,
//! `strftime_now(format)` (UTC; `strftime.rs`), and `tojson` as Python's `json.dumps`
//! (`pyjson.rs`). jinja2's `items` and `length` replace minijinja's, which refuse an
//! undefined value where jinja2 sees an empty one. Messages carry any field besides role
//! and content (`tool_calls`, `tool_call_id`, `name`), present only when set.
//! `scripts/parity/template_parity.py` and `family_templates.py` (the families' own
//! templates, with tool calls) render with both on random conversations and compare.
//!
//! A template is rendered at load on probe conversations (plain and tool-using): one
//! that calls a function, filter, test or method folio lacks, on any path the probes
//! take, or that renders none of the plain conversations, fails the load, not the
//! first request.
//!
//! Output prints values as Python's `str` does (`None`, `True`, `1e-07`), and the
//! `iterable` test is jinja2's (`none` is not iterable).
//!
//! Known differences: jinja2 refuses to loop over `none` (`{% for t in tools %}` with no
//! tools), minijinja loops zero times, so folio renders where Python would raise; and a
//! float joined to a string (`'x' + 1e-07`, `~`) reads `0.0000001` where Python's
//! `str` gives `1e-07` (only printed floats follow Python).

use super::{pyjson, strftime};
use crate::error::TokenizerError;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// ChatML, for models whose file carries no template.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// One chat message: a role, its text, and any other fields the template may read
/// (OpenAI's `tool_calls` on an assistant message, `tool_call_id` and `name` on a tool
/// result, `reasoning_content`), each present only when set, as templates test
/// `'tool_calls' in message` and `message.tool_calls is defined`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            fields: serde_json::Map::new(),
        }
    }

    /// The message with one more field (a later `role` or `content` is ignored).
    pub fn with(mut self, key: &str, value: serde_json::Value) -> Self {
        if key != "role" && key != "content" {
            self.fields.insert(key.to_string(), value);
        }
        self
    }

    /// The message as the template sees it: `role`, `content`, then the other fields.
    fn to_value(&self) -> Value {
        let mut m = serde_json::Map::with_capacity(2 + self.fields.len());
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        m.extend(self.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        Value::from_serialize(serde_json::Value::Object(m))
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// Whether a render's leading BOS text is removed (the tokenizer adds the BOS).
    drop_bos: bool,
    /// The time `strftime_now` formats, in seconds since the epoch (UTC); `NOW` reads the
    /// clock at each render.
    now: Arc<AtomicI64>,
}

/// `ChatTemplate::now` when it reads the clock.
const NOW: i64 = i64::MIN;

/// Template instructions one render may run. The publishers' templates take some
/// thousands for a conversation with tools; a GGUF file's template that loops without
/// end (`range` nested in `range`) stops here with an error instead of hanging the load
/// or a request (some tenths of a second of work at most).
const FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts templates may refer to.
    ///
    /// Fails on a syntax error, and on a template that needs a function, filter, test or
    /// method folio does not have (found by rendering a short conversation).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.set_formatter(python_formatter);
        env.add_test("iterable", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Undefined
                    | ValueKind::String
                    | ValueKind::Seq
                    | ValueKind::Map
                    | ValueKind::Iterable
            )
        });
        env.add_filter("items", items);
        env.add_filter("length", length);
        env.add_filter("count", length);
        let now = Arc::new(AtomicI64::new(NOW));
        let clock = now.clone();
        env.add_function(
            "strftime_now",
            move |format: String| -> Result<String, Error> {
                let t = match clock.load(Ordering::Relaxed) {
                    NOW => std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs() as i64),
                    t => t,
                };
                strftime::format(&format, t).map_err(|e| {
                    Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}"))
                })
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let t = Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
            drop_bos: false,
            now,
        };
        t.check_supported()?;
        Ok(t)
    }

    /// The template with `strftime_now` fixed at `epoch_seconds` (UTC) instead of the
    /// clock: for renders that must not depend on the day (tests, parity checks).
    pub fn with_now(self, epoch_seconds: i64) -> Self {
        self.now.store(epoch_seconds, Ordering::Relaxed);
        self
    }

    /// The template for a tokenizer that adds the BOS token itself (`add_bos`): a
    /// render that starts with the BOS text (Gemma's and Llama 3's templates write
    /// `{{ bos_token }}` first) has it removed, as llama.cpp's server does, so the
    /// prompt gets one BOS token, not two.
    pub fn dropping_leading_bos(mut self, drop: bool) -> Self {
        self.drop_bos = drop;
        self
    }

    /// Renders probe conversations at load: plain ones (a user turn; system, user,
    /// assistant, user; user, assistant, user) and tool-using ones (`tools`, an
    /// assistant's tool call and its result), each with and without the generation
    /// prompt. The load fails if any render meets something folio lacks (an unknown
    /// function, filter, test, method or block), or if every plain conversation fails
    /// (a template that renders no conversation at all). A template refusing some
    /// conversations (Gemma's "no system role", a tool-call format it does not take)
    /// is its right: those refusals are left to the requests that meet them.
    fn check_supported(&self) -> Result<(), TokenizerError> {
        let tools = serde_json::json!([{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": "The city."}},
                    "required": ["city"]
                }
            }
        }]);
        let call = serde_json::json!([{
            "id": "call00001",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}
        }]);
        let plain = [
            vec![Message::new("user", "Hello")],
            vec![
                Message::new("system", "You are helpful."),
                Message::new("user", "Hello"),
                Message::new("assistant", "Hi!"),
                Message::new("user", "Bye"),
            ],
            vec![
                Message::new("user", "Hello"),
                Message::new("assistant", "Hi!"),
                Message::new("user", "Bye"),
            ],
        ];
        let with_tools = [
            vec![Message::new("user", "Weather in Paris?")],
            vec![
                Message::new("user", "Weather in Paris?"),
                Message::new("assistant", "").with("tool_calls", call),
                Message::new("tool", "{\"temperature\": 21}")
                    .with("tool_call_id", "call00001".into())
                    .with("name", "get_weather".into()),
                Message::new("assistant", "21 degrees."),
            ],
        ];
        let mut first_error = None;
        let mut plain_ok = false;
        let probes = plain
            .iter()
            .map(|m| (m, None, true))
            .chain(with_tools.iter().map(|m| (m, Some(&tools), false)));
        for (messages, tools, is_plain) in probes {
            for gen in [false, true] {
                match self.render_value(messages, gen, tools) {
                    Ok(_) => plain_ok |= is_plain,
                    Err(e) if is_unsupported(&e) => {
                        return Err(TokenizerError::Template(format!(
                            "the chat template uses something folio does not support: {e}"
                        )));
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match (plain_ok, first_error) {
            (false, Some(e)) => Err(TokenizerError::Template(format!(
                "the chat template renders no conversation (a user turn, with or without a \
                 system message): {e}"
            ))),
            _ => Ok(()),
        }
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends where the
    /// assistant's answer begins.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render`] with `tools` (OpenAI's list of tool definitions, as
    /// JSON) in the template's context, for templates that render them.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let text = self
            .render_value(messages, add_generation_prompt, tools)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        Ok(match text.strip_prefix(self.bos.as_str()) {
            Some(rest) if self.drop_bos && !self.bos.is_empty() => rest.to_string(),
            _ => text,
        })
    }

    fn render_value(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, Error> {
        let msgs: Vec<Value> = messages.iter().map(Message::to_value).collect();
        let tmpl = self.env.get_template("chat")?;
        let tools = tools.map(Value::from_serialize);
        tmpl.render(context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
            tools => tools,
        })
    }
}

/// `{{ value }}` as Python's `str` prints it: `None`, `True`, `False`, and floats in
/// Python's `repr` (`1e-07`, `1e+21`, `3.0`, `nan`, `inf`); everything else as minijinja
/// prints it (no HTML escaping: autoescape is off).
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(x) if x.is_nan() => "nan".to_string(),
            Ok(x) if x.is_infinite() => if x > 0.0 { "inf" } else { "-inf" }.to_string(),
            Ok(x) => pyjson::float_repr(x),
            Err(_) => return minijinja::escape_formatter(out, state, value),
        },
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(&text)
        .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// Whether a render error names something folio's template engine lacks.
fn is_unsupported(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnknownFunction
            | ErrorKind::UnknownFilter
            | ErrorKind::UnknownTest
            | ErrorKind::UnknownMethod
            | ErrorKind::UnknownBlock
    )
}

/// jinja2's `length` (and `count`): 0 for an undefined value, as Python's `len` of
/// jinja2's `Undefined` (templates test `tool.parameters.properties | length == 0`),
/// the number of characters, items or keys otherwise.
fn length(value: &Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    value.len().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("length: a value of kind {} has no length", value.kind()),
        )
    })
}

/// jinja2's `items` filter: a mapping's (key, value) pairs in order, nothing for an
/// undefined value (templates apply it to optional fields such as a tool's
/// `parameters.properties`), an error for anything else.
fn items(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(Vec::<Value>::new()));
    }
    if value.kind() != ValueKind::Map {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "items: can only get item pairs from a mapping",
        ));
    }
    let pairs = value
        .try_iter()?
        .map(|k| {
            let v = value.get_item(&k)?;
            Ok(Value::from(vec![k, v]))
        })
        .collect::<Result<Vec<Value>, Error>>()?;
    Ok(Value::from(pairs))
}

/// The `tojson` filter as transformers defines it: Python's `json.dumps(value,
/// ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, those four
/// also by position in that order (the first two here, all four by name).
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let arg = |pos: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        Ok(match pos {
            Some(v) => Some(v),
            None => kwargs.get::<Option<Value>>(name)?,
        })
    };
    let ensure_ascii = arg(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match arg(indent, "indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            // Python: an integer is that many spaces (none at 0 or less; still one
            // item per line).
            None => " ".repeat(usize::try_from(i64::try_from(v)?.max(0)).unwrap_or(0)),
        }),
    };
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) => Some((a.to_string(), b.to_string())),
                    _ => None,
                },
                _ => None,
            }
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be two strings",
                )
            })?
            .into()
        }
        _ => None,
    };
    let sort_keys = kwargs
        .get::<Option<Value>>("sort_keys")?
        .is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    pyjson::dumps(
        value,
        &pyjson::Options::new(ensure_ascii, indent, separators, sort_keys),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders_a_turn() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let s = t.render(&[Message::new("user", "hi")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn blocks_trim_their_lines_as_transformers_renders() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {% if m.role == 'user' %}\nU: {{ m.content }}\n  {% endif %}\n{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let s = t
            .render(
                &[Message::new("user", "a"), Message::new("user", "b")],
                false,
            )
            .unwrap();
        assert_eq!(s, "U: a\nU: b\n");
    }

    #[test]
    fn tojson_writes_python_json_and_loops_may_continue() {
        let t = ChatTemplate::new(
            "{% for x in tools %}{% if loop.first %}{% continue %}{% endif %}{{ x | tojson }}|{{ x | tojson(indent=1) }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let tools = serde_json::json!([0, {"z": 1e21, "a": "<é>", "l": [1.0, true, null]}]);
        let s = t.render_with_tools(&[], false, Some(&tools)).unwrap();
        assert_eq!(
            s,
            "{\"z\": 1e+21, \"a\": \"<é>\", \"l\": [1.0, true, null]}|{\n \"z\": 1e+21,\n \"a\": \"<é>\",\n \"l\": [\n  1.0,\n  true,\n  null\n ]\n}"
        );
    }

    #[test]
    fn a_template_needing_what_folio_lacks_fails_at_load() {
        let e = ChatTemplate::new(
            "{{ frobnicate_now('%d') }}{{ messages[0].content }}",
            "",
            "",
        );
        assert!(
            matches!(&e, Err(TokenizerError::Template(m)) if m.contains("does not support")),
            "{:?}",
            e.err()
        );
        assert!(ChatTemplate::new("{{ messages | frobnicate }}", "", "").is_err());
        // Refusing some conversations is the template's right: not a load error.
        assert!(ChatTemplate::new(
            "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}",
            "",
            ""
        )
        .is_ok());
    }

    #[test]
    fn a_broken_template_is_an_error_at_load() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
        // A template that would loop for hours runs out of fuel at the probe render.
        let e = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        );
        assert!(
            matches!(&e, Err(TokenizerError::Template(m)) if m.contains("fuel")),
            "{:?}",
            e.err()
        );
        // Refuses every conversation: no request could ever render.
        let e = ChatTemplate::new("{{ raise_exception('no') }}", "", "");
        assert!(
            matches!(&e, Err(TokenizerError::Template(m)) if m.contains("renders no conversation") && m.contains("no")),
            "{:?}",
            e.err()
        );
        let e = ChatTemplate::new("{{ messages[0].content | int + 1 }}{{ 1 / 0 }}", "", "");
        assert!(e.is_err());
        // Something unknown only on the tool path still fails the load.
        let e = ChatTemplate::new(
            "{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls | frobnicate }}{% endif %}{{ m.content }}{% endfor %}",
            "",
            "",
        );
        assert!(
            matches!(&e, Err(TokenizerError::Template(m)) if m.contains("does not support")),
            "{:?}",
            e.err()
        );
        // A template that refuses tools (or a system message) but renders a user turn loads.
        let t = ChatTemplate::new(
            "{% if tools %}{{ raise_exception('no tools') }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(matches!(
            t.render_with_tools(&[], false, Some(&serde_json::json!([1]))),
            Err(TokenizerError::Template(m)) if m.contains("no tools")
        ));
    }

    #[test]
    fn messages_carry_tool_calls_and_results_to_the_template() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if 'tool_calls' in m %}{% for c in m.tool_calls %}[{{ c.function.name }}({{ c.function.arguments | tojson }}) {{ c.id }}]{% endfor %}{% endif %}{% if m.tool_call_id is defined %}<{{ m.tool_call_id }}>{% endif %}|{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let call =
            serde_json::json!([{"id": "abc", "function": {"name": "f", "arguments": {"x": 1}}}]);
        let msgs = [
            Message::new("user", "go"),
            Message::new("assistant", "").with("tool_calls", call),
            Message::new("tool", "42").with("tool_call_id", "abc".into()),
        ];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "user:go|assistant:[f({\"x\": 1}) abc]|tool:42<abc>|"
        );
        // role and content are the message's own.
        let m = Message::new("user", "a").with("content", "b".into());
        assert_eq!(m.content, "a");
        assert!(m.fields.is_empty());
    }

    #[test]
    fn items_and_length_take_undefined_as_empty_as_jinja2_does() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.nothing | length }}{{ m.content | length }}{% for k, v in m.nothing | items %}x{% endfor %}{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}{{ v }}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "日本")], false).unwrap(),
            "02a1b2"
        );
        let t = ChatTemplate::new(
            "{{ messages[0].content }}{% if messages | length > 1 %}{{ messages[1].content | items }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        assert!(t
            .render(
                &[Message::new("user", "a"), Message::new("user", "b")],
                false
            )
            .is_err());
    }

    #[test]
    fn values_print_as_python_prints_them() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.content }}{% endfor %}|{{ none }}|{{ true }} {{ false }}|{{ 1e-07 }} {{ 1e21 }} {{ 3.0 }} {{ 0.5 }} {{ 7 }}|{{ none is iterable }} {{ 3 is iterable }} {{ 'ab' is iterable }} {{ [] is iterable }} {{ nothing is iterable }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "<a&b>")], false).unwrap(),
            "<a&b>|None|True False|1e-07 1e+21 3.0 0.5 7|False False True True True"
        );
    }

    #[test]
    fn strftime_now_formats_the_given_time() {
        let t = ChatTemplate::new(
            "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}{{ messages | length }}",
            "",
            "",
        )
        .unwrap()
        .with_now(1_736_936_430);
        assert_eq!(t.render(&[], false).unwrap(), "15 Jan 2025|2025-01-150");
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        let year: i32 = t.render(&[], false).unwrap().parse().unwrap();
        assert!(year >= 2025, "the clock's year: {year}");
    }
}
