//! folio's dequantization of every quantized format against gguf-py's (fixture made by
//! `scripts/make_quant_fixtures.py`): the block layouts are ggml's, value for value, and
//! for the formats added by issue 15 bit for bit.

use folio::gguf::GgmlType;
use folio::internals::QMatrix;

/// The fixture's raw blocks and gguf-py's values for format `name`.
fn fixture(name: &str) -> (Vec<u8>, Vec<f32>) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant_blocks.json");
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let f = &fx["formats"][name];
    let hex = f["hex"].as_str().expect(name);
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let want: Vec<f32> = f["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    (bytes, want)
}

/// folio's dequantization of the fixture's blocks of `ty`.
fn folio_values(name: &str, ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let m = QMatrix::new(ty, 1, n, bytes).expect(name);
    let mut got = vec![0f32; n];
    m.dequant_row(0, &mut got);
    got
}

#[test]
fn dequantization_matches_gguf_py() {
    let types = [
        ("Q4_0", GgmlType::Q4_0),
        ("Q4_1", GgmlType::Q4_1),
        ("Q8_0", GgmlType::Q8_0),
        ("Q4_K", GgmlType::Q4_K),
        ("Q6_K", GgmlType::Q6_K),
    ];
    for (name, ty) in types {
        let (bytes, want) = fixture(name);
        let got = folio_values(name, ty, &bytes, want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1e-3),
                "{name}[{i}]: folio {g}, gguf-py {w}"
            );
        }
    }
}

#[test]
fn dequantization_of_the_issue_15_formats_is_identical_to_gguf_py() {
    let types = [
        ("Q5_0", GgmlType::Q5_0),
        ("Q5_1", GgmlType::Q5_1),
        ("IQ4_NL", GgmlType::IQ4_NL),
        ("Q2_K", GgmlType::Q2_K),
        ("Q3_K", GgmlType::Q3_K),
        ("Q5_K", GgmlType::Q5_K),
    ];
    for (name, ty) in types {
        let (bytes, want) = fixture(name);
        assert!(want.len() >= 128, "{name}: fixture too small");
        let got = folio_values(name, ty, &bytes, want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name}[{i}]: folio {g}, gguf-py {w}"
            );
        }
    }
}
