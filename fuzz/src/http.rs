//! The HTTP body target: the first byte picks a route (of
//! [`folio_server::fuzzing::BodyRoute::ALL`]), the rest is its body, checked as the
//! route checks it (parse, validate, tokenize, compile the grammar) against the
//! default model with its template and grammar table, in its full context window.
//! Property: a refusal is a client error (4xx), never a server error.

use crate::fixtures;
use folio::grammar::LazyGrammars;
use folio_server::fuzzing::{check_body, BodyRoute, Loaded};
use std::sync::OnceLock;

fn loaded() -> &'static Loaded<'static> {
    static L: OnceLock<Loaded<'static>> = OnceLock::new();
    static G: LazyGrammars = LazyGrammars::new();
    L.get_or_init(|| {
        let model = fixtures::model();
        Loaded {
            model,
            template: Some(fixtures::template()),
            grammars: G.table(&model.tokenizer, model.config.vocab),
            window: model.config.context_length,
            max_tokens_cap: folio_server::ServeConfig::default().max_tokens,
        }
    })
}

pub fn warm_up() {
    loaded();
}

pub fn run(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = BodyRoute::ALL[pick as usize % BodyRoute::ALL.len()];
    if let Err(e) = check_body(route, body, loaded()) {
        assert!(
            e.status.is_client_error(),
            "{route:?}: {} {}",
            e.status,
            e.message
        );
    }
}
