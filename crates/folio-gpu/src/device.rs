//! [`Gpu`]: one wgpu device on a Vulkan adapter, and what the backend asks of it
//! (limits, buffers in and out). Finding one never needs a GPU: no adapter is
//! [`GpuError::NoAdapter`], which callers turn into the CPU path. A software adapter
//! (Mesa's lavapipe: Vulkan on the CPU's cores) is used only when asked for
//! explicitly: [`Gpu::open`] with `allow_software`.

use crate::error::GpuError;
use wgpu::util::DeviceExt;

/// A device and its queue.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
}

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
        let desc = wgpu::DeviceDescriptor {
            label: Some("folio"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| GpuError::Device(e.to_string()))?;
        Ok(Gpu {
            device,
            queue,
            info: adapter.get_info(),
            limits,
        })
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
    pub(crate) fn upload(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let mut padded;
        let contents = if !bytes.len().is_multiple_of(4) || bytes.is_empty() {
            padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4).max(4), 0);
            &padded[..]
        } else {
            bytes
        };
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
            })
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

    /// A uniform buffer of `words`, padded to 16 bytes.
    pub(crate) fn params(&self, words: &[u32]) -> wgpu::Buffer {
        let mut w = words.to_vec();
        w.resize(words.len().next_multiple_of(4).max(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: bytemuck::cast_slice(&w),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    /// Submits `encoder`, in which `sources` were copied into `staging` back to back,
    /// waits, and returns the staging buffer's floats.
    pub(crate) fn finish(
        &self,
        encoder: wgpu::CommandEncoder,
        staging: &wgpu::Buffer,
    ) -> Result<Vec<f32>, String> {
        self.queue.submit([encoder.finish()]);
        let slice = staging.slice(..);
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
