//! The GPU backend against the CPU backend on the default model, both with llama.cpp's
//! arithmetic: logits within
//! [`TOLERANCE`] of each step's logit range and the same greedy tokens, for a ragged batch of
//! prefill chunks and decode rows with forked and truncated pages, and through the
//! engine (generation with `n > 1`, contexts forked and truncated, embeddings). And the
//! device pool's keeping of pages: only pages whose host generation changed go up
//! again, the rows steps compute stay on the device (copies too), and no logit bit
//! differs from uploading every page and sending every row back every step.
//!
//! Without a Vulkan adapter (hardware or lavapipe) each test says so and returns: the
//! project never needs a GPU. CI installs lavapipe (`scripts/test.sh`), so they run
//! there.

use folio::engine::{Engine, EngineConfig, Prompt, Request};
use folio::kv::{KvArena, KvPair, KvStorage, Logits, PageTable};
use folio::model::SamplingParams;
use folio::{KvDtype, Model, PagedKv};
use folio_gpu::{Gpu, GpuBackend, Uploads};
use std::path::PathBuf;

/// The largest difference allowed, relative to the range of the CPU's logits row.
///
/// Not the 1e-3 first asked for: both backends round every matmul input to 8 bits,
/// and a last-bit difference anywhere (another summation order, `exp`) moves some
/// value across a rounding boundary; the difference then grows layer by layer. Two
/// builds of llama.cpp on one CPU (AVX2, AVX-512) differ by up to 0.75 nats of
/// log-probability on the fidelity fixture for that reason. Measured here: 4.3e-2 at
/// worst (docs/gpu.md); what holds the GPU to the model is `fidelity.rs`.
const TOLERANCE: f32 = 6e-2;

fn model_path() -> PathBuf {
    std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

/// The model on the GPU with llama.cpp's arithmetic (8-bit matmul inputs), or `None`
/// (with the reason printed) where this machine has no Vulkan adapter; `tune` sets the
/// GPU backend's options beyond it (the matmuls' split, the attention's chunks).
fn gpu_model(tune: impl FnOnce(GpuBackend) -> GpuBackend) -> Option<Model> {
    let gpu = match Gpu::open(true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            return None;
        }
    };
    let path = model_path();
    let on_gpu = Model::load(&path, 2).unwrap();
    let backend = GpuBackend::load(gpu, &path, &on_gpu.config)
        .unwrap()
        .with_llama_arithmetic(true);
    let backend = tune(backend);
    let on_gpu = on_gpu.with_backend(|_cpu| Box::new(backend));
    eprintln!("gpu backend: {}", on_gpu.backend().describe());
    Some(on_gpu)
}

/// The CPU model and [`gpu_model`], both with llama.cpp's arithmetic, the nearest the
/// two come: the GPU's default f32 inputs are nearer the exact model than either
/// (`fidelity.rs`), and so, on a near tie, may pick another greedy token than the CPU.
fn models(tune: impl FnOnce(GpuBackend) -> GpuBackend) -> Option<(Model, Model)> {
    let on_gpu = gpu_model(tune)?;
    let cpu = Model::load(&model_path(), 2).unwrap().llama_arithmetic();
    Some((cpu, on_gpu))
}

/// One model's run: every step's logits (per sequence), and the greedy tokens chosen.
type Run = (Vec<Vec<Vec<f32>>>, Vec<Vec<u32>>);

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// A logits row's range (its largest less its smallest).
fn range(row: &[f32]) -> f32 {
    let (lo, hi) = row
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    hi - lo
}

/// The largest difference between two logits rows over the first one's range.
fn rel_error(cpu: &[f32], gpu: &[f32]) -> f32 {
    let err = cpu
        .iter()
        .zip(gpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    err / range(cpu)
}

/// The pool's storage with its page generations hidden: the GPU backend then uploads
/// every page a step reads, as it did before generations.
struct NoGenerations<'a>(&'a mut KvArena);

impl KvStorage for NoGenerations<'_> {
    fn num_pages(&self) -> usize {
        self.0.num_pages()
    }
    fn page_slots(&self, _page: u32) -> usize {
        self.0.page_size()
    }
    fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        self.0.write(page, layer, slot, k, v)
    }
    fn run_pages(&self, page: u32, count: usize, layer: usize, slot: usize) -> KvPair<'_> {
        self.0.run_pages(page, count, layer, slot)
    }
}

/// One step of several tables: plan each, run (with the pool's page generations
/// shown to the backend or hidden), commit each.
fn step(
    m: &Model,
    kv: &mut PagedKv,
    tables: &mut [&mut PageTable],
    steps: &[(&[u32], Logits)],
    generations: bool,
) -> Vec<Vec<f32>> {
    let mut batch = folio::Batch::default();
    for (t, (toks, want)) in tables.iter_mut().zip(steps) {
        batch.seqs.push(kv.plan(t, toks, *want).unwrap());
    }
    let out = if generations {
        m.forward(&batch, kv.storage())
    } else {
        m.forward(&batch, &mut NoGenerations(kv.storage()))
    }
    .unwrap();
    for t in tables.iter_mut() {
        kv.commit(t).unwrap();
    }
    out
}

fn prompts(m: &Model) -> [Vec<u32>; 4] {
    [
        "The river runs to the sea, and the sea runs to the sky, where",
        "Bread is made of flour, water and salt; a baker",
        "fn main() {\n    let total: u64 = (1..=10).sum();\n    println!(",
        "Once upon a time, in a small village by the mountains, there lived an old clockmaker who",
    ]
    .map(|p| m.tokenizer.encode(p, true))
}

/// The ragged scenario on `m`: a prefill chunk beside whole prompts; a sequence
/// forked (its partial page copied) and one truncated back into a committed page
/// (copied); a prefill chunk beside five decode rows; `decode` greedy steps of all five.
/// With `uploads`, the pages uploaded so far after each step. With `forced`, the
/// tokens fed back are those `forced` chose (teacher forcing), not `m`'s own.
fn ragged(
    m: &Model,
    decode: usize,
    generations: bool,
    uploads: Option<&Uploads>,
    forced: Option<&Run>,
    dtype: KvDtype,
) -> (Run, Vec<u64>) {
    let prompts = prompts(m);
    let mut sent = Vec::new();
    let mut note = || sent.extend(uploads.map(|u| u.get().pages));
    let mut kv = PagedKv::with_shape(m.pool_shape(64, 16, dtype), 512, &m.fingerprint());
    let mut t: Vec<PageTable> = (0..4).map(|_| kv.new_table(None)).collect();
    let (mut logits, mut chosen) = (Vec::new(), Vec::new());
    // Step 1: a chunk of prompt 2 beside whole prompts (all logits of the first).
    let (c0, c1) = prompts[2].split_at(9);
    let [a, b, c, d] = &mut t[..] else {
        unreachable!()
    };
    let s1 = [
        (&prompts[0][..], Logits::All),
        (&prompts[1][..], Logits::Last),
        (c0, Logits::None),
        (&prompts[3][..], Logits::Last),
    ];
    logits.push(step(m, &mut kv, &mut [a, b, c, d], &s1, generations));
    note();
    // Between the steps: prompt 1 forked (its committed pages shared, the partial
    // one copied), prompt 3 truncated back into its committed page (copied).
    let mut b2 = kv.fork(b).unwrap();
    kv.truncate(d, 6).unwrap();
    // Step 2: the rest of prompt 2 (a prefill chunk) beside five decode rows.
    let vocab = m.config.vocab;
    let first = &forced.map_or(&logits, |f| &f.0)[0][0];
    let next_a = [argmax(&first[first.len() - vocab..])];
    let s2 = [
        (&next_a[..], Logits::Last),
        (&[611u32][..], Logits::Last),
        (c1, Logits::Last),
        (&[284u32][..], Logits::Last),
        (&[1042u32][..], Logits::Last),
    ];
    let all = &mut [a, b, c, d, &mut b2];
    logits.push(step(m, &mut kv, all, &s2, generations));
    note();
    // Greedy decoding of all five.
    let pick = |i: usize, rows: &[Vec<f32>]| match forced {
        Some(f) => f.1[i].clone(),
        None => rows.iter().map(|r| argmax(r)).collect::<Vec<u32>>(),
    };
    let mut last = pick(0, &logits[1]);
    for i in 0..decode {
        chosen.push(last.clone());
        let s: Vec<_> = last
            .iter()
            .map(|x| (std::slice::from_ref(x), Logits::Last))
            .collect();
        let out = step(m, &mut kv, all, &s, generations);
        note();
        last = pick(i + 1, &out);
        logits.push(out);
    }
    chosen.push(last);
    ((logits, chosen), sent)
}

/// With the adapter's own matmul split (on lavapipe, one lane an output): each
/// backend feeds back its own greedy tokens, and they are the same.
#[test]
fn a_ragged_batch_with_forked_and_truncated_pages_matches_the_cpu() {
    ragged_against_the_cpu(|b| b, KvDtype::F16, false);
}

/// With a GPU's split (many lanes an output, a reduction in workgroup memory), what a
/// hardware adapter runs, here on lavapipe. Its sums go in another order, which turns
/// near ties the other way (measured: 3 of 63 rows, the CPU's logits for the two
/// tokens 4.8e-4 to 6.5e-3 of the range apart; one on the code prompt, whose
/// continuation then parts): so the GPU is fed the CPU's tokens, and where its greedy
/// token differs, the CPU's logit for it must be within the tolerance of the CPU's
/// best.
#[test]
fn a_ragged_batch_matches_the_cpu_with_the_gpus_matmul_split() {
    ragged_against_the_cpu(|b| b.with_wide_matmuls(true), KvDtype::F16, true);
}

/// Over an 8-bit K/V pool (`--kv-dtype q8_0`: head rows rotated, then quantized with a
/// scale each), on both backends: the device quantizes its new rows as the host does,
/// reads 8-bit pages the host wrote (the fork's and truncation's copies, and every
/// page a step wrote: the host quantized them again), rotates the queries and the
/// outputs. Fed the CPU's tokens, as the rounding of K/V to 8 bits turns near ties.
#[test]
fn a_ragged_batch_over_8_bit_kv_matches_the_cpu() {
    ragged_against_the_cpu(|b| b, KvDtype::Q8, true);
}

/// Split attention (`attention.wgsl`: the keys cut at multiples of 16 here, 256 by
/// default, each chunk's state written, then combined): every prompt of the scenario
/// spans two to five chunks. Fed the CPU's tokens, as another order of sums turns near
/// ties.
#[test]
fn a_ragged_batch_with_split_attention_matches_the_cpu() {
    ragged_against_the_cpu(|b| b.with_attention_chunk(16), KvDtype::F16, true);
}

/// Split attention over 8-bit K/V (the output rotated back after the combine).
#[test]
fn split_attention_over_8_bit_kv_matches_the_cpu() {
    ragged_against_the_cpu(|b| b.with_attention_chunk(16), KvDtype::Q8, true);
}

/// A step whose logits would be more than one binding holds (a long prompt's, all asked,
/// over a large vocabulary: Gemma 3's 262144 tokens passed lavapipe's 128 MiB at 129
/// rows) takes the head in pieces, each in a pass of its own: the same bits as in one
/// piece, here three prompts' 44 rows in pieces of 5.
#[test]
fn the_head_in_pieces_gives_the_same_bits() {
    let (Some(whole), Some(pieces)) = (plain_bits(), gpu_model(|b| b.with_head_rows(5))) else {
        return;
    };
    let b = three_prompts(&pieces);
    let rows: usize = b.iter().map(|r| r.len()).sum::<usize>() / pieces.config.vocab;
    assert_eq!(rows, 44);
    assert!(whole == bits(&b), "the head in pieces changed the logits");
}

/// [`three_prompts`]' bits on the default backend (llama.cpp's arithmetic, matrices in
/// one dispatch, the head whole, no profile): the reference the tests that vary one of
/// these compare with, computed once for all of them.
fn plain_bits() -> Option<&'static [u32]> {
    static PLAIN: std::sync::OnceLock<Option<Vec<u32>>> = std::sync::OnceLock::new();
    let plain = PLAIN.get_or_init(|| gpu_model(|b| b).map(|m| bits(&three_prompts(&m))));
    plain.as_deref()
}

/// Three prompts (44 tokens) in one step, every row's logits.
fn three_prompts(gpu: &Model) -> Vec<Vec<f32>> {
    three_prompts_over(gpu, KvDtype::F16)
}

/// [`three_prompts`] over a pool of `dtype`.
fn three_prompts_over(gpu: &Model, dtype: KvDtype) -> Vec<Vec<f32>> {
    let [a, _, b, _] = prompts(gpu);
    let prompts = [a, b, gpu.tokenizer.encode("Short one", true)];
    let mut kv = PagedKv::with_shape(gpu.pool_shape(64, 16, dtype), 512, &gpu.fingerprint());
    let mut tables: Vec<PageTable> = prompts.iter().map(|_| kv.new_table(None)).collect();
    let mut refs: Vec<&mut PageTable> = tables.iter_mut().collect();
    let steps: Vec<(&[u32], Logits)> = prompts.iter().map(|p| (&p[..], Logits::All)).collect();
    step(gpu, &mut kv, &mut refs, &steps, true)
}

/// Every value's bits, row after row.
fn bits(rows: &[Vec<f32>]) -> Vec<u32> {
    rows.iter().flatten().map(|v| v.to_bits()).collect()
}

/// Q, K and V in one dispatch, and gate and up in another (the default: each pair of
/// matrices in one format is one matrix of parts), give the logits of one dispatch a
/// matrix bit for bit: three prompts in one step. (Both splits, and a matrix in
/// pieces that straddle its parts: `a_matrix_of_parts_gives_each_part_its_own_bits`.)
#[test]
fn matrices_in_one_dispatch_give_the_same_bits() {
    let (Some(fused), Some(apart)) = (plain_bits(), gpu_model(|b| b.with_fused_matmuls(false)))
    else {
        return;
    };
    let b = three_prompts(&apart);
    assert!(fused == bits(&b), "{}", apart.backend().describe());
}

/// Attention with the query heads that share a K/V head in one workgroup (the
/// default: SmolLM2's 9 heads over 3 K/V heads, three a workgroup) gives the logits of
/// a workgroup a head bit for bit: three prompts in one step, over f16 and 8-bit K/V
/// (its query rotated and its output rotated back per head), each whole and split into
/// chunks of 8 keys (each head's state written for the combine).
#[test]
fn grouped_attention_gives_the_bits_of_a_head_a_workgroup() {
    let mut seen = Vec::new();
    for dtype in [KvDtype::F16, KvDtype::Q8] {
        for chunk in [256, 8] {
            let tune = |b: GpuBackend| b.with_attention_chunk(chunk);
            let (Some(grouped), Some(apart)) = (
                gpu_model(tune),
                gpu_model(|b| tune(b).with_grouped_attention(false)),
            ) else {
                return;
            };
            let case = format!(
                "{dtype:?}, chunks of {chunk}: {}",
                apart.backend().describe()
            );
            let a = bits(&three_prompts_over(&grouped, dtype));
            assert!(a == bits(&three_prompts_over(&apart, dtype)), "{case}");
            seen.push(a);
        }
    }
    // Each case ran its own arithmetic: the 8-bit pool's logits are not f16's.
    assert!(seen[0] != seen[2] && seen[1] != seen[3]);
}

/// A profiled step (`with_profile`: a timestamp before the first dispatch and after
/// each) gives the same bits, and its profile counts each of its dispatches once, by
/// kind, with each matmul's weight bytes: three prompts (44 rows) in one step; and
/// so with the head in pieces after the step's own pass.
#[test]
fn a_profile_times_every_dispatch_and_changes_no_bit() {
    let mut profile = None;
    let profiled = gpu_model(|b| {
        let b = b.with_profile(true);
        profile = b.profile();
        b
    });
    let (Some(a), Some(profiled)) = (plain_bits(), profiled) else {
        return;
    };
    let Some(profile) = profile else {
        eprintln!("skipped: the adapter writes no timestamps inside a compute pass");
        return;
    };
    assert!(
        a == bits(&three_prompts(&profiled)),
        "a profile changed the logits"
    );
    assert_eq!(profile.sizes(), [44]);
    let t = profile.steps(44).expect("the step profiled");
    eprintln!("{}", profile.report());
    let kind = |what: &str| {
        let k = t.kinds.iter().find(|k| k.what == what);
        k.unwrap_or_else(|| panic!("no {what} in {t:?}")).clone()
    };
    let c = &profiled.config;
    let layers = c.n_layers as u64;
    assert_eq!(t.steps, 1);
    // Every dispatch the step records, once: the embedding gather; per layer two norms
    // that quantize their rows (llama.cpp's arithmetic: 8-bit inputs), two 8-bit
    // quantizations (attention's and the gate's outputs), Q/K/V, the K/V store,
    // attention, the output, gate/up gated and down; the head's norm (quantizing) and
    // matmul.
    assert_eq!(t.dispatches, 10 * layers + 3, "{t:?}");
    assert_eq!(t.dispatches, t.kinds.iter().map(|k| k.count).sum::<u64>());
    assert_eq!(kind("quantize").count, 2 * layers);
    assert_eq!(kind("embed").count, 1);
    assert_eq!(t.device_ticks, t.kinds.iter().map(|k| k.ticks).sum::<u64>());
    assert_eq!(kind("attention").count, layers);
    // The layers' two norms and the final one, each with its quantization.
    assert_eq!(kind("rms_norm_quantized").count, 2 * layers + 1);
    assert!(t.kinds.iter().all(|k| k.what != "rms_norm"), "{t:?}");
    // Q4_1: 20 bytes a block of 32 weights.
    let q4_1 = |rows: usize, cols: usize| (rows * cols / 32 * 20) as u64;
    let down = kind("matmul ffn_down q4_1");
    assert_eq!(down.count, layers);
    assert_eq!(down.bytes, layers * q4_1(c.dim, c.ffn_dim));
    // Gate and up in one dispatch with the gate (no `glu` dispatch of its own).
    let gate_up = kind("matmul ffn_gate/up q4_1 gated");
    assert_eq!(gate_up.bytes, layers * q4_1(2 * c.ffn_dim, c.dim));
    assert!(t.kinds.iter().all(|k| k.what != "glu"), "{t:?}");
    assert!(kind("attention").ticks > 0);
    // The head in pieces of 5 rows (passes after the step's own, not timed): the same
    // bits, and the step's own pass profiled as before.
    let mut in_pieces = None;
    let pieces = gpu_model(|b| {
        let b = b.with_head_rows(5).with_profile(true);
        in_pieces = b.profile();
        b
    });
    let (Some(pieces), Some(in_pieces)) = (pieces, in_pieces) else {
        panic!("a second profiled backend");
    };
    assert!(
        bits(&three_prompts(&pieces)) == a,
        "the head in pieces, profiled"
    );
    let t = in_pieces.steps(44).expect("the step profiled");
    assert_eq!((t.steps, t.dispatches), (1, 10 * layers + 3), "{t:?}");
}

/// A row's logits do not depend on what else its step runs: each prompt alone, then
/// all in one step, give the same bits for every row (all logits asked), with the
/// attention split every 16 keys so the longest prompt splits the step while a short
/// one (within one chunk) alone does not; on both matmul splits. (The matmuls sum each
/// row on its own; attention's cut points depend on a row's position only.)
#[test]
fn a_rows_logits_are_the_same_bits_whatever_else_the_step_runs() {
    for wide in [false, true] {
        let tune = match wide {
            false => |b: GpuBackend| b.with_attention_chunk(16),
            true => |b: GpuBackend| b.with_attention_chunk(16).with_wide_matmuls(true),
        };
        let Some(gpu) = gpu_model(tune) else {
            return;
        };
        // 16 tokens (one chunk: alone, no split), 26 (two), 2.
        let [a, _, b, _] = prompts(&gpu);
        let prompts = [a, b, gpu.tokenizer.encode("Short one", true)];
        let run = |which: &[usize]| {
            let mut kv = PagedKv::with_shape(
                gpu.pool_shape(64, 16, KvDtype::F16),
                512,
                &gpu.fingerprint(),
            );
            let mut tables: Vec<PageTable> = which.iter().map(|_| kv.new_table(None)).collect();
            let mut refs: Vec<&mut PageTable> = tables.iter_mut().collect();
            let steps: Vec<(&[u32], Logits)> = which
                .iter()
                .map(|&i| (&prompts[i][..], Logits::All))
                .collect();
            step(&gpu, &mut kv, &mut refs, &steps, true)
        };
        let all: Vec<usize> = (0..prompts.len()).collect();
        let together = run(&all);
        for (i, rows) in together.iter().enumerate() {
            let alone = &run(&[i])[0];
            let bits = |r: &[f32]| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(alone) == bits(rows),
                "prompt {i} ({} tokens), wide {wide}: alone and in the step differ",
                prompts[i].len()
            );
        }
        let lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        eprintln!("wide {wide}: prompts of {lens:?} tokens, each alone = in one step, bit for bit");
    }
}

/// The ragged scenario on the CPU and on the GPU (`tune`d) over `dtype` K/V. With
/// `forced` the GPU is fed the CPU's greedy tokens, and a greedy token of its own that
/// differs must be a near tie; else it feeds back its own, and they must be the CPU's.
fn ragged_against_the_cpu(tune: fn(GpuBackend) -> GpuBackend, dtype: KvDtype, forced: bool) {
    let Some((cpu, gpu)) = models(tune) else {
        return;
    };
    let (mut worst, mut compared, mut ties) = (0f32, 0, 0);
    // Per model: every step's logits, and the greedy tokens fed back.
    let cpu_run = ragged(&cpu, 8, true, None, None, dtype).0;
    let forced = forced.then_some(&cpu_run);
    let gpu_run = ragged(&gpu, 8, true, None, forced, dtype).0;
    for (s, (a, b)) in cpu_run.0.iter().zip(&gpu_run.0).enumerate() {
        for (q, (ra, rb)) in a.iter().zip(b).enumerate() {
            assert_eq!(ra.len(), rb.len(), "step {s} sequence {q}: rows");
            for (x, y) in ra.chunks(cpu.config.vocab).zip(rb.chunks(cpu.config.vocab)) {
                let e = rel_error(x, y);
                worst = worst.max(e);
                assert!(
                    e <= TOLERANCE,
                    "step {s} sequence {q}: error {e} of the range"
                );
                compared += 1;
                let (want, got) = (argmax(x), argmax(y));
                if want != got {
                    let gap = (x[want as usize] - x[got as usize]) / range(x);
                    assert!(
                        forced.is_some() && gap <= TOLERANCE,
                        "step {s} sequence {q}: greedy token {got}, the CPU's {want} \
                         ({gap} of the range apart)"
                    );
                    ties += 1;
                    eprintln!("step {s} sequence {q}: near tie, {gap:.2e} of the range");
                }
            }
        }
    }
    assert_eq!(cpu_run.1, gpu_run.1, "greedy tokens fed back differ");
    eprintln!(
        "{compared} logit rows compared: worst error {worst:.2e} of the logit range; \
         greedy tokens identical but for {ties} near ties"
    );
}

/// The device pool keeps pages across steps and the rows steps compute stay there:
/// a page is uploaded only when the host's copy changed (its generation), the fork's
/// and the truncation's copies are made on the device, and nothing comes back to the
/// host; every logit is the same bits as when every step uploads all it reads and
/// sends its new rows back (storage that shows no generations and holds no rows).
#[test]
fn pages_stay_on_the_device_and_no_logit_bit_changes() {
    let gpu = match Gpu::open(true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e} (install mesa-vulkan-drivers for lavapipe)");
            return;
        }
    };
    let path = model_path();
    let model = Model::load(&path, 2).unwrap();
    // llama.cpp's arithmetic (8-bit matmul inputs): what is held here does not depend
    // on it, and on lavapipe its kernels run the scenario (twice) in a third of the
    // time the f32-input ones take.
    let backend = GpuBackend::load(gpu, &path, &model.config)
        .unwrap()
        .with_llama_arithmetic(true);
    let uploads = backend.uploads();
    let m = model.with_backend(|_cpu| Box::new(backend));
    let (kept, sent) = ragged(&m, 3, true, Some(&uploads), None, KvDtype::F16);
    let after_kept = uploads.get();
    let (afresh, _) = ragged(&m, 3, false, None, None, KvDtype::F16);
    let after_afresh = uploads.get();
    assert_eq!(kept.1, afresh.1, "greedy tokens");
    for (s, (x, y)) in kept.0.iter().zip(&afresh.0).enumerate() {
        for (q, (a, b)) in x.iter().zip(y).enumerate() {
            let bits = |r: &[f32]| r.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(bits(a) == bits(b), "step {s} sequence {q}: logits differ");
        }
    }
    // Step 1 reads nothing stored; step 2 reads what step 1 left on the device and the
    // two copies (the fork's partial page, the truncation's committed one), which the
    // device made itself. The decode steps read only pages the device wrote or holds.
    assert_eq!(sent, vec![0; sent.len()], "pages uploaded after each step");
    assert_eq!(after_kept.device_copies, 2, "the copies made on the device");
    assert_eq!(after_kept.fetched_pages, 0, "nothing read back");
    assert_eq!(after_kept.written_back, 0, "no rows sent back");
    let afresh_pages = after_afresh.pages - after_kept.pages;
    assert!(afresh_pages > 20, "{afresh_pages} pages uploaded afresh");
    assert!(after_afresh.written_back > 0, "rows sent back");
    eprintln!(
        "kept: {} pages uploaded ({} reads skipped), {} device copies, {} bytes read back; \
         afresh: {afresh_pages} pages ({} bytes) uploaded, {} bytes of rows sent back",
        after_kept.pages,
        after_kept.skipped,
        after_kept.device_copies,
        after_kept.fetched_bytes,
        after_afresh.bytes - after_kept.bytes,
        after_afresh.written_back,
    );
}

#[test]
fn the_engine_on_the_gpu_generates_the_cpus_greedy_tokens() {
    let Some((cpu, gpu)) = models(|b| b) else {
        return;
    };
    let cfg = || EngineConfig {
        kv_pages: 48,
        page_size: 16,
        max_batch_tokens: 64,
        snapshot_dir: None,
        ..Default::default()
    };
    let engines = [
        Engine::new(cpu, cfg()).unwrap(),
        Engine::new(gpu, cfg()).unwrap(),
    ];
    let request = |i: usize| {
        let prompt = format!(
            "Name {} rivers of Europe and say where each one ends.",
            2 + i
        );
        let mut r = Request::new(Prompt::Text(prompt));
        r.max_tokens = 12;
        r.n = 2;
        r.sampling = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        r
    };
    let mut got = [Vec::new(), Vec::new()];
    for (e, got) in engines.iter().zip(&mut got) {
        // Four requests at once (a ragged batch: chunked prefill beside decoding), each
        // sampled twice (forked pages).
        let streams: Vec<_> = (0..4).map(|i| e.submit(request(i)).unwrap()).collect();
        for s in streams {
            for c in s.collect_all().unwrap() {
                got.push(c.ids);
            }
        }
        // A context: appended, forked, truncated back across a page, generated on.
        let ctx = e.context(None).unwrap();
        ctx.append_text("The quick brown fox jumps over the lazy dog. Then the dog")
            .unwrap();
        ctx.flush().unwrap();
        let fork = ctx.fork().unwrap();
        fork.truncate(5).unwrap();
        for c in [&ctx, &fork] {
            let mut r = Request::new(Prompt::Tokens(Vec::new()));
            r.max_tokens = 10;
            r.sampling = SamplingParams {
                temperature: 0.0,
                ..Default::default()
            };
            let out = c.generate(r).unwrap().collect_all().unwrap();
            got.push(out[0].ids.clone());
        }
    }
    assert_eq!(got[0].len(), 10);
    assert_eq!(
        got[0], got[1],
        "the GPU engine's greedy tokens differ from the CPU's"
    );
}
