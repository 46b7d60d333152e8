// What every matmul kernel shares (a reduction, `reduce_workgroup.wgsl` or
// `reduce_subgroup.wgsl`, the gated activations, `act.wgsl`, and the kernel's file
// are appended to this one): the parameters, the weight format, the work split and
// the store.
// y[r, at + o] (+)= Σ_c a[r, c] · W[o, c] over the rows of `a`, W's rows o0 <= o < n
// (W a piece of a matrix starting at its row `at`; y's rows are `stride` wide).
//
// The work split: `lanes` invocations (a power of two, up to 64; one on a software
// adapter, `Settings::wide`) share one output column, each taking every lanes-th chunk
// of CHUNK inputs (lane l: chunks l, l + lanes, ...), so neighbouring invocations read
// neighbouring weight bytes; a workgroup of 64 holds 64 / lanes columns. A chunk is 32
// inputs, or a K-quant's super-block of 256 where the kernel reads 8-bit inputs in
// blocks of 256 (`matmul_k.wgsl`). Each lane adds its chunks' products for up to TR
// rows of `a` (a chunk is decoded once per TR rows) through the kernel's own `chunk`;
// the lanes' sums are then added pairwise (lane l takes lane l + s's, s = lanes / 2,
// ..., 1: `column_sums`, in workgroup memory or, where the device has subgroups,
// within them: the same pairs, so the same bits). Chunks, their order and the pairing
// depend only on k, CHUNK and lanes, not on the format: a matrix in its blocks and the
// same matrix widened to f32 give the same bits. Dispatch: (groups of columns, ceil(rows / TR)),
// the first in several dispatches where it is large (`Kernels::matrix`): workgroup x
// of a dispatch takes column group g0 + x, and its columns from o0 of the piece.
//
// A matrix may be several matrices' rows one after another (Q, K and V; gate and up:
// `weights.rs`), its parts, each with its own output: rows before s1 go to y, those
// from s1 to y1 and from s2 to y2, each at its own stride. One dispatch computes them
// all (one barrier, not three, on a GPU); each column's sums are what they would be in
// a matrix of its own.
//
// Gated (glu 1: SiLU, 2: GELU), a matrix of gate's rows and then up's (s1 of each)
// gives y = act(gate) * up (`act.wgsl`): column o's lanes sum gate's row o and up's
// row s1 + o, chunk by chunk in the same order and added in the same pairs as each
// alone, so the same bits as the two matmuls and then the gate kernel, without the
// second dispatch or gate and up's round trip through memory. Dispatched over gate's
// rows (n = s1), one piece.
struct P {
    k: u32, n: u32, rows: u32, add: u32, stride: u32, at: u32, lanes: u32, g0: u32,
    o0: u32, s1: u32, s2: u32, stride1: u32, stride2: u32, glu: u32,
    // The embedding gather's scale (`matmul_f32_inputs.wgsl`'s `embed`), as bits.
    scale: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> y1: array<f32>;
@group(0) @binding(5) var<storage, read_write> y2: array<f32>;

// The weight format (a pipeline constant: the compiler drops the other decodings).
override FORMAT: u32 = 0u;
// Inputs per chunk (a pipeline constant: 32, or 256 in `matmul_k.wgsl`).
override CHUNK: u32 = 32u;
const Q4_0: u32 = 0u;
const Q4_1: u32 = 1u;
const Q5_0: u32 = 2u;
const Q8_0: u32 = 3u;
const Q4_K: u32 = 4u;
const Q6_K: u32 = 5u;
const F32: u32 = 6u;
const Q5_K: u32 = 7u;
const F16: u32 = 8u;
const Q5_1: u32 = 9u;
const IQ4_NL: u32 = 10u;
const Q2_K: u32 = 11u;
const Q3_K: u32 = 12u;
const BF16: u32 = 13u;

// Rows a workgroup takes. Loops over them run to TR and break at the workgroup's own
// count (nr), so that a compiler can unroll them and keep the sums (`acc`) in
// registers: indexed by a loop to nr, a GPU's compiler may put the arrays in local
// memory (the same operations in the same order: the same bits).
const TR: u32 = 8u;

var<workgroup> part: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % p.lanes;
    let o = p.o0 + (p.g0 + wg.x) * (64u / p.lanes) + li / p.lanes;
    let r0 = wg.y * TR;
    let nr = min(TR, p.rows - r0);
    let gate = p.glu != 0u;
    var acc: array<f32, 8>;
    var up: array<f32, 8>;
    if (o < p.n) {
        for (var c = lane; c < p.k / CHUNK; c += p.lanes) {
            chunk(&acc, o, c, r0, nr);
            if (gate) {
                chunk(&up, p.s1 + o, c, r0, nr);
            }
        }
    }
    let sums = column_sums(acc, li, lane, nr);
    if (gate) {
        let ups = column_sums(up, li, lane, nr);
        if (lane == 0u && o < p.n) {
            for (var i = 0u; i < TR; i++) {
                if (i >= nr) {
                    break;
                }
                y[(r0 + i) * p.stride + p.at + o] = gated(sums[i], ups[i], p.glu == 2u);
            }
        }
        return;
    }
    if (lane == 0u && o < p.n) {
        for (var i = 0u; i < TR; i++) {
            if (i >= nr) {
                break;
            }
            store(r0 + i, p.at + o, sums[i]);
        }
    }
}

// Row r's output of the matrix's row `o` (into its part's output), added with `add`.
fn store(r: u32, o: u32, v: f32) {
    let add = p.add != 0u;
    if (o < p.s1) {
        let i = r * p.stride + o;
        if (add) { y[i] += v; } else { y[i] = v; }
    } else if (o < p.s2) {
        let i = r * p.stride1 + o - p.s1;
        if (add) { y1[i] += v; } else { y1[i] = v; }
    } else {
        let i = r * p.stride2 + o - p.s2;
        if (add) { y2[i] += v; } else { y2[i] = v; }
    }
}

// The rounds of a column's pairwise sums that go through workgroup memory: lane l
// takes lane l + s's for s = lanes / 2, ..., down to `stop` (1: all of them); the
// lanes' values after them (`column_sums`, in `reduce_workgroup.wgsl` or
// `reduce_subgroup.wgsl`, does the rest). No round, no barrier, where lanes <= stop.
fn memory_rounds(acc: array<f32, 8>, li: u32, lane: u32, nr: u32, stop: u32) -> array<f32, 8> {
    var sums = acc;
    if (p.lanes <= stop) {
        return sums;
    }
    for (var i = 0u; i < TR; i++) {
        part[i * 64u + li] = acc[i];
    }
    workgroupBarrier();
    for (var s = p.lanes / 2u; s >= stop; s /= 2u) {
        if (lane < s) {
            for (var i = 0u; i < TR; i++) {
                if (i >= nr) {
                    break;
                }
                part[i * 64u + li] += part[i * 64u + li + s];
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < TR; i++) {
        if (i >= nr) {
            break;
        }
        sums[i] = part[i * 64u + li];
    }
    return sums;
}

// Byte `i` of `w`, and what it holds as a signed byte and (with the next) an f16.
fn byte_at(i: u32) -> u32 {
    return (w[i >> 2u] >> (8u * (i & 3u))) & 0xFFu;
}

fn sbyte_at(i: u32) -> i32 {
    return bitcast<i32>(byte_at(i) << 24u) >> 24u;
}

fn half_at(i: u32) -> f32 {
    return unpack2x16float(byte_at(i) | (byte_at(i + 1u) << 8u)).x;
}

// The four bytes of `w` from byte `i` (any alignment) as one little-endian word.
fn word_at(i: u32) -> u32 {
    let s = i & 3u;
    let lo = w[i >> 2u];
    if (s == 0u) {
        return lo;
    }
    return (lo >> (8u * s)) | (w[(i >> 2u) + 1u] << (32u - 8u * s));
}

// Q4_K's (and Q5_K's) 6-bit scale (x) and min (y) of sub-block j, from the 12 bytes at
// `s`.
fn scale_min_k4(s: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(s + j) & 63u, byte_at(s + j + 4u) & 63u);
    }
    let sc = (byte_at(s + j + 4u) & 0xFu) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let mn = (byte_at(s + j + 4u) >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<u32>(sc, mn);
}

// Q3_K's signed 6-bit scale s (of 16, one per 16 values), from the 12 bytes at `at`:
// 4 low bits (the low nibbles of bytes 0..7, then their high ones), then 2 high ones
// (bits 2 (s / 4) of byte 8 + s % 4), less 32.
fn scale_q3k(at: u32, s: u32) -> i32 {
    var lo = 0u;
    if (s < 8u) {
        lo = byte_at(at + s) & 0xFu;
    } else {
        lo = byte_at(at + s - 8u) >> 4u;
    }
    let hi = (byte_at(at + 8u + s % 4u) >> (2u * (s / 4u))) & 3u;
    return i32(lo | (hi << 4u)) - 32;
}
