//! Shared helpers of the integration tests: where the default model and the fixtures are.
#![allow(dead_code)]

use std::path::PathBuf;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model, fetched by `scripts/setup.sh`. Tests run the real model: a
/// missing file is a failure with instructions, never a skip.
/// A tiny random Q4_1 model (`folio::tiny`, from `seed`) in a temporary directory,
/// loaded on `threads` threads; keep the directory while the model is used.
pub fn tiny_model(seed: u64, threads: usize) -> (tempfile::TempDir, folio::Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    folio::tiny::write_model(&path, seed, folio::gguf::GgmlType::Q4_1).unwrap();
    let m = folio::Model::load(&path, threads).unwrap();
    (dir, m)
}

pub fn model_path() -> PathBuf {
    let p = std::env::var_os("FOLIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run `scripts/setup.sh` (it fetches the default model)",
        p.display()
    );
    p
}

/// One of llama.cpp's vocab-only GGUFs (`ggml-vocab-NAME.gguf`, with its `.inp` and
/// `.out` test texts), fetched by `scripts/setup.sh` into `models/vocab/`. A missing
/// file is a failure with instructions, never a skip.
pub fn vocab_path(name: &str) -> PathBuf {
    let p = root().join(format!("models/vocab/ggml-vocab-{name}.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run `scripts/setup.sh` (it fetches the tokenizer vocabularies)",
        p.display()
    );
    p
}

pub fn fixtures(name: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture file")).expect("fixture JSON")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A fixture case teacher-forced through `m` in one pass (prompt_ids + greedy_ids):
/// for each position of its `top5`, folio's log-probabilities of the next token and the
/// fixture's top-5 `[id, logprob]` there; `visit` also gets |folio − fixture| for each
/// of the five.
pub fn teacher_forced(
    m: &Model,
    case: &serde_json::Value,
    mut visit: impl FnMut(usize, &[f32], &[serde_json::Value], &[f64]),
) {
    let vocab = m.config.vocab;
    let seq: Vec<u32> = ids(&case["prompt_ids"])
        .into_iter()
        .chain(ids(&case["greedy_ids"]))
        .collect();
    let mut cache = m.new_cache(seq.len());
    let logits = m
        .run(&mut cache, &seq[..seq.len() - 1], Logits::All)
        .unwrap();
    for (i, top) in case["top5"].as_array().unwrap().iter().enumerate() {
        let row = &logits[i * vocab..(i + 1) * vocab];
        let lp = folio::model::sampler::log_softmax(row);
        let top = top.as_array().unwrap();
        let diffs: Vec<f64> = top
            .iter()
            .map(|e| (lp[e[0].as_u64().unwrap() as usize] - e[1].as_f64().unwrap()).abs())
            .collect();
        visit(i, row, top, &diffs);
    }
}

use folio::kv::{BasicCache, KvDtype, KvSeq, Logits, PagedKv};
use folio::model::{Sampler, SamplingParams};
use folio::tokenizer::StreamDecoder;
use folio::{EngineError, FinishReason, Model};

/// Caches and single-sequence steps in one call, as the tests use them.
pub trait ModelExt {
    fn new_cache(&self, capacity: usize) -> BasicCache;
    fn new_cache_as(&self, dtype: KvDtype, capacity: usize) -> BasicCache;
    fn new_paged(&self, pages: usize, page_size: usize, max_tokens: usize) -> PagedKv;
    fn new_paged_as(
        &self,
        dtype: KvDtype,
        pages: usize,
        page_size: usize,
        max_tokens: usize,
    ) -> PagedKv;
    /// One step of one sequence: `folio::forward_one`.
    fn run<S: KvSeq>(
        &self,
        seq: &mut S,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, EngineError>;
}

impl ModelExt for Model {
    fn new_cache(&self, capacity: usize) -> BasicCache {
        self.new_cache_as(KvDtype::F16, capacity)
    }
    fn new_cache_as(&self, dtype: KvDtype, capacity: usize) -> BasicCache {
        let c = &self.config;
        BasicCache::with_dtype(
            c.n_layers,
            c.kv_dim(),
            c.head_dim,
            capacity.min(c.context_length),
            dtype,
        )
    }
    fn new_paged(&self, pages: usize, page_size: usize, max_tokens: usize) -> PagedKv {
        self.new_paged_as(KvDtype::F16, pages, page_size, max_tokens)
    }
    fn new_paged_as(
        &self,
        dtype: KvDtype,
        pages: usize,
        page_size: usize,
        max_tokens: usize,
    ) -> PagedKv {
        PagedKv::with_shape(
            self.pool_shape(pages, page_size, dtype),
            max_tokens.min(self.config.context_length),
            &self.fingerprint(),
        )
    }
    fn run<S: KvSeq>(
        &self,
        seq: &mut S,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, EngineError> {
        folio::forward_one(self, seq, tokens, logits)
    }
}

/// What the test oracle generates.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub ignore_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            ignore_eos: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    /// Prompt tokens whose K/V the sequence already held or found indexed.
    pub prefix_hit_tokens: usize,
}

/// The oracle completion on one sequence, with no engine: reuse what the cache holds
/// of the prompt, prefill the rest, then sample token by token (the engine's finish
/// rules: EOS, `max_tokens`, a full sequence).
pub fn generate<S: KvSeq>(
    model: &Model,
    cache: &mut S,
    prompt: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Output, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if prompt.len() >= cache.capacity() {
        return Err(EngineError::PromptTooLong {
            len: prompt.len(),
            window: cache.capacity(),
        });
    }
    let hit = cache.reuse_prefix(prompt);
    let mut logits = folio::forward_one(model, cache, &prompt[hit..], Logits::Last)?;
    let mut sampler = Sampler::new(params.sampling.clone());
    let mut history = prompt.to_vec();
    let (mut ids, mut text, mut dec) = (Vec::new(), String::new(), StreamDecoder::default());
    let tok = &model.tokenizer;
    let finish = loop {
        let id = sampler.sample(&logits, &history);
        ids.push(id);
        history.push(id);
        if tok.is_eog(id) && !params.ignore_eos {
            break FinishReason::Eos;
        }
        let piece = dec.push(tok, id);
        on_text(&piece);
        text.push_str(&piece);
        if ids.len() >= params.max_tokens || cache.len() + 1 > cache.capacity() {
            break FinishReason::Length;
        }
        logits = folio::forward_one(model, cache, &[id], Logits::Last)?;
    };
    let tail = dec.finish();
    on_text(&tail);
    text.push_str(&tail);
    Ok(Output {
        ids,
        text,
        finish,
        prefix_hit_tokens: hit,
    })
}

/// One batched step over several tables of one pool, as the engine runs it: slots
/// reserved for each step, the model run on the batch, full pages committed (or the
/// slots given back when the step fails).
pub fn forward_tables(
    m: &Model,
    kv: &mut PagedKv,
    tables: &mut [&mut folio::kv::PageTable],
    steps: &[(&[u32], Logits)],
) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut batch = folio::Batch::default();
    for (i, (t, (toks, want))) in tables.iter_mut().zip(steps).enumerate() {
        match kv.plan(t, toks, *want) {
            Ok(s) => batch.seqs.push(s),
            Err(e) => {
                for (t, (toks, _)) in tables[..i].iter_mut().zip(steps) {
                    kv.abort(t, toks.len());
                }
                return Err(e.into());
            }
        }
    }
    match m.forward(&batch, kv.storage()) {
        Ok(out) => {
            for t in tables.iter_mut() {
                kv.commit(t)?;
            }
            Ok(out)
        }
        Err(e) => {
            for (t, (toks, _)) in tables.iter_mut().zip(steps) {
                kv.abort(t, toks.len());
            }
            Err(e.into())
        }
    }
}
