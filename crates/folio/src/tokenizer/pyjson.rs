//! JSON text as Python's `json.dumps` writes it, for the chat templates' `tojson`
//! filter: templates are written for Hugging Face transformers, whose `tojson` is
//! `json.dumps` (no ASCII escaping unless asked, `indent`, `separators`, `sort_keys`),
//! not Jinja's own HTML-safe one, nor minijinja's compact serde_json output. So
//! `{"a": 1, "b": [1.0, 2]}` keeps its spaces, `1e+21` its sign, `<` stays `<`, and
//! keys keep their order.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// How to write: Python's `json.dumps` keyword arguments.
pub struct Options {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: one item per line, indented by `s` per level.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Options {
    /// Python's defaults for these `indent` and `separators`.
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Self {
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        Self {
            ensure_ascii,
            indent,
            item_sep,
            key_sep,
            sort_keys,
        }
    }
}

fn not_serializable(kind: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: a value of kind {kind} is not JSON serializable"),
    )
}

/// `value` as JSON text.
pub fn dumps(value: &Value, opts: &Options) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, opts, 0)?;
    Ok(out)
}

/// Nesting deeper than this is refused (Python's recursion limit plays this part).
const MAX_DEPTH: usize = 512;

fn write_value(out: &mut String, v: &Value, opts: &Options, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: nesting too deep",
        ));
    }
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => {
            let x = f64::try_from(v.clone()).map_err(|_| not_serializable("number"))?;
            out.push_str(&float_repr(x));
        }
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_list(out, &items, opts, depth)?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                entries.push((key_text(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_map(out, &entries, opts, depth)?;
        }
        other => return Err(not_serializable(other)),
    }
    Ok(())
}

/// A key as Python writes it: strings as they are; numbers, booleans and None as text.
fn key_text(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => float_repr(f64::try_from(key.clone()).unwrap_or(f64::NAN)),
        other => return Err(not_serializable(format!("{other} (as a key)"))),
    })
}

/// The line break and indentation that an indented layout puts before an item or a
/// closing bracket at `level`; nothing on one line.
fn newline(out: &mut String, opts: &Options, level: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn write_list(
    out: &mut String,
    items: &[Value],
    opts: &Options,
    depth: usize,
) -> Result<(), Error> {
    if items.is_empty() {
        out.push_str("[]");
        return Ok(());
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline(out, opts, depth + 1);
        write_value(out, item, opts, depth + 1)?;
    }
    newline(out, opts, depth);
    out.push(']');
    Ok(())
}

fn write_map(
    out: &mut String,
    entries: &[(String, Value)],
    opts: &Options,
    depth: usize,
) -> Result<(), Error> {
    if entries.is_empty() {
        out.push_str("{}");
        return Ok(());
    }
    out.push('{');
    for (i, (key, item)) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline(out, opts, depth + 1);
        write_str(out, key, opts.ensure_ascii);
        out.push_str(&opts.key_sep);
        write_value(out, item, opts, depth + 1)?;
    }
    newline(out, opts, depth);
    out.push('}');
    Ok(())
}

/// A JSON string: quotes, backslashes and control characters escaped (the short forms
/// where JSON has them), and with `ensure_ascii` everything outside ASCII as `\uXXXX`
/// (UTF-16, so two escapes above U+FFFF).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it: the shortest digits that read back the same,
/// positional from 1e-4 up to 1e16 (always with a fractional part: `3.0`), otherwise
/// `d.ddde±XX`; NaN and the infinities as `json.dumps` writes them.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.5e-5", "1e21", "0e0".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    if (-4..16).contains(&exp) {
        let (int, frac) = if exp >= 0 {
            let point = exp as usize + 1;
            if digits.len() <= point {
                (format!("{digits:0<point$}"), "0".to_string())
            } else {
                (digits[..point].to_string(), digits[point..].to_string())
            }
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            ("0".to_string(), format!("{zeros}{digits}"))
        };
        format!("{sign}{int}.{frac}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_python_writes_them() {
        for (x, want) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (3.0, "3.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (12345.678, "12345.678"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1e21, "1e+21"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (0.1 + 0.2, "0.30000000000000004"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn values_dump_as_python_json_dumps() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.0, "x<y>\"\\\n\u{1}é😀", null, true],
            "a": {},
            "c": [],
        }));
        let plain = Options::new(false, None, None, false);
        assert_eq!(
            dumps(&v, &plain).unwrap(),
            r#"{"b": [1, 2.0, "x<y>\"\\\n\u0001é😀", null, true], "a": {}, "c": []}"#
        );
        let ascii_sorted = Options::new(true, None, None, true);
        assert_eq!(
            dumps(&v, &ascii_sorted).unwrap(),
            r#"{"a": {}, "b": [1, 2.0, "x<y>\"\\\n\u0001\u00e9\ud83d\ude00", null, true], "c": []}"#
        );
        let pretty = Options::new(false, Some("  ".into()), None, false);
        assert_eq!(
            dumps(
                &Value::from_serialize(serde_json::json!({"k": [1, {"z": 2}]})),
                &pretty
            )
            .unwrap(),
            "{\n  \"k\": [\n    1,\n    {\n      \"z\": 2\n    }\n  ]\n}"
        );
        assert!(dumps(&Value::UNDEFINED, &plain).is_err());
    }
}
