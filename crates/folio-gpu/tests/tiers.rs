//! K/V the GPU leaves on the device comes to the host only for a snapshot's file and
//! the disk tier, and comes back bit for bit: a pool restarted from the snapshot
//! directory continues the saved sequence with the same logits, and a pool that finds
//! the prompt's pages on disk gives its last token the same logits as the prefill did.
//!
//! Without a Vulkan adapter (hardware or lavapipe) the test says so and returns.

use folio::kv::{DiskConfig, Logits, PageTable};
use folio::{KvDtype, Model, PagedKv};
use folio_gpu::{Gpu, GpuBackend};
use std::path::{Path, PathBuf};

fn model_path() -> PathBuf {
    std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

/// One step of `tokens` on `t`, committed: the last row's logits.
fn step(m: &Model, kv: &mut PagedKv, t: &mut PageTable, tokens: &[u32]) -> Vec<f32> {
    let batch = folio::Batch::one(kv.plan(t, tokens, Logits::Last).unwrap());
    let out = m.forward(&batch, kv.storage()).unwrap();
    kv.commit(t).unwrap();
    out.into_iter().next().unwrap()
}

fn bits(row: &[f32]) -> Vec<u32> {
    row.iter().map(|v| v.to_bits()).collect()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap() as u32
}

/// A pool of the model's shape with the snapshot directory and the disk tier, each
/// where asked.
fn pool(m: &Model, snapshots: Option<&Path>, disk: Option<&Path>) -> PagedKv {
    let shape = m.pool_shape(64, 16, KvDtype::F16);
    let mut kv = PagedKv::with_shape(shape, 512, &m.fingerprint());
    if let Some(dir) = snapshots {
        kv.open_snapshot_dir(dir).unwrap();
    }
    if let Some(dir) = disk {
        let cfg = DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: 1 << 30,
        };
        kv.attach_disk(&cfg).unwrap();
    }
    kv
}

#[test]
fn snapshots_and_the_disk_tier_bring_device_kv_back_bit_for_bit() {
    let gpu = match Gpu::open(true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            return;
        }
    };
    let path = model_path();
    let model = Model::load(&path, 2).unwrap();
    let backend = GpuBackend::load(gpu, &path, &model.config)
        .unwrap()
        .with_llama_arithmetic(true);
    let moved = backend.uploads();
    let m = model.with_backend(|_cpu| Box::new(backend));
    let root = std::env::temp_dir().join(format!("folio-gpu-tiers-{}", std::process::id()));
    let (snaps, disk) = (root.join("snapshots"), root.join("disk"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&snaps).unwrap();

    let text = "The lighthouse keeper climbed the narrow stairs every evening at dusk, \
                lit the great lamp, wound the clockwork that turned the lens, and wrote \
                in his log the wind, the sea and every ship that passed. In winter the \
                storms came from the north, and the keeper stayed awake through the night";
    let prompt = m.tokenizer.encode(text, true);
    assert!(
        prompt.len() > 48,
        "{} tokens: want more than 3 pages",
        prompt.len()
    );
    let full_pages = prompt.len() / 16;

    // Pool A: the prompt, one decode step, a snapshot, one more step.
    let mut a = pool(&m, Some(&snaps), Some(&disk));
    let mut t = a.new_table(None);
    let prefill = step(&m, &mut a, &mut t, &prompt);
    // The commit spilled the full pages to the disk tier: read back from the device.
    let spilled = moved.get().fetched_pages;
    assert_eq!(
        spilled, full_pages as u64,
        "full pages read back for the disk"
    );
    let x = argmax(&prefill);
    step(&m, &mut a, &mut t, &[x]);
    assert_eq!(
        moved.get().fetched_pages,
        spilled,
        "a decode step reads nothing back"
    );
    a.save("s", &mut t).unwrap();
    // The snapshot's file needed the partial page too (the full ones came back above).
    assert_eq!(
        moved.get().fetched_pages,
        spilled + 1,
        "the partial page read back"
    );
    a.flush_disk();
    let y = 611;
    let before = moved.get();
    let want = step(&m, &mut a, &mut t, &[y]);
    let after = moved.get();
    assert_eq!(
        after.fetched_pages, before.fetched_pages,
        "a step reads nothing back"
    );
    assert_eq!(after.written_back, 0, "no rows sent back");
    drop(a);

    // Pool B, as after a restart: the snapshot restored from its file.
    let mut b = pool(&m, Some(&snaps), None);
    let mut r = b.load("s").unwrap();
    let got = step(&m, &mut b, &mut r, &[y]);
    assert!(
        bits(&got) == bits(&want),
        "the restored snapshot's logits differ"
    );

    // Pool C: the prompt's full pages found on disk, its last token computed again.
    let mut c = pool(&m, None, Some(&disk));
    let mut u = c.new_table(None);
    let have = c.reuse_prefix(&mut u, &prompt);
    assert_eq!(have, full_pages * 16, "full pages from disk");
    assert_eq!(c.disk_stats().unwrap().hits, full_pages as u64);
    let again = step(&m, &mut c, &mut u, &prompt[have..]);
    assert!(
        bits(&again) == bits(&prefill),
        "logits after the disk tier differ"
    );
    let _ = std::fs::remove_dir_all(&root);
    eprintln!("{:?}", moved.get());
}
