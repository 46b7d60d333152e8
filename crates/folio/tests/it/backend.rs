//! The backend seam, proved with a second backend: `Mirror` keeps every page it reads or
//! writes in memory of its own, addressed by the same page ids, as a GPU backend keeps
//! pages in device memory. Each step it uploads the pages the batch reads from the
//! pool's storage, runs the CPU backend on its own copy, and writes the new rows back,
//! as the contract in `folio::model::Backend` asks. The engine, the scheduler and the
//! cache run on it unchanged (forks, the prefix cache, preemption), and since it runs
//! the CPU's arithmetic every logit and every K/V bit equals the CPU backend's.

use crate::common::{self, forward_tables, ModelExt};
use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::kv::{KvPair, KvRows, KvStorage, Logits};
use folio::model::{Backend, Config, CpuBackend, Model, SamplingParams, StepError, StepLogits};
use folio::Batch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// One layer's K or V rows of a page in the mirror's own memory.
enum Rows {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Rows {
    fn view(&self, from: usize) -> KvRows<'_> {
        match self {
            Rows::F16(x) => KvRows::F16(&x[from..]),
            Rows::F32(x) => KvRows::F32(&x[from..]),
        }
    }

    /// Element `i` of `src` stored at `at`, bit for bit.
    fn set(&mut self, at: usize, src: KvRows, i: usize) {
        match (self, src) {
            (Rows::F16(x), KvRows::F16(s)) => x[at] = s[i],
            (Rows::F32(x), KvRows::F32(s)) => x[at] = s[i],
            _ => panic!("one dtype per pool"),
        }
    }
}

/// A page: per layer, its K rows and its V rows.
struct Page {
    slots: usize,
    layers: Vec<(Rows, Rows)>,
}

/// The mirror's own K/V memory, page ids as the pool's.
struct Device {
    pages: HashMap<u32, Page>,
    n_pages: usize,
    n_layers: usize,
    kv_dim: usize,
}

impl Device {
    /// Slot `slot` of `page` (all layers) copied from `host`, made first if new.
    fn upload(&mut self, host: &dyn KvStorage, page: u32, slot: usize) {
        let (n_layers, kv_dim) = (self.n_layers, self.kv_dim);
        let slots = host.page_slots(page);
        let p = self.pages.entry(page).or_insert_with(|| {
            let f16 = matches!(host.run(page, 0, 0).0, KvRows::F16(_));
            let rows = || {
                if f16 {
                    Rows::F16(vec![0; slots * kv_dim])
                } else {
                    Rows::F32(vec![0.0; slots * kv_dim])
                }
            };
            Page {
                slots,
                layers: (0..n_layers).map(|_| (rows(), rows())).collect(),
            }
        });
        for (layer, (k, v)) in p.layers.iter_mut().enumerate() {
            let (hk, hv) = host.run(page, layer, slot);
            for i in 0..kv_dim {
                k.set(slot * kv_dim + i, hk, i);
                v.set(slot * kv_dim + i, hv, i);
            }
        }
    }
}

impl KvStorage for Device {
    fn num_pages(&self) -> usize {
        self.n_pages
    }
    fn page_slots(&self, page: u32) -> usize {
        self.pages[&page].slots
    }
    fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let p = self
            .pages
            .get_mut(&page)
            .expect("the step's pages are uploaded");
        let (pk, pv) = &mut p.layers[layer];
        for (rows, x) in [(pk, k), (pv, v)] {
            match rows {
                Rows::F16(r) => {
                    let out = &mut r[slot * d..(slot + 1) * d];
                    for (o, &x) in out.iter_mut().zip(x) {
                        *o = folio::internals::f32_to_f16(x);
                    }
                }
                Rows::F32(r) => r[slot * d..(slot + 1) * d].copy_from_slice(x),
            }
        }
    }
    fn run_pages(&self, page: u32, _count: usize, layer: usize, slot: usize) -> KvPair<'_> {
        let (k, v) = &self.pages[&page].layers[layer];
        (k.view(slot * self.kv_dim), v.view(slot * self.kv_dim))
    }
}

/// A backend with K/V memory of its own around the CPU backend.
struct Mirror {
    inner: Box<dyn Backend>,
    /// The most rows its steps take (`Backend::max_step_rows`), if limited.
    max_rows: Option<usize>,
    device: Mutex<Option<Device>>,
    steps: Arc<AtomicUsize>,
}

impl Backend for Mirror {
    fn describe(&self) -> String {
        format!("mirror of {}", self.inner.describe())
    }
    fn threads(&self) -> usize {
        self.inner.threads()
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }
    /// The CPU's arithmetic, so the CPU's K/V: the same signature.
    fn kv_signature(&self) -> Vec<u8> {
        self.inner.kv_signature()
    }
    fn step(
        &self,
        config: &Config,
        batch: &Batch,
        kv: &mut dyn KvStorage,
        out: &mut StepLogits,
    ) -> Result<(), StepError> {
        let mut device = self.device.lock().unwrap();
        let dev = device.get_or_insert_with(|| Device {
            pages: HashMap::new(),
            n_pages: kv.num_pages(),
            n_layers: config.n_layers,
            kv_dim: config.kv_dim(),
        });
        // Upload what the step reads (the kv layer may have changed any page since:
        // copy-on-write copies, restores), and make room for what it writes.
        for s in &batch.seqs {
            for p in 0..s.end() {
                let (page, slot) = s.slot(p);
                dev.upload(&*kv, page.0, slot);
            }
        }
        self.inner.step(config, batch, dev, out)?;
        // The new rows back to the pool's storage, where forks, snapshots and the
        // prefix cache find them.
        let d = config.kv_dim();
        let (mut k, mut v) = (vec![0f32; d], vec![0f32; d]);
        for s in &batch.seqs {
            for p in s.start..s.end() {
                let (page, slot) = s.slot(p);
                for layer in 0..config.n_layers {
                    let (dk, dv) = dev.run(page.0, layer, slot);
                    (0..d).for_each(|i| (k[i], v[i]) = (dk.get(i), dv.get(i)));
                    kv.write(page.0, layer, slot, &k, &v);
                }
            }
        }
        self.steps.fetch_add(1, Relaxed);
        Ok(())
    }
    fn as_cpu(&self) -> Option<&CpuBackend> {
        self.inner.as_cpu()
    }
    fn as_cpu_mut(&mut self) -> Option<&mut CpuBackend> {
        self.inner.as_cpu_mut()
    }
    fn max_step_rows(&self) -> Option<usize> {
        self.max_rows
    }
}

/// The default model on the mirror, and its step counter.
fn mirrored() -> (Model, Arc<AtomicUsize>) {
    mirrored_with(None)
}

/// [`mirrored`], its steps limited to `max_rows` rows.
fn mirrored_with(max_rows: Option<usize>) -> (Model, Arc<AtomicUsize>) {
    let steps = Arc::new(AtomicUsize::new(0));
    let counter = steps.clone();
    let m = Model::load(&common::model_path(), 2)
        .unwrap()
        .with_backend(|inner| {
            Box::new(Mirror {
                inner,
                max_rows,
                device: Mutex::new(None),
                steps: counter,
            })
        });
    (m, steps)
}

#[test]
fn a_second_backend_gives_the_cpu_backends_logits_and_kv_bit_for_bit() {
    let cpu = Model::load(&common::model_path(), 2).unwrap();
    let (mirror, steps) = mirrored();
    assert!(mirror.backend().describe().starts_with("mirror of cpu"));
    assert_eq!(mirror.fingerprint(), cpu.fingerprint());
    let a = cpu
        .tokenizer
        .encode("The river runs to the sea, and the sea", true);
    let b = cpu
        .tokenizer
        .encode("Bread is made of flour, water and", true);
    let mut kvs = [cpu.new_paged(64, 16, 256), mirror.new_paged(64, 16, 256)];
    let mut logits: [Vec<Vec<Vec<f32>>>; 2] = Default::default();
    for (i, m) in [&cpu, &mirror].into_iter().enumerate() {
        let kv = &mut kvs[i];
        let (mut ta, mut tb) = (kv.new_table(None), kv.new_table(None));
        // A prompt in two chunks beside another whole, then decode steps of both.
        let (a0, a1) = a.split_at(5);
        let first = [(a0, Logits::All), (&b[..], Logits::Last)];
        logits[i].push(forward_tables(m, kv, &mut [&mut ta, &mut tb], &first).unwrap());
        let second = [(a1, Logits::All), (&[b[0]][..], Logits::Last)];
        logits[i].push(forward_tables(m, kv, &mut [&mut ta, &mut tb], &second).unwrap());
        for t in 0..6u32 {
            let step = [
                (&[100 + t][..], Logits::Last),
                (&[200 + t][..], Logits::Last),
            ];
            logits[i].push(forward_tables(m, kv, &mut [&mut ta, &mut tb], &step).unwrap());
        }
    }
    assert!(
        logits[0] == logits[1],
        "the mirror's logits differ from the CPU's"
    );
    // Every K/V bit the steps wrote to the pool's storage.
    let c = &cpu.config;
    let [k0, k1] = &mut kvs;
    for page in 0..64u32 {
        for layer in 0..c.n_layers {
            let (x, y) = (
                k0.storage().run(page, layer, 0),
                k1.storage().run(page, layer, 0),
            );
            assert!(
                x.0.raw() == y.0.raw() && x.1.raw() == y.1.raw(),
                "page {page}"
            );
        }
    }
    assert_eq!(steps.load(Relaxed), 8, "every step ran on the mirror");
}

/// A pool of 24 pages of 16 (small enough to preempt) and steps of up to 64 rows.
fn small_pool() -> EngineConfig {
    EngineConfig {
        kv_pages: 24,
        page_size: 16,
        max_batch_tokens: 64,
        snapshot_dir: None,
        ..Default::default()
    }
}

/// A backend whose steps take at most 8 rows (as a GPU's take at most 65535): the
/// engine plans no larger step, whatever `max_batch_tokens` says, and the greedy text
/// is the unlimited CPU engine's.
#[test]
fn the_engine_plans_no_step_larger_than_the_backend_takes() {
    let (mirror, _) = mirrored_with(Some(8));
    let engines = [
        Engine::new(Model::load(&common::model_path(), 2).unwrap(), small_pool()).unwrap(),
        Engine::new(mirror, small_pool()).unwrap(),
    ];
    let mut texts = Vec::new();
    for e in &engines {
        let mut r = Request::new(Prompt::Text(
            "Name three rivers of Europe and say where each one ends.".into(),
        ));
        r.max_tokens = 6;
        texts.push(e.submit(r).unwrap().collect_all().unwrap()[0].text.clone());
    }
    assert_eq!(texts[0], texts[1]);
    // Steps by rows: STEP_TOKEN_BOUNDS are 1, 8, 16, ...: the mirror's all at most 8.
    let steps = |e: &Engine| e.stats().unwrap().step_tokens;
    assert!(
        steps(&engines[0])[2..].iter().any(|&n| n > 0),
        "the CPU's prompt in one step"
    );
    assert!(
        steps(&engines[1])[2..].iter().all(|&n| n == 0),
        "{:?}",
        steps(&engines[1])
    );
}

#[test]
fn the_engine_runs_on_a_second_backend_unchanged() {
    let (mirror, steps) = mirrored();
    let engines = [
        Engine::new(Model::load(&common::model_path(), 2).unwrap(), small_pool()).unwrap(),
        Engine::new(mirror, small_pool()).unwrap(),
    ];
    // Sampled with n = 3 (the prompt's pages forked, the partial page copied on
    // write), twice (the second round from the prefix cache), in a pool small enough
    // to preempt.
    let request = |i: usize| {
        let prompt = format!(
            "Name {} rivers of Europe and say where each one ends.",
            2 + i
        );
        let mut r = Request::new(Prompt::Text(prompt));
        r.max_tokens = 20;
        r.n = 3;
        r.logprobs = Some(2);
        r.sampling = SamplingParams {
            temperature: 0.8,
            seed: 7 + i as u64,
            ..Default::default()
        };
        r
    };
    let mut got = [Vec::new(), Vec::new()];
    for (e, got) in engines.iter().zip(&mut got) {
        for _round in 0..2 {
            let streams: Vec<_> = (0..3).map(|i| e.submit(request(i)).unwrap()).collect();
            for s in streams {
                for c in s.collect_all().unwrap() {
                    let lps: Vec<_> = c.logprobs.iter().map(|l| l.logprob.to_bits()).collect();
                    got.push((c.ids, lps, c.usage.cached_tokens > 0));
                }
            }
        }
    }
    assert_eq!(got[0].len(), 18);
    assert!(
        got[0] == got[1],
        "the engine on the mirror answered differently"
    );
    assert!(
        got[1].iter().any(|g| g.2),
        "the second round hit the prefix cache"
    );
    // Embeddings (hidden states instead of logits) come through the seam too.
    let toks = (engines[0].model().tokenizer).encode("States from the final norm.", true);
    let states: Vec<_> = engines
        .iter()
        .map(|e| e.embed(toks.clone()).unwrap())
        .collect();
    assert!(states[0] == states[1], "the mirror's hidden states differ");
    assert!(steps.load(Relaxed) > 0);
}

/// A backend with no weights, which refuses every step.
struct Bare;

impl Backend for Bare {
    fn describe(&self) -> String {
        "bare".into()
    }
    fn threads(&self) -> usize {
        1
    }
    fn bytes_per_token(&self) -> usize {
        0
    }
    fn kv_signature(&self) -> Vec<u8> {
        b"bare".to_vec()
    }
    fn step(
        &self,
        _: &Config,
        _: &Batch,
        _: &mut dyn KvStorage,
        _: &mut StepLogits,
    ) -> Result<(), StepError> {
        Err(StepError::Device("a bare backend runs nothing".into()))
    }
}

/// `Model::load_onto` hands its backend the configuration `Model::load` ends with, and
/// the model it makes holds no CPU weights; a backend refused leaves the model on the
/// CPU, with the reason.
#[test]
fn a_model_loads_onto_another_backend_without_the_cpus_weights() {
    let path = common::model_path();
    let cpu = Model::load(&path, 2).unwrap();
    let mut seen = None;
    let (m, made) = Model::load_onto(&path, 2, |_, c| {
        seen = Some(format!("{c:?}"));
        Ok::<Box<dyn Backend>, ()>(Box::new(Bare))
    })
    .unwrap();
    assert_eq!(made, Ok(()));
    assert_eq!(m.backend().describe(), "bare");
    assert!(
        m.backend().as_cpu().is_none(),
        "no CPU backend, so no CPU weights"
    );
    assert_eq!(seen.as_deref(), Some(format!("{:?}", cpu.config).as_str()));
    assert_eq!(format!("{:?}", m.config), format!("{:?}", cpu.config));
    assert_eq!(m.n_ctx(), cpu.n_ctx());
    let refuse = |_: &_, _: &_| Err::<Box<dyn Backend>, _>("refused");
    let (m, made) = Model::load_onto(&path, 2, refuse).unwrap();
    assert_eq!(made.err(), Some("refused"));
    assert!(m.backend().as_cpu().is_some());
    assert_eq!(m.fingerprint(), cpu.fingerprint());
}
