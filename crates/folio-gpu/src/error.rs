//! [`GpuError`]: why the GPU backend could not be set up. A step's failures are the
//! model layer's [`folio::StepError`] (`Device` for the device's own).

use thiserror::Error;

/// Errors from finding a device or putting a model on it.
#[derive(Debug, Error)]
pub enum GpuError {
    /// No Vulkan adapter (or none of the kind asked for: a hardware one for `auto`).
    #[error("no GPU adapter found ({0})")]
    NoAdapter(String),
    /// The adapter refused a device with the limits the backend needs.
    #[error("the GPU adapter refused a device: {0}")]
    Device(String),
    /// The model needs something the GPU path does not run yet (the CPU runs it).
    #[error("not supported on the GPU backend yet: {0}")]
    Unsupported(String),
    /// A buffer the model needs is larger than the device binds.
    #[error("{what} takes {bytes} bytes, more than the device binds ({limit})")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    #[error(transparent)]
    Model(#[from] folio::ModelError),
    #[error(transparent)]
    Gguf(#[from] folio::GgufError),
}
