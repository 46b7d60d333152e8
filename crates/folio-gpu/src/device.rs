//! [`Gpu`]: one wgpu device on a Vulkan adapter, and what the backend asks of it
//! (limits, buffers in and out). Finding one never needs a GPU: no adapter is
//! [`GpuError::NoAdapter`], which callers turn into the CPU path. A software adapter
//! (Mesa's lavapipe: Vulkan on the CPU's cores) is used only when asked for
//! explicitly: [`Gpu::open`] with `allow_software`.
//!
//! # Device errors
//!
//! wgpu reports a device's errors through error scopes or, outside any scope, to a
//! handler whose default panics. Every piece of the backend's work runs in
//! [`Gpu::scoped`] (validation, out-of-memory and internal errors become an `Err` of
//! that call); the handler installed here only logs and remembers what reached it, and
//! a lost device (driver reset, unplugged, destroyed) is remembered likewise: every
//! later step is then an error ([`Gpu::lost`]), never a panic.

use crate::error::GpuError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A device and its queue (a clone is another handle on the same device).
#[derive(Clone)]
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    /// The subgroup size, where the device runs subgroup operations in subgroups of
    /// one fixed size (a power of two up to 64; `kernels.rs` checks how they are laid
    /// out before using them).
    pub(crate) subgroup: Option<u32>,
    /// The device writes timestamps between dispatches (what `--gpu-profile` reads:
    /// `profile.rs`).
    pub(crate) timestamps: bool,
    /// Why the device can no longer be used (lost), once it is so.
    lost: Arc<Mutex<Option<String>>>,
    /// Bytes [`Gpu::upload`] wrote since the queue last submitted them.
    unflushed: Arc<AtomicU64>,
}

/// Bytes uploaded between two submissions while a model loads (`Gpu::upload`).
const UPLOAD_FLUSH: u64 = 256 << 20;

/// What an adapter is, for logs and for the choice between hardware and software.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub driver: String,
    /// A software rasterizer on the CPU (lavapipe, SwiftShader).
    pub software: bool,
}

fn summary(info: &wgpu::AdapterInfo) -> AdapterSummary {
    AdapterSummary {
        name: info.name.clone(),
        driver: format!("{} {}", info.driver, info.driver_info),
        software: info.device_type == wgpu::DeviceType::Cpu,
    }
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

/// Whether this machine shows a GPU to programs: an NVIDIA device node or a DRM
/// render node (what Mesa's hardware drivers open), found without any Vulkan call.
/// `--device auto` asks this first, so a machine without a GPU pays neither the
/// Vulkan loader's start (about a second with lavapipe) nor its messages. (Mesa's
/// manifests for Intel and AMD are installed with lavapipe whether or not such a
/// GPU exists, so they say nothing.)
pub fn gpu_device_present() -> bool {
    let nvidia = std::path::Path::new("/dev/nvidia0").exists();
    let render = std::fs::read_dir("/dev/dri").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("renderD"))
    });
    nvidia || render
}

/// Every Vulkan adapter this machine has (none without a Vulkan loader or driver).
pub fn adapters() -> Vec<AdapterSummary> {
    let list = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::VULKAN));
    list.iter().map(|a| summary(&a.get_info())).collect()
}

impl Gpu {
    /// A device on the first hardware adapter, or (with `allow_software`) on a
    /// software one when there is no hardware one.
    pub fn open(allow_software: bool) -> Result<Self, GpuError> {
        let list = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::VULKAN));
        let seen: Vec<_> = list.iter().map(|a| a.get_info().name).collect();
        let pick = list
            .iter()
            .position(|a| a.get_info().device_type != wgpu::DeviceType::Cpu)
            .or_else(|| {
                allow_software
                    .then(|| (!list.is_empty()).then_some(0))
                    .flatten()
            });
        let Some(i) = pick else {
            let why = if seen.is_empty() {
                "no Vulkan adapter".to_string()
            } else {
                format!("only software adapters: {}", seen.join(", "))
            };
            return Err(GpuError::NoAdapter(why));
        };
        let adapter = &list[i];
        // The adapter's own limits: storage bindings as large as it binds, the
        // storage buffers per stage the kernels use (8).
        let limits = adapter.limits();
        let info = adapter.get_info();
        let size = info.subgroup_min_size;
        let mut subgroup = (adapter.features().contains(wgpu::Features::SUBGROUP)
            && size == info.subgroup_max_size
            && size.is_power_of_two()
            && size <= 64)
            .then_some(size);
        let request = |features| {
            let desc = wgpu::DeviceDescriptor {
                label: Some("folio"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            };
            pollster::block_on(adapter.request_device(&desc))
        };
        // Timestamps between dispatches, where the adapter writes them: asked for
        // always (they cost nothing until a profile writes them).
        let stamps =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let mut timestamps = adapter.features().contains(stamps);
        // A device refused with subgroups and timestamps is asked for again with each
        // alone (subgroups first), then with neither.
        let tries = [(true, true), (true, false), (false, true)];
        let can = |&(sg, ts): &(bool, bool)| {
            (sg || ts) && (!sg || subgroup.is_some()) && (!ts || timestamps)
        };
        let mut got = None;
        for (with_subgroups, with_stamps) in tries.into_iter().filter(can) {
            let mut features = wgpu::Features::empty();
            features.set(wgpu::Features::SUBGROUP, with_subgroups);
            features.set(stamps, with_stamps);
            match request(features) {
                Ok(device) => {
                    (subgroup, timestamps) = (subgroup.filter(|_| with_subgroups), with_stamps);
                    got = Some(device);
                    break;
                }
                Err(e) => tracing::warn!("gpu: a device with {features:?} refused: {e}"),
            }
        }
        let (device, queue) = match got {
            Some(got) => got,
            None => {
                subgroup = None;
                timestamps = false;
                request(wgpu::Features::empty()).map_err(|e| GpuError::Device(e.to_string()))?
            }
        };
        // Errors outside any scope: logged, never wgpu's default panic.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            tracing::error!("gpu: an error outside any step: {e}");
        }));
        let lost = Arc::new(Mutex::new(None));
        let on_lost = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, message| {
            let why = format!("the GPU device was lost ({reason:?}): {message}");
            tracing::error!("{why}");
            *on_lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        });
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            subgroup,
            timestamps,
            lost,
            unflushed: Arc::default(),
        })
    }

    /// Why the device can no longer run anything, once it is lost (module doc).
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Destroys the device, as a driver reset would lose it: every later step is an
    /// error. For tests of that path.
    #[doc(hidden)]
    pub fn destroy_for_tests(&self) {
        self.device.destroy();
    }

    /// Runs `f` with the device's validation, out-of-memory and internal errors
    /// caught: any of them (the first, in that order) is the call's `Err`, as is
    /// `f`'s own.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        self.scoped_as(f, |e| e)
    }

    /// [`Gpu::scoped`] for work whose errors are `E`, the device's made by `wrap`.
    pub(crate) fn scoped_as<T, E>(
        &self,
        f: impl FnOnce() -> Result<T, E>,
        wrap: impl Fn(String) -> E,
    ) -> Result<T, E> {
        if let Some(why) = self.lost() {
            return Err(wrap(why));
        }
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let got = f();
        let internal = pollster::block_on(internal.pop());
        let memory = pollster::block_on(memory.pop());
        let validation = pollster::block_on(validation.pop());
        if let Some(e) = validation {
            return Err(wrap(format!("gpu validation error: {e}")));
        }
        if let Some(e) = memory {
            return Err(wrap(format!("the GPU is out of memory: {e}")));
        }
        if let Some(e) = internal {
            return Err(wrap(format!("gpu internal error: {e}")));
        }
        if let Some(why) = self.lost() {
            return Err(wrap(why));
        }
        got
    }

    /// The adapter the device is on.
    pub fn adapter(&self) -> AdapterSummary {
        summary(&self.info)
    }

    /// The most bytes one storage binding may hold.
    pub(crate) fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// A storage buffer holding `bytes` (rounded up to whole words; never empty).
    /// Written through the queue, not mapped at creation: wgpu's mapped-at-creation
    /// helper panics on a lost device, where this gives a scoped error.
    ///
    /// The queue keeps a host copy of what is written until it submits: every
    /// [`UPLOAD_FLUSH`] bytes uploaded it submits and waits, so loading a model holds
    /// that much of such copies, not the whole model's.
    pub(crate) fn upload(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let buf = self.scratch(label, bytes.len() as u64);
        self.write_words(&buf, bytes);
        let len = bytes.len() as u64;
        if self.unflushed.fetch_add(len, Ordering::Relaxed) + len >= UPLOAD_FLUSH {
            self.unflushed.store(0, Ordering::Relaxed);
            self.queue.submit([]);
            // A failed wait (a lost device) shows in the caller's error scope.
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
        buf
    }

    /// `bytes`, zero-padded to whole words, to the start of `buf`.
    pub(crate) fn write_words(&self, buf: &wgpu::Buffer, bytes: &[u8]) {
        if bytes.len().is_multiple_of(4) && !bytes.is_empty() {
            self.queue.write_buffer(buf, 0, bytes);
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4).max(4), 0);
            self.queue.write_buffer(buf, 0, &padded);
        }
    }

    /// An uninitialised (zeroed) storage buffer of `bytes`.
    pub(crate) fn scratch(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.next_multiple_of(4).max(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// Submits `encoder`, in which `sources` were copied into `staging` back to back,
    /// waits, and returns the staging buffer's first `bytes` as floats (a kept staging
    /// buffer may be larger than this step's results).
    pub(crate) fn finish(
        &self,
        encoder: wgpu::CommandEncoder,
        staging: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<f32>, String> {
        self.queue.submit([encoder.finish()]);
        let slice = staging.slice(..bytes.max(4));
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| e.to_string())?;
        rx.recv()
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let view = slice.get_mapped_range().map_err(|e| e.to_string())?;
        let out = bytemuck::cast_slice::<u8, f32>(&view).to_vec();
        drop(view);
        staging.unmap();
        Ok(out)
    }

    /// A buffer to read `bytes` back into.
    pub(crate) fn staging(&self, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("staging"),
            size: bytes.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }
}
