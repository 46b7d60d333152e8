//! Load: 200 streamed requests from 32 clients at once, a quarter of the clients
//! hanging up mid-stream. Every answer that stayed is complete and identical to
//! the same request run alone (greedy decoding is batch-invariant); no 5xx; after,
//! nothing runs and every page is free or cached.

use crate::cancel::drain_stream;
use crate::client::{eventually, metric, open_stream, post};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "List three prime numbers:",
    "Once upon a time, in a quiet village,",
    "The best way to learn a language is",
    "def fibonacci(n):",
    "Explain gravity to a child.",
    "My favourite season is autumn because",
];

fn body(p: &str, stream: bool) -> serde_json::Value {
    json!({"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stream": stream})
}

#[test]
fn two_hundred_requests_at_32_with_a_quarter_hanging_up() {
    let s = start(ServeConfig::default(), small_engine());
    let addr = s.addr;
    let reference: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let r = post(addr, "/v1/completions", &body(p, false)).json();
            r["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    let next = Arc::new(AtomicUsize::new(0));
    let stats = Arc::new(Mutex::new((0usize, 0usize, Vec::<String>::new()))); // (complete, hung up, failures)
    let clients: Vec<_> = (0..32)
        .map(|k| {
            let (next, stats, reference) = (next.clone(), stats.clone(), reference.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= 200 {
                    return;
                }
                let p = i % PROMPTS.len();
                let mut open = open_stream(addr, "/v1/completions", &body(PROMPTS[p], true));
                let mut st = stats.lock().unwrap();
                if open.status != 200 {
                    st.2.push(format!("request {i}: status {}", open.status));
                    continue;
                }
                drop(st);
                if k % 4 == 0 {
                    // This client hangs up after the first chunks.
                    open.next_event();
                    open.next_event();
                    drop(open);
                    stats.lock().unwrap().1 += 1;
                    continue;
                }
                let (text, complete) = drain_stream(&mut open);
                let mut st = stats.lock().unwrap();
                if !complete {
                    st.2.push(format!("request {i}: truncated or failed after {text:?}"));
                } else if text != reference[p] {
                    st.2.push(format!("request {i}: {text:?} != alone {:?}", reference[p]));
                } else {
                    st.0 += 1;
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (complete, hung_up, failures) = stats.lock().unwrap().clone();
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(complete + hung_up, 200);
    assert!(hung_up >= 40, "{hung_up}");
    let idle = || {
        metric(addr, "folio:num_requests_running", "model_name") == 0.0
            && metric(addr, "folio:num_requests_waiting", "model_name") == 0.0
            && metric(addr, "folio:kv_pages", "state=\"working\"") == 0.0
            && metric(addr, "folio:kv_pages", "state=\"committed\"") == 0.0
    };
    assert!(
        eventually(5.0, idle),
        "{}",
        crate::client::get(addr, "/metrics").text()
    );
    let cancelled = metric(addr, "folio:requests_cancelled_total", "model_name");
    assert!(
        cancelled >= 1.0 && cancelled <= hung_up as f64,
        "{cancelled} of {hung_up}"
    );
    eprintln!("{complete} complete and identical to alone, {hung_up} hung up ({cancelled} cancelled mid-run)");
}
