//! The chat template: the model's own Jinja template from `tokenizer.chat_template`,
//! rendered with minijinja (plus Python string methods, which most templates use).
//!
//! Templates are written for Hugging Face transformers, which renders them with Python's
//! jinja2, so the environment is set up as transformers sets up its own:
//! `trim_blocks` and `lstrip_blocks` on (a block tag's line leaves no blank line or
//! indentation behind), `{% break %}` / `{% continue %}`, `raise_exception(msg)`, and
//! `tojson` as Python's `json.dumps` (`pyjson.rs`). `scripts/parity/template_parity.py`
//! renders with both on random conversations and compares the strings.
//!
//! A template that calls a function, filter, test or method folio lacks (transformers'
//! `strftime_now`, say) is refused when it is compiled, not at the first request: it is
//! rendered once on a small conversation at load, and an error naming something unknown
//! fails the load.

use super::pyjson;
use crate::error::TokenizerError;
use minijinja::value::{Kwargs, Value};
use minijinja::{context, Environment, Error, ErrorKind};

/// ChatML, for models whose file carries no template.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts templates may refer to.
    ///
    /// Fails on a syntax error, and on a template that needs a function, filter, test or
    /// method folio does not have (found by rendering a short conversation).
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        let t = Self {
            env,
            bos: bos.into(),
            eos: eos.into(),
        };
        t.check_supported()?;
        Ok(t)
    }

    /// Renders a short conversation once: an error that names something folio lacks
    /// becomes the load error; any other (a template refusing these messages with
    /// `raise_exception`, say) is left to the requests that meet it.
    fn check_supported(&self) -> Result<(), TokenizerError> {
        let probe = [
            Message::new("system", "You are helpful."),
            Message::new("user", "Hello"),
            Message::new("assistant", "Hi!"),
            Message::new("user", "Bye"),
        ];
        for gen in [false, true] {
            if let Err(e) = self.render_value(&probe, gen, None) {
                if matches!(
                    e.kind(),
                    ErrorKind::UnknownFunction
                        | ErrorKind::UnknownFilter
                        | ErrorKind::UnknownTest
                        | ErrorKind::UnknownMethod
                        | ErrorKind::UnknownBlock
                ) {
                    return Err(TokenizerError::Template(format!(
                        "the chat template uses something folio does not support: {e}"
                    )));
                }
            }
        }
        Ok(())
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
        self.render_value(messages, add_generation_prompt, tools)
            .map_err(|e| TokenizerError::Template(e.to_string()))
    }

    fn render_value(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, Error> {
        let msgs: Vec<_> = messages
            .iter()
            .map(|m| context! { role => m.role, content => m.content })
            .collect();
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
        let e = ChatTemplate::new("{{ strftime_now('%d') }}{{ messages[0].content }}", "", "");
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
    fn a_broken_template_is_an_error() {
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
        let t = ChatTemplate::new("{{ raise_exception('no') }}", "", "").unwrap();
        assert!(matches!(
            t.render(&[], false),
            Err(TokenizerError::Template(_))
        ));
    }
}
