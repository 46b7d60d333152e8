//! What a backend keeps from one step to the next so that recording a step creates
//! (almost) no device objects: its working buffers by name, grown when a step needs
//! more (never shrunk), one uniform buffer holding every dispatch's parameters in
//! slots, and each dispatch's bind group, reused while the dispatch at that place in
//! the step binds the same kernel and buffers.
//!
//! Measured before (2026-12-07, Intel Xeon, lavapipe): recording a decode step of the
//! default model (30 layers, ~450 dispatches) took ~2 ms of host time, a new
//! parameter buffer and bind group per dispatch and some twenty new buffers per step;
//! on a GPU that reads a 1B model's weights in a quarter of a millisecond that host
//! time would be the step. The figures after are in docs/gpu.md.
//!
//! A step records its dispatches in order ([`Recorder::dispatch`]); dispatch `i`'s
//! parameters go to slot `i` of the parameter buffer, written once before the step is
//! submitted ([`Recorder::finish`]). Steps run one at a time (the backend's lock) and
//! each waits for its results, so a step's buffers are free when the next records.
//! Where steps are profiled the arena keeps the stamps' query set (`profile.rs`): the
//! recorder writes a stamp as the pass begins and one after each dispatch.

use crate::device::Gpu;
use crate::kernels::Kernel;
use crate::profile::{Timer, STAMPS};
use std::cell::RefCell;
use std::collections::HashMap;

/// A dispatch's bind group and what it binds.
struct Bound {
    kernel: usize,
    buffers: Vec<wgpu::Buffer>,
    group: wgpu::BindGroup,
}

/// The persistent part (held by the backend across steps).
#[derive(Default)]
pub(crate) struct Arena {
    buffers: HashMap<&'static str, wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
    params: Option<wgpu::Buffer>,
    /// Slots the parameter buffer holds, and the most a step has asked for.
    slots: usize,
    wanted: usize,
    bound: Vec<Option<Bound>>,
    /// Where steps have been profiled: their stamps' query set (`profile.rs`), and
    /// whether the passes recorded now are timed.
    timer: Option<Timer>,
    timing: bool,
}

/// A recorded pass: its encoder, its dispatches and, where the arena times them, what
/// each dispatch is and the buffer their stamps were resolved into (one before the
/// first, one after each: `kinds.len() + 1` of 8 bytes).
pub(crate) struct Recorded {
    pub encoder: wgpu::CommandEncoder,
    pub dispatches: usize,
    pub stamps: Option<(Vec<(String, u64)>, wgpu::Buffer)>,
}

/// Words of one dispatch's parameters (the largest kernel's, attention's, take 17).
const PARAM_WORDS: usize = 20;

impl Arena {
    /// The storage buffer `name`, at least `bytes` long (zeroed when new; otherwise it
    /// holds what the last step left).
    pub fn buffer(&mut self, gpu: &Gpu, name: &'static str, bytes: u64) -> wgpu::Buffer {
        let bytes = bytes.next_multiple_of(4).max(4);
        match self.buffers.get(name) {
            Some(b) if b.size() >= bytes => b.clone(),
            old => {
                let size = bytes
                    .max(old.map_or(0, |b| b.size() * 2))
                    .min(gpu.max_binding());
                let b = gpu.scratch(name, size.max(bytes));
                self.buffers.insert(name, b.clone());
                b
            }
        }
    }

    /// The storage buffer `name` holding `bytes` (zero-padded to whole words).
    pub fn upload(&mut self, gpu: &Gpu, name: &'static str, bytes: &[u8]) -> wgpu::Buffer {
        let b = self.buffer(gpu, name, bytes.len() as u64);
        gpu.write_words(&b, bytes);
        b
    }

    /// A buffer to read `bytes` back into.
    pub fn staging(&mut self, gpu: &Gpu, bytes: u64) -> wgpu::Buffer {
        let bytes = bytes.max(4);
        match &self.staging {
            Some(b) if b.size() >= bytes => b.clone(),
            _ => {
                let b = gpu.staging(bytes.next_power_of_two());
                self.staging = Some(b.clone());
                b
            }
        }
    }

    /// The passes recorded from now on timed dispatch by dispatch (where `on`; the
    /// device writes timestamps in a pass: `Gpu::timestamps`), or not.
    pub fn time(&mut self, gpu: &Gpu, on: bool) {
        if on && self.timer.is_none() {
            self.timer = Some(Timer::new(&gpu.device));
        }
        self.timing = on;
    }

    /// An encoder holding one compute pass of the dispatches `record` makes through
    /// the recorder it is given, and how many there are: recorded again where the
    /// parameter buffer was too small for them (as every backend's first step is).
    /// Where steps are timed, a stamp before the first dispatch and after each, and
    /// what each is ([`Recorded::stamps`]).
    pub fn record(
        &mut self,
        gpu: &Gpu,
        record: impl Fn(&Recorder<'_>, &mut wgpu::ComputePass<'_>),
    ) -> Recorded {
        loop {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            let rec = self.recorder(gpu);
            {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                if let Some(set) = &rec.stamps {
                    pass.write_timestamp(set, 0);
                }
                record(&rec, &mut pass);
            }
            let dispatches = rec.dispatches();
            let set = rec.stamps.clone();
            let Ok(kinds) = rec.finish() else {
                continue;
            };
            // A pass of more dispatches than the set holds stamps: not timed.
            let whole = kinds.len() == dispatches;
            let stamps = set.zip(self.timer.as_ref()).filter(|_| whole);
            let stamps = stamps.map(|(set, timer)| {
                let n = kinds.len() as u32 + 1;
                encoder.resolve_query_set(&set, 0..n, &timer.resolved, 0);
                (kinds, timer.resolved.clone())
            });
            return Recorded {
                encoder,
                dispatches,
                stamps,
            };
        }
    }

    /// A recorder for one step. The parameter buffer holds as many dispatches as the
    /// largest step so far (64 at first): a step with more is recorded again
    /// (`Recorder::finish`, [`Arena::record`]).
    fn recorder<'a>(&'a mut self, gpu: &'a Gpu) -> Recorder<'a> {
        if self.slots < self.wanted.max(64) {
            let slots = self.wanted.max(64).next_power_of_two();
            self.params = Some(gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("step params"),
                size: (slots * slot_bytes(gpu)) as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
            self.slots = slots;
        }
        let params = self.params.clone().expect("made above");
        Recorder {
            gpu,
            params,
            stamps: (self.timer.as_ref())
                .filter(|_| self.timing)
                .map(|t| t.set.clone()),
            state: RefCell::new(State {
                arena: self,
                words: Vec::new(),
                next: 0,
                kinds: Vec::new(),
            }),
        }
    }
}

/// Bytes between two dispatches' parameters: a multiple of the device's uniform offset
/// alignment.
fn slot_bytes(gpu: &Gpu) -> usize {
    let align = gpu.limits.min_uniform_buffer_offset_alignment as usize;
    (PARAM_WORDS * 4).next_multiple_of(align)
}

struct State<'a> {
    arena: &'a mut Arena,
    /// The step's parameters so far, slot by slot.
    words: Vec<u32>,
    next: usize,
    /// Where the step is timed: each stamped dispatch's kind and weight bytes.
    kinds: Vec<(String, u64)>,
}

/// Records one step's dispatches into a compute pass through the arena's cache.
pub(crate) struct Recorder<'a> {
    gpu: &'a Gpu,
    params: wgpu::Buffer,
    /// Where the step is timed, the query set its stamps go to.
    stamps: Option<wgpu::QuerySet>,
    state: RefCell<State<'a>>,
}

impl Recorder<'_> {
    /// Records `kernel` over `groups` workgroups with `params` (binding 0, a uniform)
    /// and `buffers` (bindings 1.., whole buffers); nothing for an empty grid.
    pub fn dispatch(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        kernel: &Kernel,
        params: &[u32],
        buffers: &[&wgpu::Buffer],
        groups: (u32, u32),
    ) {
        let what = || (kernel.name.to_string(), 0);
        self.dispatch_as(pass, kernel, params, buffers, groups, what)
    }

    /// [`Recorder::dispatch`], where a timed step calls it `what` says (a kind and the
    /// weight bytes it reads; asked only where the step is timed).
    pub fn dispatch_as(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        kernel: &Kernel,
        params: &[u32],
        buffers: &[&wgpu::Buffer],
        groups: (u32, u32),
        what: impl FnOnce() -> (String, u64),
    ) {
        if groups.0 == 0 || groups.1 == 0 {
            return;
        }
        assert!(
            params.len() <= PARAM_WORDS,
            "a kernel's parameters outgrew a slot"
        );
        let mut st = self.state.borrow_mut();
        let i = st.next;
        st.next += 1;
        let slot_words = slot_bytes(self.gpu) / 4;
        st.words.resize(i * slot_words, 0);
        st.words.extend_from_slice(params);
        if i >= st.arena.slots {
            // Recorded again with more slots (`finish`).
            return;
        }
        if st.arena.bound.len() <= i {
            st.arena.bound.resize_with(i + 1, || None);
        }
        let id = kernel as *const Kernel as usize;
        let same = st.arena.bound[i].as_ref().is_some_and(|b| {
            b.kernel == id
                && b.buffers[0] == self.params
                && b.buffers.len() == buffers.len() + 1
                && b.buffers[1..].iter().zip(buffers).all(|(x, y)| x == *y)
        });
        if !same {
            let size = std::num::NonZeroU64::new((PARAM_WORDS * 4) as u64);
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.params,
                    offset: (i * slot_words * 4) as u64,
                    size,
                }),
            }];
            for (j, b) in buffers.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: j as u32 + 1,
                    resource: b.as_entire_binding(),
                });
            }
            let group = self
                .gpu
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: kernel.layout(),
                    entries: &entries,
                });
            let mut bound = vec![self.params.clone()];
            bound.extend(buffers.iter().map(|b| (*b).clone()));
            st.arena.bound[i] = Some(Bound {
                kernel: id,
                buffers: bound,
                group,
            });
        }
        let group = &st.arena.bound[i].as_ref().expect("bound above").group;
        pass.set_pipeline(kernel.pipeline());
        pass.set_bind_group(0, group, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, 1);
        // Stamp 0 is the pass's start: dispatch i's is i + 1 (none past the set's).
        if let Some(set) = &self.stamps {
            if st.kinds.len() + 1 < STAMPS as usize {
                st.kinds.push(what());
                pass.write_timestamp(set, st.kinds.len() as u32);
            }
        }
    }

    /// Dispatches recorded so far.
    fn dispatches(&self) -> usize {
        self.state.borrow().next
    }

    /// Writes the step's parameters and hands back what each stamped dispatch is; `Err`
    /// where the step had more dispatches than the parameter buffer holds: record it
    /// again (the next recorder holds them).
    fn finish(self) -> Result<Vec<(String, u64)>, ()> {
        let st = self.state.into_inner();
        st.arena.wanted = st.arena.wanted.max(st.next);
        if st.next > st.arena.slots {
            return Err(());
        }
        if !st.words.is_empty() {
            let mut words = st.words;
            words.resize(st.next * slot_bytes(self.gpu) / 4, 0);
            self.gpu
                .queue
                .write_buffer(&self.params, 0, bytemuck::cast_slice(&words));
        }
        Ok(st.kinds)
    }
}
