//! The matmul on f32 inputs over matrices in their blocks against the same matrix
//! dequantized on the host (`folio::model::dequantize`, the CPU's own decoding) and
//! multiplied as a widened (f32) matrix: the same bits, for every format the kernel
//! decodes, on random blocks and random activations, for 1, 3 and 9 activation rows
//! (one call of 8 rows and a remainder), with either work split of the kernels; and
//! the same bits with the lanes' sums added within subgroups (where the device has
//! them) as in workgroup memory.
//! And the K-quants' matmul on 8-bit inputs (llama.cpp's arithmetic) against the CPU
//! backend's own: the same 8-bit blocks, and the products within rounding.
//! Skipped, with the reason printed, without a Vulkan adapter.

use crate::arena::{Arena, Recorder};
use crate::device::Gpu;
use crate::kernels::{Input, Kernel, Kernels, Outputs, Q8K_WORDS, Q8_WORDS, WG};
use crate::weights::{Format, Matrix};
use folio::gguf::GgmlType;
use folio::internals::{self as cpu, BlockQ8, BlockQ8K};
use folio::model::dequantize;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A normal f16 scale in ±[2⁻⁸, 2⁻⁴), as little-endian bytes.
fn scale(rng: &mut Rng) -> [u8; 2] {
    let v = (1.0 + rng.f32().abs()) * 2f32.powi(-4 - (rng.next() % 4) as i32);
    let v = if rng.next() & 1 == 0 { v } else { -v };
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// `rows` rows of random blocks of `ty`, with normal f16 scales where the format
/// keeps them (random bytes elsewhere).
fn random_blocks(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let (block, at): (usize, &[usize]) = match ty {
        GgmlType::Q4_0 => (18, &[0]),
        GgmlType::Q4_1 => (20, &[0, 2]),
        GgmlType::Q5_0 => (22, &[0]),
        GgmlType::Q8_0 => (34, &[0]),
        GgmlType::Q4_K => (144, &[0, 2]),
        GgmlType::Q6_K => (210, &[208]),
        GgmlType::Q5_K => (176, &[0, 2]),
        GgmlType::Q5_1 => (24, &[0, 2]),
        GgmlType::IQ4_NL => (18, &[0]),
        GgmlType::Q2_K => (84, &[80, 82]),
        GgmlType::Q3_K => (110, &[108]),
        // Every weight a normal f16; a bfloat16 from a normal f32.
        GgmlType::F16 => (2, &[0]),
        GgmlType::BF16 => {
            let v: Vec<u8> = (0..rows * cols)
                .flat_map(|_| ((rng.f32().to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            return v;
        }
        ty => unreachable!("{ty}"),
    };
    let per = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut out: Vec<u8> = (0..rows * per).map(|_| rng.next() as u8).collect();
    for b in out.chunks_exact_mut(block) {
        for &i in at {
            b[i..i + 2].copy_from_slice(&scale(rng));
        }
    }
    out
}

/// Every quantized and half-width format the kernels decode, with its GGUF type.
fn formats() -> impl Iterator<Item = (GgmlType, Format)> {
    let stored = Format::ALL.into_iter().filter(|&f| f != Format::F32);
    stored.map(|f| (f.ggml(), f))
}

/// `bytes` (rows of `cols` in `format`) as a matrix of `parts` uploaded in pieces of
/// `per` rows (as a matrix larger than a binding goes up).
fn test_matrix(
    gpu: &Gpu,
    format: Format,
    bytes: &[u8],
    cols: usize,
    parts: Vec<usize>,
    per: usize,
) -> Matrix {
    let rows: usize = parts.iter().sum();
    let rb = bytes.len() / rows.max(1);
    let pieces = (0..rows)
        .step_by(per.max(1))
        .map(|at| {
            let m = per.min(rows - at);
            (gpu.upload("w", &bytes[at * rb..(at + m) * rb]), at, m)
        })
        .collect();
    Matrix {
        role: "test".into(),
        pieces,
        format,
        rows,
        cols,
        bytes: bytes.len(),
        parts,
    }
}

/// A device, lavapipe included; `None`, the reason printed, where there is none.
fn gpu_or_skip() -> Option<Gpu> {
    Gpu::open(true)
        .inspect_err(|e| eprintln!("skipped: {e} (install mesa-vulkan-drivers for lavapipe)"))
        .ok()
}

/// The dispatches `record` makes, recorded as a step records them (again where the
/// arena's parameter buffer was too small), then `outputs` copied back to back into one
/// staging buffer and read back, as words.
fn record_and_read(
    gpu: &Gpu,
    record: impl Fn(&Recorder<'_>, &mut wgpu::ComputePass<'_>),
    outputs: &[&wgpu::Buffer],
) -> Vec<u32> {
    let mut encoder = Arena::default().record(gpu, record).encoder;
    let bytes: u64 = outputs.iter().map(|b| b.size()).sum();
    let staging = gpu.staging(bytes);
    let mut at = 0;
    for b in outputs {
        encoder.copy_buffer_to_buffer(b, 0, &staging, at, b.size());
        at += b.size();
    }
    let out = gpu.finish(encoder, &staging, bytes).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

/// `a` (`rows` × `m.cols`) · `m`ᵀ with `kernel`, recorded as a step records, read back.
fn run(gpu: &Gpu, k: &Kernels, kernel: &Kernel, m: &Matrix, a: &[f32], rows: usize) -> Vec<f32> {
    let a = gpu.upload("a", bytemuck::cast_slice(a));
    let y = gpu.scratch("y", (rows * m.rows * 4) as u64);
    let record = |rec: &Recorder<'_>, pass: &mut wgpu::ComputePass<'_>| {
        let out = Outputs::parts(&m.parts, &[(&y, m.rows)]);
        k.matrix(rec, pass, kernel, m, &a, &out, rows, false);
    };
    let words = record_and_read(gpu, record, &[&y]);
    words.into_iter().map(f32::from_bits).collect()
}

/// `a` (`rows` × `m.cols`) into 8-bit blocks of 256 (`quantize_rows.wgsl`'s `q8k`) and
/// those · `m`ᵀ with the matrix's kernel on them, recorded as a step records: the
/// products and the blocks' words, read back.
fn run_q8k(gpu: &Gpu, k: &Kernels, m: &Matrix, a: &[f32], rows: usize) -> (Vec<f32>, Vec<u32>) {
    let (kernel, input) = k.matmul_for(m.format, true);
    assert_eq!(input, Input::Q8K);
    let a = gpu.upload("a", bytemuck::cast_slice(a));
    let y = gpu.scratch("y", (rows * m.rows * 4) as u64);
    let aq = gpu.scratch("aq", (rows * m.cols / 256 * Q8K_WORDS * 4) as u64);
    let record = |rec: &Recorder<'_>, pass: &mut wgpu::ComputePass<'_>| {
        let params = [m.cols as u32, rows as u32];
        let groups = ((m.cols as u32 / 256).div_ceil(64), rows as u32);
        rec.dispatch(pass, &k.quantize_k, &params, &[&a, &aq], groups);
        let out = Outputs::parts(&m.parts, &[(&y, m.rows)]);
        k.matrix(rec, pass, kernel, m, &aq, &out, rows, false);
    };
    let mut words = record_and_read(gpu, record, &[&y, &aq]);
    let q = words.split_off(rows * m.rows);
    (words.into_iter().map(f32::from_bits).collect(), q)
}

/// The host's 8-bit blocks of 256 in the device's words: d, the 256 values four to a
/// word, then each 16's sum a word.
fn q8k_words(blocks: &[BlockQ8K]) -> Vec<u32> {
    let mut out = Vec::new();
    for b in blocks {
        out.push(b.d.to_bits());
        out.extend(
            b.qs.chunks(4)
                .map(|q| u32::from_le_bytes(std::array::from_fn(|e| q[e] as u8))),
        );
        out.extend(b.bsums.iter().map(|&s| s as i32 as u32));
    }
    out
}

/// Blocks' words with every NaN block alike (a NaN scale, whatever its payload, and
/// nothing else): `words` blocks of `len` words, the first `scales` of them floats.
fn nan_blocks_alike(words: Vec<u32>, len: usize, scales: usize) -> Vec<u32> {
    let nan = f32::NAN.to_bits();
    words
        .chunks(len)
        .flat_map(|b| match f32::from_bits(b[0]).is_nan() {
            true => [vec![nan; scales], vec![0; len - scales]].concat(),
            false => b.to_vec(),
        })
        .collect()
}

/// The norm with its rows quantized in the same dispatch (`norm.wgsl`'s
/// `picked_quantized`, what a step records where its matmuls read 8-bit inputs) gives
/// the words of the norm and then the quantize kernels: the normed rows and their
/// blocks of 32 and of 256, bit for bit, for picked rows out of order, a row with a NaN
/// and a row of zeros, at widths with and without whole blocks of 256 (none made
/// there). Exact on lavapipe; elsewhere the words that differ are counted and printed
/// (a GPU's compiler may compile the same expressions differently in two pipelines).
#[test]
fn a_norm_quantized_in_one_dispatch_gives_the_words_of_two() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let k = Kernels::new(&gpu).unwrap();
    let mut rng = Rng(17);
    let eps = 1e-5f32.to_bits();
    for (dim, rows) in [(576, 3), (768, 5), (2048, 1), (2048, 9)] {
        let held = rows + 2;
        let mut x: Vec<f32> = (0..held * dim).map(|_| rng.f32() * 8.0).collect();
        x[dim + 100] = f32::NAN;
        x[2 * dim..3 * dim].fill(0.0);
        let g: Vec<f32> = (0..dim).map(|_| rng.f32() + 1.5).collect();
        let idx: Vec<u32> = (0..rows).map(|r| ((r * 3 + 1) % held) as u32).collect();
        let (x, g, idx) = (
            gpu.upload("x", bytemuck::cast_slice(&x)),
            gpu.upload("g", bytemuck::cast_slice(&g)),
            gpu.upload("idx", bytemuck::cast_slice(&idx)),
        );
        let blocks = |words: usize, per: usize| (rows * dim / per * words * 4) as u64;
        for quant in [1u32, 2, 3] {
            let bufs: Vec<[wgpu::Buffer; 3]> = (0..2)
                .map(|_| {
                    [
                        gpu.scratch("h", (rows * dim * 4) as u64),
                        gpu.scratch("aq", blocks(Q8_WORDS, 32)),
                        gpu.scratch("akq", blocks(Q8K_WORDS, 256).max(4)),
                    ]
                })
                .collect();
            let record = |rec: &Recorder<'_>, pass: &mut wgpu::ComputePass<'_>| {
                let [h, aq, akq] = &bufs[0];
                let params = [dim as u32, rows as u32, eps];
                rec.dispatch(
                    pass,
                    &k.rms_norm,
                    &params,
                    &[&g, &x, h, &idx],
                    (rows as u32, 1),
                );
                let params = [dim as u32, rows as u32];
                if quant & 1 != 0 {
                    let groups = ((dim as u32 / 32).div_ceil(WG), rows as u32);
                    rec.dispatch(pass, &k.quantize, &params, &[h, aq], groups);
                }
                if quant & 2 != 0 && dim % 256 == 0 {
                    let groups = ((dim as u32 / 256).div_ceil(WG), rows as u32);
                    rec.dispatch(pass, &k.quantize_k, &params, &[h, akq], groups);
                }
                let [h, aq, akq] = &bufs[1];
                let params = [dim as u32, rows as u32, eps, quant];
                let bound = [&g, &x, h, &idx, aq, akq];
                rec.dispatch(
                    pass,
                    &k.rms_norm_quantized,
                    &params,
                    &bound,
                    (rows as u32, 1),
                );
            };
            let outputs: Vec<&wgpu::Buffer> = bufs.iter().flatten().collect();
            let words = record_and_read(&gpu, record, &outputs);
            let (two, one) = words.split_at(words.len() / 2);
            let case = format!("dim {dim}, {rows} rows, quant {quant}");
            let (h, q8) = (rows * dim, (blocks(Q8_WORDS, 32) / 4) as usize);
            let made = |w: &[u32]| w.iter().any(|&v| v != 0);
            assert!(made(&two[..h]), "{case}: no normed values");
            assert_eq!(
                made(&two[h..h + q8]),
                quant & 1 != 0,
                "{case}: blocks of 32"
            );
            let whole = quant & 2 != 0 && dim % 256 == 0;
            assert_eq!(made(&two[h + q8..]), whole, "{case}: blocks of 256");
            let nan = |w: &[u32]| w.iter().filter(|&&v| f32::from_bits(v).is_nan()).count();
            assert!(nan(&two[..h]) == dim, "{case}: the row with the NaN");
            if gpu.adapter().software {
                assert!(one == two, "{case}");
            } else {
                let moved = one.iter().zip(two).filter(|(a, b)| a != b).count();
                eprintln!("{case}: {moved} words differ between one dispatch and two");
            }
        }
    }
}

/// `div.wgsl`'s quotients, the 8-bit blocks' scales and reciprocals, against the host's
/// `/`, bit for bit on any adapter (it divides in integers; WGSL lets a GPU's `/` be
/// 2.5 ulp off): random bit patterns (NaNs, infinities, zeros and subnormals among
/// them), quotients near the subnormals (ties to even there), near overflow, and the
/// divisions the blocks make (`amax / 127`, `127 / amax`, `-127 / big`, `1 / iscale`,
/// `1 / d` of an f16 scale).
#[test]
fn the_blocks_division_is_the_hosts_bit_for_bit() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    const ENTRY: &str = "
struct P { n: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> ab: array<u32>;
@group(0) @binding(2) var<storage, read_write> q: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 65535u * 64u + gid.x;
    if (i < p.n) {
        q[i] = div_bits(ab[2u * i], ab[2u * i + 1u]);
    }
}
";
    let src = [include_str!("wgsl/div.wgsl"), ENTRY].concat();
    let kernel = Kernel::standalone(&gpu, "division", &src, "main");
    let mut rng = Rng(5);
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    let special = [
        0u32,
        1,
        2,
        3,
        5,
        0x7F_FFFF,
        0x80_0000,
        0x80_0001,
        0x3F80_0000,
        0x42FE_0000,
        0x7F7F_FFFF,
        0x7F80_0000,
        0x7FC0_0000,
        0x7F80_0001,
        0x0040_0000,
    ];
    for &a in &special {
        for &b in &special {
            for sign in [0, 0x8000_0000] {
                pairs.push((a ^ sign, b));
            }
        }
    }
    let f = |v: f32| v.to_bits();
    for _ in 0..1 << 18 {
        // Any bits at all.
        pairs.push((rng.next() as u32, rng.next() as u32));
        // Quotients near the smallest normals and below (ties to even), and near the
        // largest finite values.
        let m = |rng: &mut Rng| (rng.next() as u32) & 0x7F_FFFF;
        let e = |rng: &mut Rng, lo: u32, hi: u32| lo + (rng.next() as u32) % (hi - lo);
        let (lo, hi) = (e(&mut rng, 1, 40), e(&mut rng, 100, 160));
        pairs.push(((lo << 23) | m(&mut rng), (hi << 23) | m(&mut rng)));
        pairs.push((
            (e(&mut rng, 0, 8) << 23) | m(&mut rng),
            f(2f32.powi((rng.next() % 8) as i32)),
        ));
        pairs.push((
            (e(&mut rng, 200, 255) << 23) | m(&mut rng),
            (e(&mut rng, 1, 127) << 23) | m(&mut rng),
        ));
        // The blocks' own divisions.
        let amax = f32::from_bits((e(&mut rng, 1, 255) << 23) | m(&mut rng));
        pairs.push((f(amax), f(127.0)));
        pairs.push((f(127.0), f(amax)));
        pairs.push((f(-127.0), f(-amax)));
        let iscale = -127.0 / amax;
        pairs.push((f(1.0), f(iscale)));
        let d = half::f16::from_bits(rng.next() as u16 & 0x7BFF).to_f32();
        pairs.push((f(1.0), f(d)));
    }
    let n = pairs.len() as u32;
    let words: Vec<u32> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    let input = gpu.upload("ab", bytemuck::cast_slice(&words));
    let out = gpu.scratch("q", u64::from(n) * 4);
    let record = |rec: &Recorder<'_>, pass: &mut wgpu::ComputePass<'_>| {
        let groups = n.div_ceil(64);
        rec.dispatch(
            pass,
            &kernel,
            &[n],
            &[&input, &out],
            (groups.min(65535), groups.div_ceil(65535)),
        );
    };
    let got = record_and_read(&gpu, record, &[&out]);
    let mut nans = 0;
    for (&(a, b), &q) in pairs.iter().zip(&got) {
        let want = f32::from_bits(a) / f32::from_bits(b);
        if want.is_nan() {
            nans += 1;
            assert_eq!(q, 0x7FC0_0000, "{a:#x} / {b:#x}: a NaN");
        } else {
            assert_eq!(
                q,
                want.to_bits(),
                "{a:#x} / {b:#x} = {want:e}: got {:e}",
                f32::from_bits(q)
            );
        }
    }
    let subnormal = got
        .iter()
        .filter(|&&q| q & 0x7F80_0000 == 0 && q & 0x7F_FFFF != 0)
        .count();
    eprintln!("{n} quotients the host's bits: {nans} NaNs, {subnormal} subnormal");
    assert!(subnormal > 1000 && nans > 100);
}

/// Activations into 8-bit blocks of 32 (`quantize_rows.wgsl`'s `main`, what the formats in
/// blocks of 32 read under llama.cpp's arithmetic) are the host's `quantize_q8` words:
/// d and s at f16 precision, each value rounded half to even, and a block with a NaN
/// all NaN scales (so the step fails as non-finite, as on the CPU). Exact on any
/// adapter: the scales are divided as the host divides (`div.wgsl`).
#[test]
fn eight_bit_blocks_of_32_are_the_hosts() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let k = Kernels::new(&gpu).unwrap();
    let mut rng = Rng(11);
    let (rows, cols) = (5, 576);
    let mut a: Vec<f32> = (0..rows * cols).map(|_| rng.f32() * 4.0).collect();
    // A NaN, a block of zeros, an infinity-free large value.
    a[cols + 40] = f32::NAN;
    a[2 * cols..2 * cols + 32].fill(0.0);
    a[3 * cols + 7] = 1e30;
    let input = gpu.upload("a", bytemuck::cast_slice(&a));
    let aq = gpu.scratch("aq", (rows * cols / 32 * Q8_WORDS * 4) as u64);
    let record = |rec: &Recorder<'_>, pass: &mut wgpu::ComputePass<'_>| {
        let params = [cols as u32, rows as u32];
        let groups = ((cols as u32 / 32).div_ceil(64), rows as u32);
        rec.dispatch(pass, &k.quantize, &params, &[&input, &aq], groups);
    };
    let got = record_and_read(&gpu, record, &[&aq]);
    let mut blocks = vec![
        BlockQ8 {
            d: 0.0,
            s: 0.0,
            qs: [0; 32]
        };
        rows * cols / 32
    ];
    cpu::quantize_q8(cpu::isa(), &a, &mut blocks);
    let want: Vec<u32> = blocks
        .iter()
        .flat_map(|b| {
            let qs =
                b.qs.chunks(4)
                    .map(|q| u32::from_le_bytes(std::array::from_fn(|e| q[e] as u8)));
            [b.d.to_bits(), b.s.to_bits()].into_iter().chain(qs)
        })
        .collect();
    let (got, want) = (
        nan_blocks_alike(got, Q8_WORDS, 2),
        nan_blocks_alike(want, Q8_WORDS, 2),
    );
    let nan_blocks = got
        .chunks(Q8_WORDS)
        .filter(|b| f32::from_bits(b[0]).is_nan())
        .count();
    assert_eq!(nan_blocks, 1, "the block with the NaN, and only it");
    assert!(got == want, "8-bit blocks of 32");
}

#[test]
fn k_quants_on_8_bit_inputs_take_the_cpus_blocks_and_sums() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let mut k = Kernels::new(&gpu).unwrap();
    let mut plain = Kernels::with_subgroups(&gpu, false).unwrap();
    let isa = cpu::isa();
    let pool = cpu::ThreadPool::new(1).unwrap();
    let mut rng = Rng(7);
    let formats = [
        (GgmlType::Q2_K, Format::Q2K),
        (GgmlType::Q3_K, Format::Q3K),
        (GgmlType::Q4_K, Format::Q4K),
        (GgmlType::Q5_K, Format::Q5K),
        (GgmlType::Q6_K, Format::Q6K),
    ];
    let mut worst = 0f64;
    // (wide split, inputs, most workgroups a dispatch): one super-block a row, three
    // (an idle lane of four), four (several columns in one of lavapipe's subgroups of
    // 8), eight (one a lane when wide), and dispatches of 3 workgroups.
    for (wide, cols, max_groups) in [
        (false, 256, k.set.max_groups),
        (true, 256, k.set.max_groups),
        (true, 768, k.set.max_groups),
        (true, 1024, k.set.max_groups),
        (false, 2048, k.set.max_groups),
        (true, 2048, k.set.max_groups),
        (true, 2048, 3),
    ] {
        (k.set.wide, k.set.max_groups) = (wide, max_groups);
        (plain.set.wide, plain.set.max_groups) = (wide, max_groups);
        let n = 70;
        for (ty, format) in formats {
            let bytes = random_blocks(&mut rng, ty, n, cols);
            let widened = dequantize(ty, n, cols, &bytes).unwrap();
            let m = test_matrix(&gpu, format, &bytes, cols, vec![n], n);
            let mut host = cpu::QMatrix::new_for(isa, ty, n, cols, &bytes).unwrap();
            host.lay_out_for(isa, true);
            for rows in [1, 3, 9] {
                let mut a: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
                // A row with a NaN: NaN products on both.
                if rows == 3 {
                    a[cols + 5] = f32::NAN;
                }
                let case =
                    format!("{ty}, {n} x {cols}, {rows} rows, wide {wide}, {max_groups} groups");
                let (got, words) = run_q8k(&gpu, &k, &m, &a, rows);
                // The same bits with the lanes' sums added in workgroup memory.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let in_memory = run_q8k(&gpu, &plain, &m, &a, rows).0;
                assert!(bits(&got) == bits(&in_memory), "{case}: subgroups");
                let mut blocks = vec![
                    BlockQ8K {
                        d: 0.0,
                        qs: [0; 256],
                        bsums: [0; 16]
                    };
                    rows * cols / 256
                ];
                cpu::quantize_q8k(isa, &a, &mut blocks);
                // Exact on any adapter: the scales are divided as the host divides.
                let got_words = nan_blocks_alike(words, Q8K_WORDS, 1);
                let want_words = nan_blocks_alike(q8k_words(&blocks), Q8K_WORDS, 1);
                assert!(got_words == want_words, "{case}: 8-bit blocks");
                let mut act = cpu::Activations::default();
                act.set(&a, rows, cols);
                let mut want = vec![0f32; rows * n];
                cpu::matmul(&pool, isa, &mut act, &mut [(&host, &mut want)]);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let (r, o) = (i / n, i % n);
                    if r == 1 && rows == 3 {
                        assert!(g.is_nan() && w.is_nan(), "{case}: output {i}: {g} {w}");
                        continue;
                    }
                    // The sums' order differs (per super-block on the GPU, per 32 in
                    // the CPU's sixteen-row kernels): within rounding of the terms' size.
                    let size: f64 = (0..cols)
                        .map(|c| (widened[o * cols + c] as f64 * a[r * cols + c] as f64).abs())
                        .sum();
                    let err = (g as f64 - w as f64).abs() / size;
                    worst = worst.max(err);
                    assert!(err <= 1e-6, "{case}: output {i}: {g} against {w}");
                }
            }
        }
    }
    eprintln!(
        "K-quants on 8-bit inputs: largest difference from the CPU's {worst:.2e} of the terms' \
         size"
    );
}

#[test]
fn block_kernels_give_the_widened_kernels_bits() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let mut k = Kernels::new(&gpu).unwrap();
    let mut plain = Kernels::with_subgroups(&gpu, false).unwrap();
    eprintln!("subgroups: {:?}", k.subgroup);
    assert_eq!(plain.subgroup, None);
    let default_groups = k.set.max_groups;
    let mut rng = Rng(42);
    // (wide split, outputs, inputs, most workgroups a dispatch): both splits; inputs
    // of 2 and 4 chunks (several columns in one of lavapipe's subgroups of 8), 16 (one
    // a lane when wide), 18 (a non-power-of-two: idle lanes) and 128 (two a lane); dispatches of 3 workgroups (many dispatches a matmul); and 3000
    // outputs of 4096 inputs in one dispatch (where lavapipe went wrong from the 2458th
    // workgroup on when workgroups looped over column groups: docs/gpu.md).
    let shapes = [
        (false, 70, 512, default_groups),
        (true, 70, 64, default_groups),
        (true, 70, 128, default_groups),
        (true, 70, 512, default_groups),
        (true, 70, 576, default_groups),
        (true, 70, 4096, default_groups),
        (true, 70, 4096, 3),
        (false, 70, 4096, 3),
        (true, 3000, 4096, default_groups),
    ];
    for (wide, n, cols, max_groups) in shapes {
        (k.set.wide, k.set.max_groups) = (wide, max_groups);
        (plain.set.wide, plain.set.max_groups) = (wide, max_groups);
        for (ty, format) in formats() {
            if !(cols as u64).is_multiple_of(ty.block_layout().0)
                || (n > 70 && ty != GgmlType::Q4_0)
            {
                continue;
            }
            let bytes = random_blocks(&mut rng, ty, n, cols);
            let wide = dequantize(ty, n, cols, &bytes).unwrap();
            let matrix = |format, data: &[u8]| test_matrix(&gpu, format, data, cols, vec![n], n);
            let blocks = matrix(format, &bytes);
            let widened = matrix(Format::F32, bytemuck::cast_slice(&wide));
            for rows in [1, 3, 9] {
                let a: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
                let got = run(&gpu, &k, k.f32_inputs(format), &blocks, &a, rows);
                let want = run(&gpu, &k, k.f32_inputs(Format::F32), &widened, &a, rows);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let case = format!(
                    "{ty}, {n} x {cols}, {rows} rows, wide {}, {max_groups} groups",
                    k.set.wide
                );
                assert!(bits(&got) == bits(&want), "{case}");
                let in_memory = run(&gpu, &plain, plain.f32_inputs(format), &blocks, &a, rows);
                assert!(bits(&got) == bits(&in_memory), "{case}: subgroups");
                // And the products are what the host computes in f64, to the error an
                // f32 sum may make (relative to the sum of the terms' sizes).
                for (i, &g) in got.iter().enumerate() {
                    let (r, o) = (i / n, i % n);
                    let terms =
                        (0..cols).map(|c| wide[o * cols + c] as f64 * a[r * cols + c] as f64);
                    let (exact, size) = terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
                    assert!(
                        (g as f64 - exact).abs() <= 1e-5 * size + 1e-9,
                        "{case}: output {i}"
                    );
                }
            }
        }
    }
}

/// A matrix of three parts (Q, K and V's rows one after another, `Matrix::parts`), in
/// one piece and in pieces of 50 rows that straddle the parts' ends (as a matrix larger
/// than a binding goes up), each piece in one dispatch or (`Settings::fused` off) each
/// part in one per piece (`Kernels::matrix`), gives each part's output the bits of
/// that part multiplied as a matrix of its own, into its own buffer at its own stride,
/// added onto what the buffer held where asked: both splits, 1 and 9 rows, and
/// dispatches of 3 workgroups.
#[test]
fn a_matrix_of_parts_gives_each_part_its_own_bits() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let mut k = Kernels::new(&gpu).unwrap();
    let default_groups = k.set.max_groups;
    let mut rng = Rng(11);
    let (ty, cols, sizes) = (GgmlType::Q4_K, 512, [70usize, 24, 40]);
    let rows_of: usize = sizes.iter().sum();
    let bytes = random_blocks(&mut rng, ty, rows_of, cols);
    let rb = bytes.len() / rows_of;
    // Rows `first..first + n` of `bytes` as a matrix of `parts` in pieces of `per` rows.
    let matrix = |first: usize, parts: Vec<usize>, per: usize| {
        let n: usize = parts.iter().sum();
        let data = &bytes[first * rb..(first + n) * rb];
        test_matrix(&gpu, Format::Q4K, data, cols, parts, per)
    };
    let wholes = [
        matrix(0, sizes.to_vec(), rows_of),
        matrix(0, sizes.to_vec(), 50),
    ];
    let mut at = 0;
    let alone: Vec<Matrix> = sizes
        .iter()
        .map(|&n| (matrix(at, vec![n], n), at += n).0)
        .collect();
    for (wide, max_groups, add) in [
        (false, default_groups, false),
        (true, default_groups, true),
        (true, 3, false),
        (false, 3, true),
    ] {
        (k.set.wide, k.set.max_groups) = (wide, max_groups);
        for rows in [1, 9] {
            let case = format!("{rows} rows, wide {wide}, {max_groups} groups, add {add}");
            let a: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
            let a = gpu.upload("a", bytemuck::cast_slice(&a));
            // Each part's output starts as random values (added onto with `add`).
            let start: Vec<Vec<f32>> = sizes
                .iter()
                .map(|&n| (0..rows * n).map(|_| rng.f32()).collect())
                .collect();
            let outputs = || -> Vec<wgpu::Buffer> {
                start
                    .iter()
                    .map(|s| gpu.upload("y", bytemuck::cast_slice(s)))
                    .collect()
            };
            // Each part as a matrix of its own.
            let ys = outputs();
            let want = record_and_read(
                &gpu,
                |rec, pass| {
                    for (m, y) in alone.iter().zip(&ys) {
                        let out = Outputs::parts(&m.parts, &[(y, m.rows)]);
                        let kernel = k.f32_inputs(Format::Q4K);
                        k.matrix(rec, pass, kernel, m, &a, &out, rows, add);
                    }
                },
                &ys.iter().collect::<Vec<_>>(),
            );
            for (whole, fused) in wholes.iter().flat_map(|w| [(w, true), (w, false)]) {
                k.set.fused = fused;
                let ys = outputs();
                let outs: Vec<(&wgpu::Buffer, usize)> = ys.iter().zip(sizes).collect();
                let out = Outputs::parts(&whole.parts, &outs);
                let got = record_and_read(
                    &gpu,
                    |rec, pass| {
                        let kernel = k.f32_inputs(Format::Q4K);
                        k.matrix(rec, pass, kernel, whole, &a, &out, rows, add)
                    },
                    &ys.iter().collect::<Vec<_>>(),
                );
                let pieces = whole.pieces.len();
                assert!(got == want, "{case}, {pieces} pieces, fused {fused}");
            }
            k.set.fused = true;
        }
    }
}

/// A matrix of gate's and up's rows computed gated (`Outputs::gated`: act(gate) * up
/// in the matmul's own dispatch, `matmul_common.wgsl`) gives the bits of the two
/// matmuls into their own buffers and then the gate kernel: SiLU and GELU, both
/// splits, the lanes' sums within subgroups and in workgroup memory, 1 and 9 rows,
/// and dispatches of 3 workgroups.
#[test]
fn a_gated_matrix_gives_the_bits_of_its_matmuls_and_the_gate() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let mut rng = Rng(12);
    let (ty, cols, ff) = (GgmlType::Q4_K, 512, 40);
    let bytes = random_blocks(&mut rng, ty, 2 * ff, cols);
    let m = test_matrix(&gpu, Format::Q4K, &bytes, cols, vec![ff, ff], 2 * ff);
    // The lanes' sums within subgroups (where the device has them) and in workgroup
    // memory.
    for mut k in [true, false].map(|sg| Kernels::with_subgroups(&gpu, sg).unwrap()) {
        let default_groups = k.set.max_groups;
        for (wide, max_groups) in [(false, default_groups), (true, default_groups), (true, 3)] {
            (k.set.wide, k.set.max_groups) = (wide, max_groups);
            gated_case(&gpu, &k, &m, &mut rng);
        }
    }
}

/// [`a_gated_matrix_gives_the_bits_of_its_matmuls_and_the_gate`] with the kernels `k`.
fn gated_case(gpu: &Gpu, k: &Kernels, m: &Matrix, rng: &mut Rng) {
    let (cols, ff) = (m.cols, m.parts[0]);
    let (wide, max_groups, sums) = (k.set.wide, k.set.max_groups, k.subgroup);
    let kernel = k.f32_inputs(Format::Q4K);
    for (rows, gelu) in [(1, false), (9, false), (1, true), (9, true)] {
        let case = format!(
            "{rows} rows, wide {wide}, {max_groups} groups, subgroups {sums:?}, gelu {gelu}"
        );
        let a: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
        let a = gpu.upload("a", bytemuck::cast_slice(&a));
        let zeros = vec![0u8; rows * ff * 4];
        let (gate, up) = (gpu.upload("gate", &zeros), gpu.upload("up", &zeros));
        let want = record_and_read(
            gpu,
            |rec, pass| {
                let out = Outputs::parts(&m.parts, &[(&gate, ff), (&up, ff)]);
                k.matrix(rec, pass, kernel, m, &a, &out, rows, false);
                let params = [rows as u32, ff as u32, gelu as u32, 0];
                let groups = ((ff as u32).div_ceil(WG), rows as u32);
                rec.dispatch(pass, &k.glu, &params, &[&gate, &up], groups);
            },
            &[&gate],
        );
        let out = gpu.upload("out", &zeros);
        let got = record_and_read(
            gpu,
            |rec, pass| {
                let gated = Outputs::gated((&out, ff), ff, gelu);
                k.matrix(rec, pass, kernel, m, &a, &gated, rows, false);
            },
            &[&out],
        );
        assert!(want.iter().any(|&w| w != 0), "{case}: nothing computed");
        assert!(got == want, "{case}");
    }
}

/// The embedding gather (`Kernels::embed`) gives each token's row of the host's
/// `dequantize` times the scale, bit for bit, for every format the kernels decode
/// (and f32): a table of 37 rows in pieces of 10 (one dispatch each, as a table
/// larger than a binding goes up), seven tokens with a repeat, scales 1 and 2.5.
#[test]
fn the_embedding_gather_gives_the_hosts_rows() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let k = Kernels::new(&gpu).unwrap();
    let mut rng = Rng(13);
    let (n, cols, per) = (37, 256, 10);
    let tokens = [5u32, 0, 36, 12, 12, 30, 7];
    let mut padded: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
    padded.resize(tokens.len().next_multiple_of(4), 0.0);
    let ids = gpu.upload("tokens", bytemuck::cast_slice(&padded));
    for (ty, format) in formats().chain([(GgmlType::F32, Format::F32)]) {
        let bytes = match ty {
            GgmlType::F32 => {
                let v: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                bytemuck::cast_slice(&v).to_vec()
            }
            _ => random_blocks(&mut rng, ty, n, cols),
        };
        let table = test_matrix(&gpu, format, &bytes, cols, vec![n], per);
        let host = dequantize(ty, n, cols, &bytes).unwrap();
        for scale in [1.0f32, 2.5] {
            let x = gpu.upload("x", &vec![0u8; tokens.len() * cols * 4]);
            let got = record_and_read(
                &gpu,
                |rec, pass| k.embed(rec, pass, &table, &ids, &x, tokens.len(), scale),
                &[&x],
            );
            let want: Vec<u32> = tokens
                .iter()
                .flat_map(|&t| &host[t as usize * cols..(t as usize + 1) * cols])
                .map(|v| (v * scale).to_bits())
                .collect();
            assert!(got == want, "{ty:?}, scale {scale}");
        }
    }
}

/// Kernels for some formats compile those formats' pipelines only (a backend's are its
/// weights' formats), with or without subgroups; their matmuls on 8-bit inputs as for
/// every format. Asking for a format not compiled panics, naming it.
#[test]
fn kernels_compile_the_formats_asked_for_only() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let all = Kernels::new(&gpu).unwrap();
    assert_eq!(all.formats(), Format::ALL);
    let some = [Format::Q4_1, Format::Q6K];
    for subgroups in [true, false] {
        let k = Kernels::for_formats(&gpu, subgroups, &some).unwrap();
        assert_eq!(k.formats(), some);
        for f in some {
            let (q8, all_q8) = (k.q8_inputs(f), all.q8_inputs(f));
            assert_eq!(q8.map(|q| q.1), all_q8.map(|q| q.1), "{f:?}");
        }
        let ask = std::panic::AssertUnwindSafe(|| k.f32_inputs(Format::Q8_0).name);
        let missing = std::panic::catch_unwind(ask);
        let message = *missing.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("Q8_0"), "{message}");
    }
}
