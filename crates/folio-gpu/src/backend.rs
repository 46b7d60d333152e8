//! [`GpuBackend`]: folio's [`Backend`] on a wgpu device. It owns the weights in
//! device memory ([`crate::weights`]), the compiled kernels and the device's K/V pool
//! ([`crate::pool`], whose module doc states which pages each step uploads). Each step
//! lays the batch out ([`crate::table`]), uploads the pages it reads that the device
//! does not hold, runs ([`crate::step`]), leaves every new row's K and V on the device
//! and records them as held there in the host storage ([`KvStorage::hold`]: the
//! storage reads them back when the host needs them), and hands back the requested
//! logits or hidden states.
//!
//! Its arithmetic is not the CPU's (by default f32 matmul inputs where the CPU rounds
//! them to 8 bits, plus its own summation orders; or, with
//! [`GpuBackend::with_llama_arithmetic`], 8-bit inputs as llama.cpp's): its
//! [`Backend::kv_signature`] keeps its K/V out of the CPU's prefix cache and
//! snapshots, and the tests hold its logits to the CPU's within a tolerance, not bit
//! for bit, and to the exact model's fidelity bound.

use crate::arena::Arena;
use crate::device::Gpu;
use crate::error::GpuError;
use crate::kernels::Kernels;
use crate::pool::{Pool, Uploads};
use crate::profile::Profile;
use crate::step::{self, Step};
use crate::table::{StepTable, TableError};
use crate::weights::{self, Weights};
use folio::gguf::Gguf;
use folio::kv::{DevicePages, KvRows, KvStorage};
use folio::model::{Backend, BackendFigure, Config, Model, StepError, StepLogits};
use folio::Batch;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

/// The forward step on a GPU.
pub struct GpuBackend {
    gpu: Gpu,
    kernels: Kernels,
    weights: Weights,
    /// The device pools (`GpuBackend::pool_for`).
    pools: Mutex<Pools>,
    /// The step's buffers and bind groups, kept across steps (`arena.rs`).
    arena: Mutex<Arena>,
    uploads: Uploads,
    /// Matmul inputs rounded to 8 bits as llama.cpp (and the CPU backend) round them;
    /// off by default: f32 inputs put the GPU nearer the exact model.
    llama: bool,
    /// Which 8-bit inputs the matmuls read with that arithmetic
    /// (`step::eight_bit_inputs`, set with it).
    inputs: (bool, bool),
    /// Where steps are profiled dispatch by dispatch (`profile.rs`).
    profile: Option<Profile>,
}

impl GpuBackend {
    /// The weights of the GGUF file at `path` (whose configuration is `config`, as the
    /// model loaded it) uploaded to `gpu`. A model the GPU path does not run is
    /// [`GpuError::Unsupported`].
    pub fn load(gpu: Gpu, path: &Path, config: &Config) -> Result<Self, GpuError> {
        Self::load_from(gpu, &Gguf::open(path)?, config)
    }

    /// [`GpuBackend::load`] from the open file `g` (what `Model::load_onto` hands a
    /// backend: the model then never packs the CPU's weights).
    pub fn load_from(gpu: Gpu, g: &Gguf, config: &Config) -> Result<Self, GpuError> {
        weights::check(config)?;
        let weights = gpu.scoped_as(|| weights::load(&gpu, g, config), GpuError::Device)?;
        let kernels = Kernels::for_formats(&gpu, true, &weights.formats())?;
        tracing::info!(
            adapter = %gpu.adapter().name,
            widened = weights.widened,
            bytes = weights.bytes_per_token(),
            subgroup = ?kernels.subgroup,
            "gpu: weights uploaded"
        );
        Ok(GpuBackend {
            gpu,
            kernels,
            weights,
            pools: Mutex::default(),
            arena: Mutex::new(Arena::default()),
            uploads: Uploads::default(),
            llama: false,
            inputs: (false, false),
            profile: None,
        })
    }

    /// `model` (loaded from `path`) moved onto `gpu`, its CPU backend dropped, with
    /// llama.cpp's arithmetic or not ([`GpuBackend::with_llama_arithmetic`]); or, where
    /// the GPU path cannot run it, `model` unchanged and why.
    pub fn put_on(
        model: Model,
        path: &Path,
        gpu: Gpu,
        llama_arithmetic: bool,
    ) -> (Model, Result<(), GpuError>) {
        match Self::load(gpu, path, &model.config) {
            Ok(b) => {
                let b = b.with_llama_arithmetic(llama_arithmetic);
                (model.with_backend(|_cpu| Box::new(b)), Ok(()))
            }
            Err(e) => (model, Err(e)),
        }
    }

    /// The same backend with llama.cpp's arithmetic (every matmul input rounded to
    /// 8-bit blocks, as the CPU backend's `Model::llama_arithmetic`), or without.
    pub fn with_llama_arithmetic(mut self, on: bool) -> Self {
        self.llama = on;
        self.inputs = step::eight_bit_inputs(&self.kernels, &self.weights, on);
        self
    }

    /// The same backend with the matmuls' work split for a GPU (many lanes an output)
    /// or for a software adapter (one): by default the adapter's kind picks
    /// (`Settings::wide`). The results differ in their last bits (another order of sums).
    pub fn with_wide_matmuls(mut self, on: bool) -> Self {
        self.kernels.set.wide = on;
        self
    }

    /// The same backend with each matrix of several parts (Q, K and V; gate and up) in
    /// one dispatch and a norm quantizing its rows for 8-bit inputs (the default), or
    /// (`on` false) one dispatch per part and the quantizations after the norm: the
    /// same bits (`matmul_common.wgsl`, `norm.wgsl`); for measuring what fewer
    /// dispatches are worth.
    pub fn with_fused_matmuls(mut self, on: bool) -> Self {
        self.kernels.set.fused = on;
        self
    }

    /// The same backend with attention's query heads that share a K/V head in one
    /// workgroup (the default: each key's K and V read once for them all), or (`on`
    /// false) a head a workgroup: the same bits (`attention.wgsl`); for measuring.
    pub fn with_grouped_attention(mut self, on: bool) -> Self {
        self.kernels.set.grouped_attention = on;
        self
    }

    /// The same backend with the matmuls' lane sums added within subgroups where the
    /// device has them (the default), or (`on` false) in workgroup memory: the same
    /// bits either way (`reduce_subgroup.wgsl`); for measuring what subgroups are worth.
    /// The kernels are compiled again.
    pub fn with_subgroups(mut self, on: bool) -> Result<Self, GpuError> {
        // Only turning them off changes anything: the kernels already use them where
        // the device has them.
        if !on && self.kernels.subgroup.is_some() {
            let set = self.kernels.set;
            self.kernels = Kernels::for_formats(&self.gpu, false, &self.kernels.formats())?;
            self.kernels.set = set;
        }
        Ok(self)
    }

    /// The same backend with the head run over at most `rows` picked rows a pass (by
    /// default as many as one binding's logits hold): for tests of the pieces.
    pub fn with_head_rows(mut self, rows: usize) -> Self {
        self.kernels.set.head_rows = rows.max(1);
        self
    }

    /// The same backend with attention split at every `keys` keys (`attention.wgsl`;
    /// 256 by default): for tests of the split, and tuning.
    pub fn with_attention_chunk(mut self, keys: u32) -> Self {
        self.kernels.set.attention_chunk = keys.max(1);
        self
    }

    /// The same backend with each step timed dispatch by dispatch into a [`Profile`]
    /// (`on`; [`GpuBackend::profile`] reads it), or not. The timestamps take some
    /// device time of their own. A device that writes no timestamps inside a compute
    /// pass profiles nothing (with a warning; `profile` is then `None`).
    pub fn with_profile(mut self, on: bool) -> Self {
        if on && !self.gpu.timestamps {
            tracing::warn!(
                "gpu: no profile: {} writes no timestamps inside a compute pass",
                self.gpu.adapter().name
            );
        }
        self.profile = (on && self.gpu.timestamps).then(Profile::default);
        self
    }

    /// The steps' profile, where they are profiled ([`GpuBackend::with_profile`]).
    pub fn profile(&self) -> Option<Profile> {
        self.profile.clone()
    }

    /// The adapter the backend runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// A handle on what moves between the host's storage and the device pool: pages
    /// uploaded, page reads skipped because the device holds the host's generation,
    /// pages read back, copies made on the device (`pool.rs`).
    pub fn uploads(&self) -> Uploads {
        self.uploads.clone()
    }

    /// The device pool for `kv`'s pages of `page_size` slots ([`Self::find_or_make_pool`]),
    /// attached to a storage that can hold rows on the device.
    fn pool_for(
        &self,
        config: &Config,
        kv: &mut dyn KvStorage,
        page_size: usize,
    ) -> Result<Arc<Pool>, StepError> {
        let pool = self.find_or_make_pool(config, &*kv, page_size)?;
        if pool.owner.is_some() {
            let device: Arc<dyn DevicePages> = pool.clone();
            kv.attach(&device)
                .map_err(|e| StepError::Device(e.to_string()))?;
        }
        Ok(pool)
    }

    /// The device pool for `kv`: the one it has (the same sizes, element type and
    /// storage), else a new one (`pool.rs`: a pool belongs to one storage, which keeps
    /// it alive while it holds rows there; the backend keeps only a weak reference to
    /// it, and the last pool of storage that holds no rows).
    fn find_or_make_pool(
        &self,
        config: &Config,
        kv: &dyn KvStorage,
        page_size: usize,
    ) -> Result<Arc<Pool>, StepError> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let n_pages = kv.num_pages();
        let q8 = n_pages > 0 && matches!(kv.run(0, 0, 0).0, KvRows::Q8 { .. });
        let owner = kv.identity();
        let fits = |p: &Pool| {
            p.n_pages == n_pages && p.page_size == page_size && p.q8 == q8 && p.owner == owner
        };
        pools.owned.retain(|w| w.strong_count() > 0);
        let found = match owner {
            Some(_) => pools
                .owned
                .iter()
                .filter_map(Weak::upgrade)
                .find(|p| fits(p)),
            None => pools.shared.clone().filter(|p| fits(p)),
        };
        if let Some(p) = found {
            return Ok(p);
        }
        if owner.is_none() {
            pools.shared = None;
        }
        let (layers, kvd, hd) = (config.n_layers, config.kv_dim(), config.head_dim);
        let p = self.gpu.scoped(|| {
            let stats = self.uploads.clone();
            let pages = (n_pages, page_size);
            Pool::new(&self.gpu, layers, pages, (kvd, hd), (q8, owner), stats)
        });
        let p = Arc::new(p.map_err(StepError::Device)?);
        match owner {
            Some(_) => pools.owned.push(Arc::downgrade(&p)),
            None => pools.shared = Some(p.clone()),
        }
        Ok(p)
    }
}

/// The backend's device pools (`GpuBackend::pool_for`).
#[derive(Default)]
struct Pools {
    /// Those of storages that hold rows on the device (each keeps its own alive).
    owned: Vec<Weak<Pool>>,
    /// The last one of storage that holds none.
    shared: Option<Arc<Pool>>,
}

impl Backend for GpuBackend {
    fn describe(&self) -> String {
        let a = self.gpu.adapter();
        let kind = if a.software { ", software" } else { "" };
        let split = if self.kernels.set.wide {
            "wide"
        } else {
            "narrow"
        };
        let fused = if self.kernels.set.fused {
            ""
        } else {
            ", one matrix a dispatch"
        };
        let heads = if self.kernels.set.grouped_attention {
            ""
        } else {
            ", attention a head a workgroup"
        };
        let sums = match self.kernels.subgroup {
            Some(size) => format!("in subgroups of {size}"),
            None => "in workgroup memory".into(),
        };
        let inputs = if self.llama { ", 8-bit inputs" } else { "" };
        format!(
            "gpu {} ({}{kind}) wgpu/vulkan, matmuls {split}{fused}{inputs}, lane sums {sums}{heads}",
            a.name,
            a.driver.trim()
        )
    }

    fn threads(&self) -> usize {
        1
    }

    fn bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token()
    }

    fn kv_signature(&self) -> Vec<u8> {
        if self.llama {
            // v2: the K-quants read 8-bit inputs too (2026-12-07).
            b"gpu:wgpu:q8-inputs:v2".to_vec()
        } else {
            b"gpu:wgpu:f32-inputs:v1".to_vec()
        }
    }

    /// The device's memory (weight matrices, K/V pools) and what moved between host
    /// and device ([`UploadStats`](crate::UploadStats)).
    fn figures(&self) -> Vec<BackendFigure> {
        let weights: u64 = self
            .weights
            .matrices()
            .chain(self.weights.embed.as_ref())
            .flat_map(|m| &m.pieces)
            .map(|(b, _, _)| b.size())
            .sum();
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let live = pools.owned.iter().filter_map(Weak::upgrade);
        let kv: u64 = live
            .chain(pools.shared.clone())
            .map(|p| p.k.iter().chain(&p.v).map(|b| b.size()).sum::<u64>())
            .sum();
        drop(pools);
        let u = self.uploads.get();
        let gauge = |name, help, value| BackendFigure {
            name,
            help,
            counter: false,
            value,
        };
        let counter = |name, help, value| BackendFigure {
            name,
            help,
            counter: true,
            value,
        };
        vec![
            gauge("device_weight_bytes", "Bytes of weight matrices in device memory.", weights),
            gauge("device_kv_pool_bytes", "Bytes of K/V pools in device memory.", kv),
            counter(
                "device_kv_uploaded_pages_total",
                "K/V pages uploaded to the device (a restored snapshot's, the disk tier's, pages the host wrote).",
                u.pages,
            ),
            counter("device_kv_uploaded_bytes_total", "Bytes of those uploads.", u.bytes),
            counter(
                "device_kv_read_back_pages_total",
                "K/V pages read back from the device (snapshots to files, the disk tier).",
                u.fetched_pages,
            ),
            counter("device_kv_read_back_bytes_total", "Bytes of those read-backs.", u.fetched_bytes),
            counter(
                "device_kv_copies_total",
                "Copy-on-write page copies made on the device (forks, truncations).",
                u.device_copies,
            ),
        ]
    }

    /// A dispatch's grid holds 65535 workgroups along an axis, and the step's kernels
    /// lay rows along one.
    fn max_step_rows(&self) -> Option<usize> {
        Some(65535)
    }

    /// The device pool for `kv`, allocated now: a pool larger than the device binds,
    /// or than its memory holds, is an error when the engine starts.
    fn prepare(
        &self,
        config: &Config,
        kv: &mut dyn KvStorage,
        page_size: usize,
    ) -> Result<(), StepError> {
        if kv.num_pages() == 0 || page_size == 0 {
            return Ok(());
        }
        self.pool_for(config, kv, page_size).map(|_| ())
    }

    fn step(
        &self,
        config: &Config,
        batch: &Batch,
        kv: &mut dyn KvStorage,
        out: &mut StepLogits,
    ) -> Result<(), StepError> {
        let table =
            StepTable::new(batch, |start| config.kv_needed_from(start)).map_err(|e| match e {
                TableError::MixedPageSizes => {
                    StepError::Device("one step's sequences have different page sizes".into())
                }
            })?;
        if let Some(why) = self.gpu.lost() {
            return Err(StepError::Device(why));
        }
        if table.rows.is_empty() {
            // Nothing to run (and no page size to size a pool by).
            out.reset(config.vocab, batch.seqs.iter().map(|s| s.logit_rows()));
            out.reset_states(config.dim, batch.seqs.iter().map(|s| s.state_rows()));
            return Ok(());
        }
        let pool = self.pool_for(config, kv, table.page_size)?;
        // Storage that can hold rows on the device keeps this step's there.
        let holds = pool.owner.is_some();
        // In the device's error scopes: an upload the device refused must not leave a
        // page recorded as held.
        if let Err(e) = self.gpu.scoped(|| pool.upload(&*kv, &table.reads)) {
            pool.forget_sent();
            return Err(StepError::Device(e));
        }
        let before = pool.before_writes(&*kv, &table.writes);
        let step = Step {
            gpu: &self.gpu,
            kernels: &self.kernels,
            weights: &self.weights,
            config,
            pool: &pool,
            table: &table,
            llama: self.llama,
            inputs: self.inputs,
            write_back: !holds,
            profile: self.profile.as_ref(),
        };
        let mut arena = self.arena.lock().unwrap_or_else(|p| p.into_inner());
        let got = match self.gpu.scoped(|| step.run(batch, &mut arena)) {
            Ok(got) => got,
            Err(e) => {
                pool.failed(&table.writes);
                return Err(StepError::Device(e));
            }
        };
        if holds {
            for (&page, &(a, b)) in &table.writes {
                kv.hold(page, a..b);
            }
            pool.wrote(&*kv, &table.writes, &before);
        } else {
            // Every new row's K and V to the host's storage.
            let d = config.kv_dim();
            let n = table.rows.len();
            for (r, &(s, pos)) in table.rows.iter().enumerate() {
                let (page, slot) = batch.seqs[s].slot(pos);
                for layer in 0..config.n_layers {
                    let at = (layer * n + r) * d;
                    kv.write(page.0, layer, slot, &got.k[at..at + d], &got.v[at..at + d]);
                }
            }
            let bytes = (got.k.len() + got.v.len()) as u64 * 4;
            pool.stats.add(|s| s.written_back += bytes);
            match pool.q8 {
                // The host quantized the rows again: its bits may differ (`pool.rs`).
                true => pool.forget(table.writes.keys()),
                false => pool.wrote(&*kv, &table.writes, &before),
            }
        }
        out.reset(config.vocab, batch.seqs.iter().map(|s| s.logit_rows()));
        out.data_mut().copy_from_slice(&got.logits);
        out.reset_states(config.dim, batch.seqs.iter().map(|s| s.state_rows()));
        out.states_mut().copy_from_slice(&got.states);
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        if !finite(&got.logits) || !finite(&got.states) {
            return Err(StepError::NonFinite);
        }
        Ok(())
    }
}
