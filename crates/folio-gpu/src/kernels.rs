//! The compute kernels (WGSL, in `wgsl/`), compiled for a device and the weight
//! formats a backend's matrices have, and [`Kernels::dispatch`], which binds a kernel's
//! uniform parameters and buffers in binding order and records one dispatch. Each
//! kernel's file says what it computes and how it is dispatched.

use crate::arena::Recorder;
use crate::device::Gpu;
use crate::error::GpuError;
use crate::weights::{Format, Matrix};

/// A kernel: its pipeline and bind group layout (inferred from the shader).
pub(crate) struct Kernel {
    /// What a profile calls its dispatches (`profile.rs`; a matmul's add their matrix).
    pub name: &'static str,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    /// A matmul's inputs per chunk (`CHUNK` in `matmul_common.wgsl`): 32, or 256 for
    /// the K-quants on 8-bit inputs.
    chunk: u32,
}

impl Kernel {
    fn new(name: &'static str, pipeline: wgpu::ComputePipeline) -> Self {
        let layout = pipeline.get_bind_group_layout(0);
        Kernel {
            name,
            pipeline,
            layout,
            chunk: 32,
        }
    }

    /// A kernel of its own source (`src`'s `entry`): a probe at load, and tests of WGSL
    /// functions.
    pub fn standalone(gpu: &Gpu, name: &'static str, src: &str, entry: &str) -> Self {
        let module = gpu
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let pipeline = gpu
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        Self::new(name, pipeline)
    }

    pub fn pipeline(&self) -> &wgpu::ComputePipeline {
        &self.pipeline
    }

    pub fn layout(&self) -> &wgpu::BindGroupLayout {
        &self.layout
    }
}

/// Every pipeline the step records.
pub(crate) struct Kernels {
    /// RMSNorm of picked rows into another buffer (`norm.wgsl`), and the same with
    /// the normed rows quantized for the matmuls after it (`picked_quantized`).
    pub rms_norm: Kernel,
    pub rms_norm_quantized: Kernel,
    /// The kernels of each weight format compiled, by format number; `None` for the
    /// formats the weights do not have (a backend compiles its weights' formats only:
    /// each is two or three pipelines, and on lavapipe one took about 35 ms to compile).
    formats: Vec<Option<FormatKernels>>,
    /// Activations into 8-bit blocks of 32 ([`Input::Q8`]) and of 256 ([`Input::Q8K`]).
    pub quantize: Kernel,
    pub quantize_k: Kernel,
    pub kv_store: Kernel,
    pub attention: Kernel,
    /// K/V store and attention over an 8-bit pool.
    pub kv_store_q8: Kernel,
    pub attention_q8: Kernel,
    /// The chunks of a split attention combined (f16 and 8-bit K/V).
    pub combine: Kernel,
    pub combine_q8: Kernel,
    /// The gated activation (SiLU or GELU).
    pub glu: Kernel,
    /// Per-head RMSNorm in place (Q/K norms) and a post-norm added to the residual.
    pub norm_in_place: Kernel,
    pub norm_add: Kernel,
    pub bias: Kernel,
    /// Final-logit soft-capping.
    pub softcap: Kernel,
    /// How the step records its dispatches (kept when the kernels are compiled again).
    pub set: Settings,
    /// The subgroup size the matmuls' lanes add their sums within
    /// (`reduce_subgroup.wgsl`), or none (`reduce_workgroup.wgsl`): the same bits.
    pub subgroup: Option<u32>,
}

/// The kernels one weight format has.
struct FormatKernels {
    /// The matmul on f32 inputs (the default); F16, BF16 and widened matrices are read
    /// only so (with llama.cpp's arithmetic too).
    f32_inputs: Kernel,
    /// The matmul on 8-bit inputs (llama.cpp's arithmetic) where the format has one:
    /// the formats in blocks of 32 ([`Q8_INPUT_FORMATS`]) on blocks of 32 inputs, the
    /// K-quants ([`Q8K_INPUT_FORMATS`]) on blocks of 256.
    q8_inputs: Option<(Kernel, Input)>,
    /// The embedding gather from a table in this format (`matmul_f32_inputs.wgsl`'s
    /// `embed`).
    embed: Kernel,
}

/// How a step records its dispatches, set by the backend's `with_*` options and the
/// adapter's kind; none of it is compiled into a pipeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// The matmuls' work split: many lanes share an output column (what a GPU wants:
    /// neighbouring invocations read neighbouring weights), or one lane computes it
    /// (what lavapipe runs fastest: its lanes are SIMD lanes of one CPU core, where a
    /// workgroup's barriers and gathers cost more than whole rows per lane). Wide on a
    /// hardware adapter, narrow on a software one; the tests run both.
    pub wide: bool,
    /// A matrix of several parts (Q, K and V; gate and up: `Matrix::parts`) in one
    /// dispatch, and a norm with the 8-bit quantization of its rows in one (`step.rs`),
    /// or (off, for measuring what that saves) one dispatch each: the same bits.
    pub fused: bool,
    /// The most workgroups one matmul dispatch has along its columns ([`MAX_GROUPS`];
    /// a test sets fewer).
    pub max_groups: u32,
    /// The most picked rows one pass of the head takes (`step.rs`: its logits in
    /// pieces where they would be more than one binding holds); a test sets fewer.
    pub head_rows: usize,
    /// Keys per chunk where a row's attention is split ([`ATTENTION_CHUNK`]; fewer in a
    /// test of the split).
    pub attention_chunk: u32,
    /// Attention's query heads that share a K/V head in one workgroup, each key's K
    /// and V read once for them all ([`Settings::heads_per_group`]), or (off, for
    /// measuring) a head a workgroup: the same bits.
    pub grouped_attention: bool,
}

/// The most query heads one attention workgroup takes (`GMAX` in `attention.wgsl`),
/// and the most of their values its workgroup memory holds.
const ATTENTION_HEADS: usize = 8;
const ATTENTION_VALUES: usize = 2048;

impl Settings {
    /// Query heads per attention workgroup for `heads` query heads over `kv_heads` K/V
    /// heads of `head_dim` values: the most consecutive ones that share a K/V head (a
    /// divisor of `heads / kv_heads`) up to [`ATTENTION_HEADS`] and
    /// [`ATTENTION_VALUES`]; 1 where grouping is off.
    pub fn heads_per_group(&self, heads: usize, kv_heads: usize, head_dim: usize) -> usize {
        let share = heads / kv_heads.max(1);
        let fits = |g: &usize| {
            share.is_multiple_of(*g) && *g <= ATTENTION_HEADS && g * head_dim <= ATTENTION_VALUES
        };
        match self.grouped_attention {
            true => (1..=share).rev().find(fits).unwrap_or(1),
            false => 1,
        }
    }
}

/// Workgroup width of every kernel.
pub(crate) const WG: u32 = 64;
/// Rows of `a` one matmul workgroup computes (`TR` in `matmul_common.wgsl`).
pub(crate) const MATMUL_ROWS: u32 = 8;
/// The most workgroups a matmul dispatch has along its columns (WebGPU's default limit
/// per axis); a larger matrix takes several dispatches.
const MAX_GROUPS: u32 = 65535;
/// Keys per chunk of a split attention (`attention.wgsl`): a step whose longest row
/// sees more keys splits every row's keys at multiples of it, so a long context's
/// decode row keeps many workgroups busy, not one per head.
const ATTENTION_CHUNK: u32 = 256;
/// Words of one 8-bit activation block of 32 (`quantize.wgsl`'s `q8_block`).
pub(crate) const Q8_WORDS: usize = 10;
/// Words of one 8-bit activation block of 256 (`quantize.wgsl`'s `q8k_block`).
pub(crate) const Q8K_WORDS: usize = 81;

/// What a matmul kernel reads as its input `a`: the activations, or them in 8-bit
/// blocks of 32 or 256 (`quantize.wgsl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    F32,
    Q8,
    Q8K,
}

/// The formats with a matmul on 8-bit inputs (`matmul.wgsl`): those in blocks of 32
/// whose dot product with an 8-bit block llama.cpp (and the CPU backend) takes in
/// integers. F16 and BF16 read f32 inputs under llama.cpp's arithmetic too.
pub(crate) const Q8_INPUT_FORMATS: [Format; 6] = [
    Format::Q4_0,
    Format::Q4_1,
    Format::Q5_0,
    Format::Q5_1,
    Format::Q8_0,
    Format::Iq4Nl,
];

/// The K-quants, whose matmul on 8-bit inputs (`matmul_k.wgsl`) reads them in blocks
/// of 256, as the CPU's (llama.cpp's) K-quant dot products do.
pub(crate) const Q8K_INPUT_FORMATS: [Format; 5] = [
    Format::Q2K,
    Format::Q3K,
    Format::Q4K,
    Format::Q5K,
    Format::Q6K,
];

impl Kernels {
    /// Every kernel compiled for `gpu`, for every weight format, the matmuls' sums
    /// added within subgroups where the device has them in order; a shader or pipeline
    /// the device refuses is [`GpuError::Device`].
    #[cfg(test)]
    pub fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        Self::with_subgroups(gpu, true)
    }

    /// [`Kernels::new`], or (`subgroups` false) with the sums added in workgroup
    /// memory whatever the device has.
    #[cfg(test)]
    pub fn with_subgroups(gpu: &Gpu, subgroups: bool) -> Result<Self, GpuError> {
        Self::for_formats(gpu, subgroups, &Format::ALL)
    }

    /// The kernels for weights in `formats` (their matmuls and embedding gathers; the
    /// others' are not compiled), with the sums added within subgroups where
    /// `subgroups` and the device has them in order, else in workgroup memory.
    ///
    /// A probe or compile that fails with subgroups falls back to workgroup memory,
    /// with a warning.
    pub fn for_formats(gpu: &Gpu, subgroups: bool, formats: &[Format]) -> Result<Self, GpuError> {
        let compile = |subgroup| {
            gpu.scoped_as(
                || Ok(Self::compile(gpu, subgroup, formats)),
                |e| GpuError::Device(format!("compiling the kernels: {e}")),
            )
        };
        let Some(size) = gpu.subgroup.filter(|_| subgroups) else {
            return compile(None);
        };
        match subgroups_in_order(gpu, size) {
            Ok(true) => {}
            Ok(false) => return compile(None),
            Err(e) => {
                tracing::warn!("gpu: {e}; the matmuls add in workgroup memory");
                return compile(None);
            }
        }
        compile(Some(size)).or_else(|e| {
            tracing::warn!("gpu: {e} (with subgroups); the matmuls add in workgroup memory");
            compile(None)
        })
    }

    fn compile(gpu: &Gpu, subgroup: Option<u32>, formats: &[Format]) -> Self {
        let module = |name: &str, src: &str| {
            gpu.device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(name),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                })
        };
        let pipeline_with = |name, m: &wgpu::ShaderModule, entry: &str, constants: &[_]| {
            Kernel::new(
                name,
                gpu.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: None,
                        module: m,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants,
                            ..Default::default()
                        },
                        cache: None,
                    }),
            )
        };
        let pipeline =
            |name, m: &wgpu::ShaderModule, entry: &str| pipeline_with(name, m, entry, &[]);
        // The matmul kernels' files follow their common part and its reduction; every
        // matmul pipeline gets the subgroup size where the reduction takes one (naga
        // reads subgroup operations on a device with the feature, without WGSL's
        // `enable subgroups`, which it does not parse yet).
        let reduce = match subgroup {
            Some(_) => include_str!("wgsl/reduce_subgroup.wgsl"),
            None => include_str!("wgsl/reduce_workgroup.wgsl"),
        };
        let common = include_str!("wgsl/matmul_common.wgsl");
        let act = include_str!("wgsl/act.wgsl");
        let matmul_module =
            |name: &str, kernel: &str| module(name, &[common, reduce, act, kernel].concat());
        let matmul = matmul_module("matmul", include_str!("wgsl/matmul.wgsl"));
        let matmul_k = matmul_module("matmul_k", include_str!("wgsl/matmul_k.wgsl"));
        let matmul_f32_inputs = matmul_module(
            "matmul_f32_inputs",
            include_str!("wgsl/matmul_f32_inputs.wgsl"),
        );
        let sg = subgroup.map(|s| ("SG", s as f64));
        let matmul_pipeline = |m: &wgpu::ShaderModule, format: Format, chunk: Option<f64>| {
            let mut constants = vec![("FORMAT", format.wgsl() as f64)];
            constants.extend(sg);
            constants.extend(chunk.map(|c| ("CHUNK", c)));
            Kernel {
                chunk: chunk.map_or(32, |c| c as u32),
                ..pipeline_with("matmul", m, "main", &constants)
            }
        };
        // The 8-bit blocks' arithmetic (and its exact division) comes first in both
        // kernels that make them; the division in the 8-bit K/V's store too.
        let div = include_str!("wgsl/div.wgsl");
        let blocks = [div, include_str!("wgsl/quantize.wgsl")].concat();
        let norm = module("norm", &[&blocks, include_str!("wgsl/norm.wgsl")].concat());
        let quantize = module(
            "quantize",
            &[&blocks, include_str!("wgsl/quantize_rows.wgsl")].concat(),
        );
        let elementwise = module(
            "elementwise",
            &[act, include_str!("wgsl/elementwise.wgsl")].concat(),
        );
        // The 8-bit K/V rotation and RoPE come first in both kernels that need them.
        let wht = include_str!("wgsl/wht.wgsl");
        let rope = include_str!("wgsl/rope.wgsl");
        let kv_store = module(
            "kv_store",
            &[div, wht, rope, include_str!("wgsl/kv_store.wgsl")].concat(),
        );
        let attention = module(
            "attention",
            &[wht, rope, include_str!("wgsl/attention.wgsl")].concat(),
        );
        let format_kernels = |f: Format| FormatKernels {
            f32_inputs: matmul_pipeline(&matmul_f32_inputs, f, None),
            q8_inputs: if Q8_INPUT_FORMATS.contains(&f) {
                Some((matmul_pipeline(&matmul, f, None), Input::Q8))
            } else if Q8K_INPUT_FORMATS.contains(&f) {
                Some((matmul_pipeline(&matmul_k, f, Some(256.0)), Input::Q8K))
            } else {
                None
            },
            embed: pipeline_with(
                "embed",
                &matmul_f32_inputs,
                "embed",
                &[("FORMAT", f.wgsl() as f64)],
            ),
        };
        Kernels {
            rms_norm: pipeline("rms_norm", &norm, "picked"),
            rms_norm_quantized: pipeline("rms_norm_quantized", &norm, "picked_quantized"),
            formats: Format::ALL
                .iter()
                .map(|f| formats.contains(f).then(|| format_kernels(*f)))
                .collect(),
            quantize: pipeline("quantize", &quantize, "main"),
            quantize_k: pipeline("quantize_k", &quantize, "q8k"),
            kv_store: pipeline("kv_store", &kv_store, "main"),
            attention: pipeline("attention", &attention, "main"),
            kv_store_q8: pipeline("kv_store_q8", &kv_store, "q8"),
            attention_q8: pipeline_with("attention_q8", &attention, "main", &[("KV_Q8", 1.0)]),
            combine: pipeline("combine", &attention, "combine"),
            combine_q8: pipeline_with("combine_q8", &attention, "combine", &[("KV_Q8", 1.0)]),
            glu: pipeline("glu", &elementwise, "glu"),
            norm_in_place: pipeline("norm_in_place", &norm, "in_place"),
            norm_add: pipeline("norm_add", &norm, "add"),
            bias: pipeline("bias", &elementwise, "bias"),
            softcap: pipeline("softcap", &elementwise, "softcap"),
            set: Settings {
                wide: !gpu.adapter().software,
                fused: true,
                max_groups: MAX_GROUPS,
                head_rows: usize::MAX,
                attention_chunk: ATTENTION_CHUNK,
                grouped_attention: true,
            },
            subgroup,
        }
    }

    /// The formats compiled for (what [`Kernels::for_formats`] was given).
    pub fn formats(&self) -> Vec<Format> {
        let compiled = |f: &&Format| self.formats[f.wgsl() as usize].is_some();
        Format::ALL.iter().filter(compiled).copied().collect()
    }

    /// The kernels of `format`, which the kernels were compiled for: a backend's are
    /// for every format its weights have.
    fn of(&self, format: Format) -> &FormatKernels {
        let k = self.formats[format.wgsl() as usize].as_ref();
        k.unwrap_or_else(|| panic!("no kernels compiled for {format:?} weights"))
    }

    /// The matmul on f32 inputs for matrices in `format`.
    pub fn f32_inputs(&self, format: Format) -> &Kernel {
        &self.of(format).f32_inputs
    }

    /// Records the embedding gather: row r of `x` (`dim` wide) is row `tokens[r]` of
    /// the table `m` times `scale`, for `rows` rows (`tokens` as f32 values, padded to
    /// a multiple of four); each piece of the table is one dispatch.
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &self,
        rec: &Recorder<'_>,
        pass: &mut wgpu::ComputePass<'_>,
        m: &Matrix,
        tokens: &wgpu::Buffer,
        x: &wgpu::Buffer,
        rows: usize,
        scale: f32,
    ) {
        let kernel = &self.of(m.format).embed;
        let groups = ((m.cols as u32 / 32).div_ceil(WG), rows as u32);
        for (w, first, n) in &m.pieces {
            // `matmul_common.wgsl`'s P: k, n, rows, at and scale; the rest unread.
            let (k, n, at, s) = (m.cols as u32, *n as u32, *first as u32, scale.to_bits());
            let params = [k, n, rows as u32, 0, 0, at, 0, 0, 0, 0, 0, 0, 0, 0, s];
            rec.dispatch(pass, kernel, &params, &[w, tokens, x], groups);
        }
    }

    /// The matmul on 8-bit inputs for matrices in `format`, where it has one, and the
    /// blocks it reads.
    pub fn q8_inputs(&self, format: Format) -> Option<(&Kernel, Input)> {
        let (kernel, input) = self.of(format).q8_inputs.as_ref()?;
        Some((kernel, *input))
    }

    /// The matmul for matrices in `format` and what it reads: with llama.cpp's
    /// arithmetic (`llama`), 8-bit inputs where the format has a kernel for them.
    pub fn matmul_for(&self, format: Format, llama: bool) -> (&Kernel, Input) {
        match self.q8_inputs(format).filter(|_| llama) {
            Some(q8) => q8,
            None => (self.f32_inputs(format), Input::F32),
        }
    }

    /// Records `m` · `a`ᵀ with the matmul `kernel` into `out` (added with `add`) for
    /// `rows` rows of `a`: `y[r, o] (+)= a[r] · W[o]`, into the output of the part row
    /// `o` is in ([`Outputs`]). Each piece of the matrix is one dispatch, or (where not
    /// `fused`) each part of it one per piece it lies in ([`Matrix::dispatches`]), and
    /// a dispatch of more column groups than [`MAX_GROUPS`] several. The work split is
    /// `matmul_common.wgsl`'s: as many lanes per output as the input has chunks (of the
    /// kernel's 32 or 256; a power of two, at most [`WG`]), or one lane per output where
    /// `wide` is off. Which rows one dispatch takes changes no output's bits. Gated
    /// ([`Outputs::gated`]), one dispatch over gate's rows writes act(gate) * up.
    #[allow(clippy::too_many_arguments)]
    pub fn matrix(
        &self,
        rec: &Recorder<'_>,
        pass: &mut wgpu::ComputePass<'_>,
        kernel: &Kernel,
        m: &Matrix,
        a: &wgpu::Buffer,
        out: &Outputs<'_>,
        rows: usize,
        add: bool,
    ) {
        let k = m.cols;
        let lanes = match self.set.wide {
            true => (k as u32 / kernel.chunk).next_power_of_two().min(WG),
            false => 1,
        };
        let step = self.set.max_groups;
        let [(y, stride), (y1, stride1), (y2, stride2)] = out.parts;
        let [s1, s2] = out.starts.map(|s| s.min(u32::MAX as usize) as u32);
        let row_bytes = (m.bytes / m.rows.max(1)) as u64;
        // Gated: the dispatch of gate's rows alone, each column's up row s1 on (a
        // matrix of gate's and up's rows in one piece: `Outputs::gated`).
        let gated = out.glu != 0;
        if gated {
            assert!(
                m.parts == [s1 as usize; 2] && m.pieces.len() == 1 && !add,
                "gated: a matrix of gate's and up's rows in one piece, not added"
            );
        }
        let dispatches = m.dispatches(self.set.fused && !gated);
        for (piece, range) in dispatches.take(if gated { 1 } else { usize::MAX }) {
            let (w, first, _) = &m.pieces[piece];
            let columns = (range.len() as u32).div_ceil(WG / lanes);
            for g0 in (0..columns).step_by(step as usize) {
                // Workgroup x takes column group g0 + x (`matmul_common.wgsl`).
                let params = [
                    k as u32,
                    range.end as u32,
                    rows as u32,
                    add as u32,
                    stride as u32,
                    *first as u32,
                    lanes,
                    g0,
                    range.start as u32,
                    s1,
                    s2,
                    stride1 as u32,
                    stride2 as u32,
                    out.glu,
                ];
                let groups = (
                    (columns - g0).min(step),
                    (rows as u32).div_ceil(MATMUL_ROWS),
                );
                // What a profile calls it, and the weights it reads.
                let what = || {
                    let per = u64::from(WG / lanes);
                    let end = (u64::from(g0 + groups.0) * per).min(range.len() as u64);
                    let gate = if gated { " gated" } else { "" };
                    let name = format!("matmul {} {}{gate}", m.role, m.format.name());
                    // Gated, each column reads a gate row and an up row.
                    let rows = (end - u64::from(g0) * per) * (1 + u64::from(gated));
                    (name, rows * row_bytes)
                };
                rec.dispatch_as(pass, kernel, &params, &[w, a, y, y1, y2], groups, what);
            }
        }
    }
}

/// Where a matmul's outputs go: each part of the matrix (`Matrix::parts`: the rows of
/// up to three matrices one after another) into its own buffer, rows `stride` wide;
/// or, gated, gate's and up's parts into one output through the gated activation.
pub(crate) struct Outputs<'b> {
    /// Each part's buffer and row stride (a matrix of fewer parts repeats the first).
    pub parts: [(&'b wgpu::Buffer, usize); 3],
    /// The matrix rows where parts 1 and 2 start (`usize::MAX` where it has none).
    pub starts: [usize; 2],
    /// 0, or gated: 1 SiLU, 2 GELU (`matmul_common.wgsl`).
    pub glu: u32,
}

impl<'b> Outputs<'b> {
    /// The parts of rows `sizes` (at most three), each into its `(buffer, stride)`.
    pub fn parts(sizes: &[usize], outs: &[(&'b wgpu::Buffer, usize)]) -> Self {
        assert!(
            sizes.len() == outs.len() && (1..=3).contains(&sizes.len()),
            "one output per part, up to three"
        );
        let part = |i: usize| outs.get(i).copied().unwrap_or(outs[0]);
        let start = |i: usize| match i < sizes.len() {
            true => sizes[..i].iter().sum(),
            false => usize::MAX,
        };
        Outputs {
            parts: [part(0), part(1), part(2)],
            starts: [start(1), start(2)],
            glu: 0,
        }
    }

    /// act(gate) * up into `out` (rows `stride` wide) from a matrix of gate's `ff`
    /// rows and then up's, in one piece (SiLU, or GELU where `gelu`).
    pub fn gated(out: (&'b wgpu::Buffer, usize), ff: usize, gelu: bool) -> Self {
        Outputs {
            parts: [out; 3],
            starts: [ff, usize::MAX],
            glu: 1 + u32::from(gelu),
        }
    }
}

/// Whether `gpu`'s subgroups of `size` lay a workgroup of [`WG`] out in order
/// (invocation i is lane i % size of subgroup i / size), as `reduce_subgroup.wgsl`
/// needs: one workgroup writes each invocation's lane and subgroup size, read back.
/// Vulkan promises no layout; every driver seen lays them out so.
fn subgroups_in_order(gpu: &Gpu, size: u32) -> Result<bool, GpuError> {
    const PROBE: &str = "@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) size: u32) {
    out[li] = lane | (size << 16u);
}
";
    let seen = gpu
        .scoped(|| {
            let probe = Kernel::standalone(gpu, "subgroup probe", PROBE, "main");
            let bytes = u64::from(WG) * 4;
            let out = gpu.scratch("subgroup probe", bytes);
            let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: probe.layout(),
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: out.as_entire_binding(),
                }],
            });
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = encoder.begin_compute_pass(&Default::default());
                pass.set_pipeline(probe.pipeline());
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(1, 1, 1);
            }
            let staging = gpu.staging(bytes);
            encoder.copy_buffer_to_buffer(&out, 0, &staging, 0, bytes);
            gpu.finish(encoder, &staging, bytes)
        })
        .map_err(|e| GpuError::Device(format!("probing the subgroups: {e}")))?;
    let in_order = seen
        .iter()
        .enumerate()
        .all(|(i, v)| v.to_bits() == (i as u32 % size) | (size << 16));
    if !in_order {
        tracing::info!("gpu: subgroups not laid out in order; the matmuls add in workgroup memory");
    }
    Ok(in_order)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention's heads per workgroup: the most that share a K/V head (a divisor of
    /// their number), up to eight and 2048 values; one where grouping is off.
    #[test]
    fn attention_takes_the_most_heads_that_share_a_kv_head_and_fit() {
        let on = Settings {
            wide: true,
            fused: true,
            max_groups: MAX_GROUPS,
            head_rows: usize::MAX,
            attention_chunk: ATTENTION_CHUNK,
            grouped_attention: true,
        };
        // (heads, K/V heads, head_dim) → heads a workgroup.
        let cases = [
            ((32, 8, 64), 4),  // Llama 3.2 1B
            ((9, 3, 64), 3),   // SmolLM2 135M
            ((4, 1, 256), 4),  // Gemma 3 270M
            ((16, 1, 256), 8), // 16 share one: eight fill the 2048 values
            ((12, 1, 256), 6), // 8 does not divide 12, and 6 · 256 fits
            ((28, 4, 128), 7), // Qwen 2.5 7B
            ((48, 1, 128), 8), // more than eight share one
            ((8, 8, 128), 1),  // no sharing
            ((20, 2, 256), 5), // the divisors of 10: eight and ten do not
        ];
        for ((heads, kv, dim), want) in cases {
            assert_eq!(
                on.heads_per_group(heads, kv, dim),
                want,
                "{heads}/{kv} × {dim}"
            );
        }
        let off = Settings {
            grouped_attention: false,
            ..on
        };
        assert_eq!(off.heads_per_group(32, 8, 64), 1);
    }
}
