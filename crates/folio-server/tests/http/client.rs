//! A raw HTTP/1.1 client: one request per connection, the whole answer read back
//! (chunked bodies decoded), or a stream read line by line.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of an event stream (`[DONE]` included as a string).
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    /// Asserts the status and OpenAI's error envelope; returns the error object.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "body: {}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    s
}

pub fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write");
    s.write_all(body).expect("write body");
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = connect(addr);
    send(&mut s, method, path, headers, body);
    let mut r = BufReader::new(s);
    read_response(&mut r)
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

/// Reads the status line and headers.
/// POSTs `body` and returns the JSON answer, which must be 200 or 201.
pub fn ok(a: SocketAddr, path: &str, body: Value) -> Value {
    let r = post(a, path, &body);
    assert!(
        r.status == 200 || r.status == 201,
        "{path}: {} {}",
        r.status,
        r.text()
    );
    r.json()
}

pub fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    (status, headers)
}

pub fn read_response(r: &mut impl BufRead) -> Resp {
    let (status, headers) = read_head(r);
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).expect("chunk size");
            let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).expect("chunk");
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut body).expect("body");
    }
    Resp {
        status,
        headers,
        body,
    }
}

/// A streaming request, left open: the head is read; read events with `next_event`.
pub struct Open {
    pub status: u16,
    pub reader: BufReader<TcpStream>,
}

pub fn open_stream(addr: SocketAddr, path: &str, body: &Value) -> Open {
    let mut s = connect(addr);
    send(&mut s, "POST", path, &[], body.to_string().as_bytes());
    let mut reader = BufReader::new(s);
    let (status, _) = read_head(&mut reader);
    Open { status, reader }
}

impl Open {
    /// The next `data:` payload (raw chunked framing lines are skipped).
    pub fn next_event(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(d) = line.trim_end().strip_prefix("data: ") {
                return Some(d.to_string());
            }
        }
    }
}

/// `n` token ids inside the default model's vocabulary, deterministic, different
/// for each `salt`.
pub fn tokens(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| 100 + ((i * 7919 + salt * 104_729) % 40_000) as u32)
        .collect()
}

/// A new context holding `toks` (pending until a flush or a save); its id.
pub fn context_with(a: SocketAddr, toks: &[u32]) -> String {
    let id = ok(a, "/v1/contexts", serde_json::json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(
        a,
        &format!("/v1/contexts/{id}/append"),
        serde_json::json!({ "tokens": toks }),
    );
    id
}

/// A metric's value from `/metrics` (the first line starting with `name` and
/// containing `label`).
pub fn metric(addr: SocketAddr, name: &str, label: &str) -> f64 {
    let text = get(addr, "/metrics").text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}{{{label}}} in\n{text}"))
}

/// Waits up to `secs` for `f` to hold.
pub fn eventually(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs_f64(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
