//! Every size a caller can give the engine is checked against the model and the
//! machine before anything is allocated: no value of any field panics or aborts.

use folio::{Engine, EngineConfig, EngineError, KvDtype, Model};
use proptest::prelude::*;

fn tiny() -> (tempfile::TempDir, Model) {
    crate::common::tiny_model(5, 1)
}

/// Any usize, weighted towards the edges where arithmetic overflows.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..70,
        Just(usize::MAX),
        Just(u32::MAX as usize),
        Just(u32::MAX as usize - 1),
        Just(1usize << 32),
        Just(1usize << 40),
        any::<usize>(),
    ]
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        size(),
        size(),
        size(),
        prop::option::of(size()),
        any::<bool>(),
    )
        .prop_map(
            |(kv_pages, page_size, max_batch_tokens, max_seq_tokens, f32)| EngineConfig {
                kv_pages,
                page_size,
                max_batch_tokens,
                max_seq_tokens,
                kv_dtype: if f32 { KvDtype::F32 } else { KvDtype::F16 },
                ..EngineConfig::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn any_configuration_is_checked_without_panicking(cfg in config()) {
        let (_d, m) = tiny();
        match cfg.validate(&m) {
            Ok((shape, window)) => {
                prop_assert!(shape.n_pages >= 1 && shape.page_size >= 1);
                prop_assert!(shape.page_size <= window && window <= m.config.context_length);
                let bytes = shape.page_bytes() as u128 * shape.n_pages as u128;
                if let Some(avail) = folio::machine::available_memory() {
                    prop_assert!(bytes <= avail as u128);
                }
            }
            Err(EngineError::Config { name, reason }) => {
                prop_assert!(!reason.is_empty(), "{name}");
                prop_assert_eq!(EngineError::Config { name, reason }.kind(), folio::ErrorKind::Invalid);
            }
            Err(e) => prop_assert!(false, "not a configuration error: {e}"),
        }
    }
}

#[test]
fn engines_start_or_refuse_on_edge_sizes() {
    let (_d, m) = tiny();
    let path = _d.path().join("tiny.gguf");
    for (pages, ps, mbt, seq) in [
        (1usize, 1usize, 1usize, Some(2usize)),
        (1, usize::MAX, 1, None),
        (usize::MAX, 16, 512, None),
        (u32::MAX as usize, 16, 512, None),
        (4096, 16, usize::MAX, None),
        (4096, 16, 512, Some(usize::MAX)),
        (4096, 16, 512, Some(1)),
        (4096, 16, 512, Some(0)),
        (0, 16, 512, None),
        (64, 0, 512, None),
    ] {
        let cfg = EngineConfig {
            kv_pages: pages,
            page_size: ps,
            max_batch_tokens: mbt,
            max_seq_tokens: seq,
            ..EngineConfig::default()
        };
        let valid = cfg.validate(&m).is_ok();
        let started = Engine::new(Model::load(&path, 1).unwrap(), cfg);
        assert_eq!(started.is_ok(), valid, "{pages} {ps} {mbt} {seq:?}");
    }
}
