// The matmul on f32 inputs (the default arithmetic: nearer the exact model than
// rounding the inputs to 8 bits), one kernel for every weight format: the pipeline's
// FORMAT constant picks the decoding (the compiler drops the others). Each weight is
// decoded to f32 with the host's `dequantize` operations in the host's order, and
// added column by column in order, so a matrix in its blocks gives the bits of the
// same matrix widened on the host (`matmul_tests.rs`).
//
// A block of 32 or 256 values is read as groups of 16: group g's factor and offset,
// then each value's integer q: weight = factor * q - offset.
// - Q4_0 (18 bytes): d (f16), then 16 bytes whose low nibbles are values 0..15 and
//   high nibbles values 16..31; weight = d * (q - 8).
// - Q4_1 (20 bytes): d, m (f16), then Q4_0's nibbles; weight = d * q + m.
// - Q5_0 (22 bytes): d, a 32-bit word of fifth bits (bit e for value e), then Q4_0's
//   nibbles; weight = d * (q - 16).
// - Q8_0 (34 bytes): d, then 32 signed bytes; weight = d * q.
// - Q4_K (144 bytes, 256 values): d, dmin (f16), 12 bytes of 6-bit scales and mins
//   of eight sub-blocks of 32, then 128 bytes: for sub-blocks 2i and 2i+1, 32 bytes
//   whose low nibbles are the first's values and high nibbles the second's;
//   weight = (d * scale) * q - dmin * min.
// - Q6_K (210 bytes, 256 values): 128 bytes of low nibbles, 64 of high 2-bit pairs,
//   16 signed 8-bit scales (one per 16 values), d; in each half of 128 values, value
//   l + 32t (t = 0..3) takes nibble t >> 1 of ql[l + 32 (t & 1)] and bits 2t of
//   qh[l]; weight = (d * scale) * (q - 32).
// - F32: a matrix widened on the host, one word a weight.
@group(0) @binding(2) var<storage, read> a: array<f32>;

override FORMAT: u32 = 0u;
const Q4_0: u32 = 0u;
const Q4_1: u32 = 1u;
const Q5_0: u32 = 2u;
const Q8_0: u32 = 3u;
const Q4_K: u32 = 4u;
const Q6_K: u32 = 5u;
const F32: u32 = 6u;

fn block_values() -> u32 {
    return select(32u, 256u, FORMAT == Q4_K || FORMAT == Q6_K);
}

fn block_bytes() -> u32 {
    switch FORMAT {
        case 0u: { return 18u; }
        case 1u: { return 20u; }
        case 2u: { return 22u; }
        case 3u: { return 34u; }
        case 4u: { return 144u; }
        default: { return 210u; }
    }
}

// Q4_K's 6-bit scale (x) and min (y) of sub-block j, from the 12 bytes at `s`.
fn scale_min_k4(s: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(s + j) & 63u, byte_at(s + j + 4u) & 63u);
    }
    let sc = (byte_at(s + j + 4u) & 0xFu) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let mn = (byte_at(s + j + 4u) >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<u32>(sc, mn);
}

// Group g's (factor, offset) in the block at byte `base`.
fn group(base: u32, g: u32) -> vec2<f32> {
    switch FORMAT {
        case 1u: { return vec2<f32>(half_at(base), -half_at(base + 2u)); }
        case 4u: {
            let sm = scale_min_k4(base + 4u, g >> 1u);
            return vec2<f32>(half_at(base) * f32(sm.x), half_at(base + 2u) * f32(sm.y));
        }
        case 5u: { return vec2<f32>(half_at(base + 208u) * f32(sbyte_at(base + 192u + g)), 0.0); }
        default: { return vec2<f32>(half_at(base), 0.0); }
    }
}

// Nibble e (0..32) of the 16 bytes at `qs`.
fn nibble(qs: u32, e: u32) -> u32 {
    return (byte_at(qs + (e & 15u)) >> (4u * (e >> 4u))) & 0xFu;
}

// Value e's integer in the block at byte `base`.
fn quant(base: u32, e: u32) -> i32 {
    switch FORMAT {
        case 0u: { return i32(nibble(base + 2u, e)) - 8; }
        case 1u: { return i32(nibble(base + 4u, e)); }
        case 2u: {
            let qh = byte_at(base + 2u + (e >> 3u)) >> (e & 7u);
            return i32(nibble(base + 6u, e) | ((qh & 1u) << 4u)) - 16;
        }
        case 3u: { return sbyte_at(base + 2u + e); }
        case 4u: {
            let j = e >> 5u;
            return i32((byte_at(base + 16u + (j >> 1u) * 32u + (e & 31u)) >> (4u * (j & 1u))) & 0xFu);
        }
        default: {
            let h = e >> 7u;
            let t = (e >> 5u) & 3u;
            let l = e & 31u;
            let low = (byte_at(base + h * 64u + l + 32u * (t & 1u)) >> (4u * (t >> 1u))) & 0xFu;
            let high = (byte_at(base + 128u + h * 32u + l) >> (2u * t)) & 3u;
            return i32(low | (high << 4u)) - 32;
        }
    }
}

fn add_column(acc: ptr<function, array<f32, 8>>, v: f32, c: u32, r0: u32, nr: u32) {
    for (var i = 0u; i < nr; i++) {
        (*acc)[i] += v * a[(r0 + i) * p.k + c];
    }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = invocation(gid);
    let o = at.x;
    let r0 = at.y;
    let nr = at.z;
    if (nr == 0u) {
        return;
    }
    var acc: array<f32, 8>;
    if (FORMAT == F32) {
        for (var c = 0u; c < p.k; c++) {
            add_column(&acc, bitcast<f32>(w[o * p.k + c]), c, r0, nr);
        }
    } else {
        let bv = block_values();
        let nb = p.k / bv;
        for (var b = 0u; b < nb; b++) {
            let base = (o * nb + b) * block_bytes();
            for (var g = 0u; g < bv / 16u; g++) {
                let fo = group(base, g);
                for (var l = 0u; l < 16u; l++) {
                    let e = g * 16u + l;
                    add_column(&acc, fo.x * f32(quant(base, e)) - fo.y, b * bv + e, r0, nr);
                }
            }
        }
    }
    store(o, r0, nr, acc);
}
