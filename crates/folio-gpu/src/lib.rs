//! folio's GPU backend: the forward step of every model family folio runs as WGSL
//! compute kernels on wgpu (Vulkan), behind folio's backend seam ([`folio::model::Backend`]).
//! The scheduler, contexts, snapshots and server run on it unchanged.
//!
//! - `device`: [`Gpu`], finding an adapter (hardware first; software only when asked)
//!   and the buffers in and out.
//! - `weights`: the weights uploaded once, every type folio reads in its
//!   blocks.
//! - `pool`: the device's K/V pages, by the host pool's page ids; what each step
//!   uploads (only pages whose host generation the device does not hold). `held`:
//!   the pool as the host storage reaches it, to read back K/V a step left there.
//! - `table`: a batch as the kernels read it (the CSR page tables).
//! - `kernels` (+ `wgsl/`): the compute kernels; `step`: one step's dispatches;
//!   `arena`: the step's buffers and bind groups, kept across steps; `profile`: a
//!   step's device time dispatch by dispatch (`--gpu-profile`).
//! - `backend`: [`GpuBackend`], the [`folio::model::Backend`].
//!
//! Nothing here needs a GPU to build or test: without an adapter [`Gpu::open`] is
//! [`GpuError::NoAdapter`] and callers stay on the CPU.

mod arena;
mod backend;
mod device;
mod error;
mod held;
mod kernels;
#[cfg(test)]
mod matmul_tests;
mod pool;
mod profile;
mod step;
mod table;
mod weights;

pub use backend::GpuBackend;
pub use device::{adapters, gpu_device_present, AdapterSummary, Gpu};
pub use error::GpuError;
pub use pool::{UploadStats, Uploads};
pub use profile::{DispatchTimes, Profile, StepTimes};
