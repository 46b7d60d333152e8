//! What the benchmarks that read the default model share.

/// The model file: `FOLIO_MODEL`, else the default model where `scripts/setup.sh` puts it.
pub fn model_path() -> std::path::PathBuf {
    std::env::var_os("FOLIO_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}
