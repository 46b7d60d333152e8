//! The Messages API's own edges over HTTP: a malformed body is answered in Anthropic's
//! envelope (its SDK reads no other), and `count_tokens` counts whatever `max_tokens`
//! says (what would be generated plays no part in a count).

use crate::client::{post, request};
use crate::server::{small_engine, start};
use folio_server::ServeConfig;
use serde_json::{json, Value};

fn anthropic_error(status: u16, body: &Value) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(
        body["error"]["type"], "invalid_request_error",
        "{status}: {body}"
    );
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[test]
fn malformed_bodies_get_anthropics_envelope_and_counts_ignore_max_tokens() {
    let s = start(ServeConfig::default(), small_engine());
    let a = s.addr;
    let ct = [("Content-Type", "application/json")];
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let r = request(a, "POST", path, &ct, b"{\"messages\": [");
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        anthropic_error(400, &r.json());
    }
    let ask = json!([{"role": "user", "content": "Hello there"}]);
    let n = post(a, "/v1/messages/count_tokens", &json!({"messages": ask}));
    assert_eq!(n.status, 200, "{}", n.text());
    let count = n.json()["input_tokens"].as_u64().unwrap();
    assert!(count > 0);
    for max in [json!(0), json!(1_000_000), json!("x")] {
        let r = post(
            a,
            "/v1/messages/count_tokens",
            &json!({"messages": ask, "max_tokens": max}),
        );
        assert_eq!(r.status, 200, "max_tokens {max}: {}", r.text());
        assert_eq!(r.json(), json!({"input_tokens": count}));
    }
    let r = post(
        a,
        "/v1/messages",
        &json!({"messages": ask, "max_tokens": "x"}),
    );
    assert_eq!(r.status, 400);
    anthropic_error(400, &r.json());
}
