// The matmul on f32 inputs (the default arithmetic: nearer the exact model than
// rounding the inputs to 8 bits), one kernel for every weight format: the pipeline's
// FORMAT constant picks the decoding. A chunk's 32 weights are decoded to f32 four at a
// time with the host's `dequantize` operations, and each four is added to a row's sum
// as one dot product with its four inputs, in order: a matrix in its blocks gives the
// bits of the same matrix widened on the host (`matmul_tests.rs`).
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
// - Q5_K (176 bytes, 256 values): Q4_K's d, dmin and 12 bytes of scales and mins, 32
//   bytes qh, then Q4_K's 128 bytes of nibbles; value 32j + l's fifth bit is bit j of
//   qh[l]; weight = (d * scale) * q - dmin * min.
// - Q5_1 (24 bytes): d, m (f16), then Q5_0's fifth bits and nibbles; weight = d * q + m.
// - IQ4_NL (18 bytes): d, then Q4_0's nibbles, each an index into a table of 16
//   levels; weight = d * level.
// - Q2_K (84 bytes, 256 values): 16 bytes of 4-bit scales (low) and mins (high), one
//   per 16 values, 64 bytes of 2-bit values (value 128n + 32k + l is bits 2k of
//   byte 32n + l), then d, dmin; weight = (d * scale) * q - dmin * min.
// - Q3_K (110 bytes, 256 values): 32 bytes hmask, 64 bytes of 2-bit values (laid out
//   as Q2_K's), 12 bytes of 16 packed 6-bit scales (minus 32), then d; value
//   32k + l is its 2-bit value less 4 where bit k of hmask[l] is clear;
//   weight = (d * scale) * q.
// - F16, BF16: two weights a word.
// - F32: a matrix widened on the host, one word a weight.
@group(0) @binding(2) var<storage, read> a: array<vec4<f32>>;

// What a chunk's four-value groups share: where its bytes start (`at`: the
// quantized values; for F32 and F16 the first word), its factor and offset (weight =
// f * q - off; Q6_K: f is d, each 16 values having their own scale), and Q5_0's word
// of fifth bits (Q5_K: where its fifth bits start).
struct Chunk { at: u32, f: f32, off: f32, x: u32 }

// IQ4_NL's 16 levels (GGUF's fixed table).
const IQ4NL = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
);

// Chunk c (32 inputs) of W's row o.
fn chunk_head(o: u32, c: u32) -> Chunk {
    switch FORMAT {
        case 0u: {
            let base = (o * (p.k / 32u) + c) * 18u;
            return Chunk(base + 2u, half_at(base), 0.0, 0u);
        }
        case 1u: {
            let base = (o * (p.k / 32u) + c) * 20u;
            return Chunk(base + 4u, half_at(base), -half_at(base + 2u), 0u);
        }
        case 2u: {
            let base = (o * (p.k / 32u) + c) * 22u;
            return Chunk(base + 6u, half_at(base), 0.0, word_at(base + 2u));
        }
        case 3u: {
            let base = (o * (p.k / 32u) + c) * 34u;
            return Chunk(base + 2u, half_at(base), 0.0, 0u);
        }
        case 4u: {
            let base = (o * (p.k / 256u) + c / 8u) * 144u;
            let j = c % 8u;
            let sm = scale_min_k4(base + 4u, j);
            let f = half_at(base) * f32(sm.x);
            let off = half_at(base + 2u) * f32(sm.y);
            return Chunk(base + 16u + (j / 2u) * 32u, f, off, 0u);
        }
        case 5u: {
            let base = (o * (p.k / 256u) + c / 8u) * 210u;
            return Chunk(base, half_at(base + 208u), 0.0, 0u);
        }
        case 7u: {
            let base = (o * (p.k / 256u) + c / 8u) * 176u;
            let j = c % 8u;
            let sm = scale_min_k4(base + 4u, j);
            let f = half_at(base) * f32(sm.x);
            let off = half_at(base + 2u) * f32(sm.y);
            // x: where qh starts.
            return Chunk(base + 48u + (j / 2u) * 32u, f, off, base + 16u);
        }
        case 8u, 13u: {
            return Chunk((o * p.k + c * 32u) / 2u, 1.0, 0.0, 0u);
        }
        case 9u: {
            let base = (o * (p.k / 32u) + c) * 24u;
            return Chunk(base + 8u, half_at(base), -half_at(base + 2u), w[(base >> 2u) + 1u]);
        }
        case 10u: {
            let base = (o * (p.k / 32u) + c) * 18u;
            return Chunk(base + 2u, half_at(base), 0.0, 0u);
        }
        case 11u: {
            let base = (o * (p.k / 256u) + c / 8u) * 84u;
            return Chunk(base, half_at(base + 80u), half_at(base + 82u), 0u);
        }
        case 12u: {
            let base = (o * (p.k / 256u) + c / 8u) * 110u;
            return Chunk(base, half_at(base + 108u), 0.0, 0u);
        }
        default: {
            return Chunk(o * p.k + c * 32u, 1.0, 0.0, 0u);
        }
    }
}

// The four bytes of `q` as unsigned values, each masked by `m`.
fn bytes4(q: u32, m: u32) -> vec4<i32> {
    return vec4<i32>(vec4<u32>(q, q >> 8u, q >> 16u, q >> 24u) & vec4<u32>(m));
}

// Weights 4g..4g+3 of chunk c (`h` its head).
fn group4(h: Chunk, c: u32, g: u32) -> vec4<f32> {
    var q: vec4<i32>;
    var f = h.f;
    switch FORMAT {
        case 0u, 1u: {
            // Values 0..15 are the low nibbles of 16 bytes, 16..31 the high ones.
            q = bytes4(word_at(h.at + 4u * (g % 4u)) >> (4u * (g / 4u)), 0xFu);
            if (FORMAT == Q4_0) {
                q -= vec4<i32>(8);
            }
        }
        case 2u, 9u: {
            // Q4_0's nibbles, and bit e of the word of fifth bits for value e.
            let lo = bytes4(word_at(h.at + 4u * (g % 4u)) >> (4u * (g / 4u)), 0xFu);
            let hi = (vec4<u32>(h.x >> (4u * g)) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u);
            q = lo | vec4<i32>(hi << vec4<u32>(4u));
            if (FORMAT == Q5_0) {
                q -= vec4<i32>(16);
            }
        }
        case 10u: {
            let n = bytes4(word_at(h.at + 4u * (g % 4u)) >> (4u * (g / 4u)), 0xFu);
            return h.f * vec4<f32>(IQ4NL[n.x], IQ4NL[n.y], IQ4NL[n.z], IQ4NL[n.w]) - 0.0;
        }
        case 11u: {
            // Sub-block j = c % 8 of 32: its values are 2-bit field k = j % 4 of bytes
            // 32 (j / 4) + l; 16 values share a scale and min.
            let j = c % 8u;
            let q2 = bytes4(w[((h.at + 16u + 32u * (j / 4u)) >> 2u) + g] >> (2u * (j % 4u)), 3u);
            let sm = byte_at(h.at + 2u * j + g / 4u);
            let f2 = h.f * f32(sm & 0xFu);
            let off2 = h.off * f32(sm >> 4u);
            return f2 * vec4<f32>(q2) - off2;
        }
        case 12u: {
            let j = c % 8u;
            let q2 = bytes4(word_at(h.at + 32u + 32u * (j / 4u) + 4u * g) >> (2u * (j % 4u)), 3u);
            let hm = bytes4(word_at(h.at + 4u * g) >> j, 1u);
            q = q2 - vec4<i32>(4) + 4 * hm;
            f = h.f * f32(scale_q3k(h.at + 96u, 2u * j + g / 4u));
        }
        case 3u: {
            let v = word_at(h.at + 4u * g);
            q = vec4<i32>(bitcast<i32>(v << 24u), bitcast<i32>(v << 16u), bitcast<i32>(v << 8u), bitcast<i32>(v)) >> vec4<u32>(24u);
        }
        case 4u: {
            q = bytes4(w[(h.at >> 2u) + g] >> (4u * ((c % 8u) & 1u)), 0xFu);
        }
        case 5u: {
            // In each half of 128 values, value l + 32t takes nibble t >> 1 of
            // ql[l + 32 (t & 1)] and bits 2t of qh[l]; 16 values share a scale.
            let j = c % 8u;
            let half = j / 4u;
            let t = j % 4u;
            let ql = word_at(h.at + half * 64u + 32u * (t & 1u) + 4u * g) >> (4u * (t >> 1u));
            let qh = word_at(h.at + 128u + half * 32u + 4u * g) >> (2u * t);
            q = (bytes4(ql, 0xFu) | (bytes4(qh, 3u) << vec4<u32>(4u))) - vec4<i32>(32);
            f = h.f * f32(sbyte_at(h.at + 192u + half * 8u + t * 2u + g / 4u));
        }
        case 7u: {
            let lo = bytes4(w[(h.at >> 2u) + g] >> (4u * ((c % 8u) & 1u)), 0xFu);
            let hi = bytes4(w[(h.x >> 2u) + g] >> (c % 8u), 1u);
            q = lo | (hi << vec4<u32>(4u));
        }
        case 8u: {
            let a = unpack2x16float(w[h.at + 2u * g]);
            let b = unpack2x16float(w[h.at + 2u * g + 1u]);
            return vec4<f32>(a, b);
        }
        case 13u: {
            // A bfloat16 is the top half of an f32.
            let a = w[h.at + 2u * g];
            let b = w[h.at + 2u * g + 1u];
            let m = 0xFFFF0000u;
            return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & m, b << 16u, b & m));
        }
        default: {
            let i = h.at + 4u * g;
            return bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
        }
    }
    return f * vec4<f32>(q) - h.off;
}

fn chunk(acc: ptr<function, array<f32, 8>>, o: u32, c: u32, r0: u32, nr: u32) {
    let h = chunk_head(o, c);
    for (var g = 0u; g < 8u; g++) {
        let wv = group4(h, c, g);
        for (var i = 0u; i < TR; i++) {
            if (i >= nr) {
                break;
            }
            (*acc)[i] += dot(wv, a[((r0 + i) * p.k + c * 32u) / 4u + g]);
        }
    }
}

// The embedding gather (entry point `embed`): y[r] = W[tokens[r]] * scale for the rows
// whose token is one of this piece's rows (W holds the table's rows from `at`, `n` of
// them; a table in several pieces is one dispatch each), decoded as the matmul decodes
// them: the host's `dequantize` bit for bit (`matmul_tests.rs`, on lavapipe: a GPU's
// compiler may fuse a decoding's multiply and subtract). The step's tokens are the
// values of `a` (an entry point binds only what it reads, in order), as f32 (exact
// below 2^24: `weights::check`); `scale` is the model's embedding scale as bits (1
// where it has none: the same bits as none). One invocation a chunk of 32 values of
// a row. Dispatch: (ceil(k / 32 / 64), rows).
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let r = gid.y;
    if (c >= p.k / 32u || r >= p.rows) {
        return;
    }
    let t = u32(a[r / 4u][r % 4u]);
    if (t < p.at || t - p.at >= p.n) {
        return;
    }
    let h = chunk_head(t - p.at, c);
    let scale = bitcast<f32>(p.scale);
    for (var g = 0u; g < 8u; g++) {
        let v = group4(h, c, g) * scale;
        let i = r * p.k + c * 32u + 4u * g;
        y[i] = v.x;
        y[i + 1u] = v.y;
        y[i + 2u] = v.z;
        y[i + 3u] = v.w;
    }
}
