//! The whole forward pass on the AVX-VNNI path gives the AVX2 path's logits bit for bit
//! (prefill and decode, tiny models of the default model's formats: Q4_1 matrices, a
//! Q8_0 head; all-Q8_0), over f16 and 8-bit K/V. Natively where the CPU runs AVX-VNNI, else in a forked child
//! under the kernels' SIGILL emulator (`kernels::vnni_emulator`).

use super::Model;
use crate::gguf::GgmlType;
use crate::kernels::{runnable, vnni_emulator, Isa};
use crate::kv::{BasicCache, KvDtype, KvSeq, Logits};

/// Every position's logits of a 19-token prompt, then of four decode steps, over K/V
/// stored as `dtype`.
fn logits(m: &Model, dtype: KvDtype) -> Result<Vec<f32>, String> {
    let c = &m.config;
    let mut kv = BasicCache::with_dtype(c.n_layers, c.kv_dim(), c.head_dim, 64, dtype);
    let prompt: Vec<u32> = (0..19).map(|i| (i * 7 + 3) % c.vocab as u32).collect();
    let mut out = Vec::new();
    let mut step = |tokens: &[u32], want: Logits| -> Result<(), String> {
        let batch = kv.reserve(tokens, want).map_err(|e| e.to_string())?;
        let mut l = m.forward(&batch, kv.storage()).map_err(|e| e.to_string())?;
        kv.commit().map_err(|e| e.to_string())?;
        out.extend(l.pop().unwrap_or_default());
        Ok(())
    };
    step(&prompt, Logits::All)?;
    for t in [5, 11, 2, 8] {
        step(&[t], Logits::Last)?;
    }
    Ok(out)
}

fn avxvnni_forward_gives_the_avx2_bits() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let path = dir.path().join(format!("tiny-{ty}.gguf"));
        crate::tiny::write_model(&path, 5, ty).map_err(|e| e.to_string())?;
        let load = |isa| {
            Model::load(&path, 2)
                .map(|m| m.with_isa_unchecked(isa))
                .map_err(|e| e.to_string())
        };
        for dtype in [KvDtype::F16, KvDtype::Q8] {
            let a = logits(&load(Isa::Avx2)?, dtype)?;
            let b = logits(&load(Isa::AvxVnni)?, dtype)?;
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            if a.is_empty() || bits(&a) != bits(&b) {
                return Err(format!(
                    "{ty} tiny model, {dtype} K/V: avxvnni logits differ from avx2"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn avxvnni_forward_gives_the_avx2_logits_bit_for_bit() {
    let run = runnable();
    if !run.contains(&Isa::Avx2) {
        eprintln!("skipped: this CPU does not run the avx2 kernels");
    } else if run.contains(&Isa::AvxVnni) {
        avxvnni_forward_gives_the_avx2_bits().unwrap();
    } else {
        eprintln!("this CPU does not run AVX-VNNI: running the path under the SIGILL emulator");
        assert!(
            vnni_emulator::passes_under_the_emulator(avxvnni_forward_gives_the_avx2_bits),
            "the AVX-VNNI forward under the SIGILL emulator (its message is on stderr)"
        );
    }
}
