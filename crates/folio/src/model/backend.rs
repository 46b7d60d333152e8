//! The backend seam: what a model's forward step runs on. [`Model`](super::Model) owns
//! the description (config, tokenizer, context window) and one [`Backend`], which owns
//! the weights in its own form and runs each step; the scheduler, the engine and the
//! server only ever call `Model::forward_into`, so a new backend changes none of them.
//! [`CpuBackend`](super::CpuBackend) is the one this crate ships.
//!
//! # The contract
//!
//! - **Pages.** The `kv` layer owns page ids: it allocates them, keeps every table,
//!   refcount and prefix hash, and plans each step's [`Batch`] (sequence `s` runs its
//!   tokens at positions `start..` through pages `batch.seqs[s].pages`, all reserved
//!   before the step). A backend never allocates, frees or renames a page.
//! - **K/V.** A step gets the pool's [`KvStorage`], addressed by (page id, layer,
//!   slot). Before the step returns, the K and V of every new token row are in its slot
//!   there, written through [`KvStorage::write`]: that storage is where forks'
//!   copy-on-write, truncation, snapshots and the prefix cache find them. A backend may
//!   keep pages elsewhere too (device memory, keyed by the same page ids), but must read
//!   the storage's contents for any page it did not write itself in this process: the
//!   kv layer changes pages between steps (copy-on-write copies, snapshot restores),
//!   and each change gives the page a new [`KvStorage::generation`]. A backend with
//!   such a copy may instead leave a step's rows there, where the storage has an
//!   [`KvStorage::identity`]: it attaches its copy ([`KvStorage::attach`], a
//!   [`DevicePages`](crate::kv::DevicePages)) and records the slots it wrote
//!   ([`KvStorage::hold`]); the storage reads them back from the device when the host
//!   needs them (a snapshot's file, the disk tier) and asks the device to make
//!   copy-on-write copies of them.
//!   A row reads only keys at positions up to its own, of its own sequence.
//! - **When.** Steps are sequential (`&self`, but the engine never overlaps two); within
//!   a step every row's K/V is written before any row of that layer reads it.
//! - **Logits.** `out` gets `vocab` values per requested position, in the batch's
//!   order ([`StepLogits`]). A step whose logits are not all finite is
//!   [`StepError::NonFinite`]; the batch was checked by the model before the call.
//! - **Hidden states.** A sequence whose step asks for
//!   [`Logits::Hidden`](crate::kv::Logits::Hidden) (embeddings) gets no logits:
//!   `out`'s states ([`StepLogits::reset_states`], `dim` values per row,
//!   [`StepLogits::states`]) get the hidden state of each of its new tokens after the
//!   final norm, the head's input (HF's `last_hidden_state`), and the head need not
//!   run for it. Its K/V are written as for any other row. The states fall under the
//!   same rules as logits: all finite or [`StepError::NonFinite`], the same bits
//!   whatever else is in the batch, however the prompt was chunked, on any thread
//!   count. A backend sizes the states buffer every step (empty when no sequence asks).
//! - **Same bits.** Within one backend, a sequence's logits and K/V are the same bits
//!   whatever else is in the batch, however its prompt was split into chunks, and
//!   however many threads run it (the bit-invariance tests hold every backend to
//!   this). Across backends nothing is promised bit for bit: each is held to the
//!   fidelity bound (distance from the float64 model no worse than llama.cpp's), and
//!   K/V computed by one is never reused by another: [`Backend::kv_signature`] goes
//!   into the model's fingerprint, which keys the prefix cache and snapshots.

use super::config::Config;
use super::cpu::CpuBackend;
use super::error::StepError;
use super::step_logits::StepLogits;
use crate::kv::{Batch, KvStorage};

/// One figure a backend reports about itself (`/metrics` shows it as `folio:NAME`):
/// what it keeps on a device and what moved between host and device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendFigure {
    /// The metric's name without the prefix (`device_kv_read_back_bytes_total`).
    pub name: &'static str,
    pub help: &'static str,
    /// A counter (it only grows; the name ends in `_total`), else a gauge.
    pub counter: bool,
    pub value: u64,
}

/// Where a model's forward steps run (see the module doc for the contract).
pub trait Backend: Send + Sync {
    /// What runs the steps, for logs and `bench` ("cpu avx512 ×2 threads").
    fn describe(&self) -> String;

    /// Threads a step keeps busy on the host (the engine's masks use the others).
    fn threads(&self) -> usize;

    /// Bytes of weights one decode step reads (for bandwidth figures).
    fn bytes_per_token(&self) -> usize;

    /// What this backend's arithmetic adds to the model's fingerprint: bytes that
    /// differ wherever the K/V it computes may differ.
    fn kv_signature(&self) -> Vec<u8>;

    /// One forward step over a checked `batch` with `config` (the model's, with the
    /// RoPE its context window chose): K/V of every new token into `kv`, logits into
    /// `out` (and, for the sequences that ask for them, hidden states instead of
    /// logits: see the module doc).
    fn step(
        &self,
        config: &Config,
        batch: &Batch,
        kv: &mut dyn KvStorage,
        out: &mut StepLogits,
    ) -> Result<(), StepError>;

    /// Makes ready what the backend keeps beside `kv` (pages of `page_size` slots)
    /// before its first step, such as a device copy of the pool: a pool the backend
    /// cannot hold is an error here, when the engine starts, not at every step. Nothing
    /// to do by default.
    fn prepare(
        &self,
        _config: &Config,
        _kv: &mut dyn KvStorage,
        _page_size: usize,
    ) -> Result<(), StepError> {
        Ok(())
    }

    /// The most token rows one step may hold, where the backend has a limit (a GPU's
    /// dispatch grid): the engine plans no larger step. None by default.
    fn max_step_rows(&self) -> Option<usize> {
        None
    }

    /// The backend's own figures ([`BackendFigure`]); none by default.
    fn figures(&self) -> Vec<BackendFigure> {
        Vec::new()
    }

    /// The CPU backend this one is or wraps, for the settings only it has (the
    /// instruction-set path, llama.cpp's arithmetic).
    fn as_cpu(&self) -> Option<&CpuBackend> {
        None
    }

    /// [`Backend::as_cpu`], to change those settings.
    fn as_cpu_mut(&mut self) -> Option<&mut CpuBackend> {
        None
    }
}
