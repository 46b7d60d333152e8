//! folio's dequantization of every quantized format against gguf-py's (fixture made by
//! `scripts/make_quant_fixtures.py`): the block layouts are ggml's, value for value.

use folio::gguf::GgmlType;
use folio::internals::QMatrix;

#[test]
fn dequantization_matches_gguf_py() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant_blocks.json");
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let types = [
        ("Q4_0", GgmlType::Q4_0),
        ("Q4_1", GgmlType::Q4_1),
        ("Q8_0", GgmlType::Q8_0),
        ("Q4_K", GgmlType::Q4_K),
        ("Q6_K", GgmlType::Q6_K),
    ];
    for (name, ty) in types {
        let f = &fx["formats"][name];
        let hex = f["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let want: Vec<f32> = f["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let m = QMatrix::new(ty, 1, want.len(), &bytes).expect(name);
        let mut got = vec![0f32; want.len()];
        m.dequant_row(0, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1e-3),
                "{name}[{i}]: folio {g}, gguf-py {w}"
            );
        }
    }
}
