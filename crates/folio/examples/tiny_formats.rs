//! Writes the wide tiny models of every weight format issue 15 added (and the two
//! K-quant mixes) into a folder, for `scripts/make_format_fixtures.py` to run through
//! llama.cpp. The integration test `tests/it/formats.rs` builds the same bytes itself.
//!
//! `cargo run --release -p folio --example tiny_formats -- DIR`

use folio::tiny;

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    std::fs::create_dir_all(&dir)?;
    for (name, formats) in tiny::FORMAT_MODELS {
        let path = dir.join(format!("{name}.gguf"));
        std::fs::write(&path, tiny::wide_model_bytes(tiny::FORMAT_SEED, formats))?;
        println!("{}", path.display());
    }
    Ok(())
}
