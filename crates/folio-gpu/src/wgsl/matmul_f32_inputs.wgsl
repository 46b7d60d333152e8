// y[r, o] (+)= sum_c a[r, c] * W[o, c] for the rows of `a` (f32, unrounded), W in its
// stored blocks (`w` as 32-bit words), each weight decoded to f32. The default
// arithmetic: nearer the exact model than rounding the inputs to 8 bits.
// Each invocation computes one output column for up to TR rows (a weight block is
// decoded once per TR rows). Dispatch: (ceil(n / 64), ceil(rows / TR)).
struct P { k: u32, n: u32, rows: u32, add: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const TR: u32 = 8u;

fn store(o: u32, r0: u32, nr: u32, acc: array<f32, 8>) {
    var acc2 = acc;
    for (var i = 0u; i < nr; i++) {
        let yi = (r0 + i) * p.n + o;
        if (p.add != 0u) {
            y[yi] += acc2[i];
        } else {
            y[yi] = acc2[i];
        }
    }
}

// Q4_1: 32 values per block of 5 words: (d, m) as two f16, then 16 bytes whose low
// nibbles are values 0..15 and high nibbles values 16..31; value = q * d + m.
@compute @workgroup_size(64)
fn q4_1(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let nb = p.k / 32u;
    let wrow = o * nb * 5u;
    for (var b = 0u; b < nb; b++) {
        let base = wrow + b * 5u;
        let dm = unpack2x16float(w[base]);
        for (var j = 0u; j < 4u; j++) {
            let q = w[base + 1u + j];
            for (var e = 0u; e < 4u; e++) {
                let byte = (q >> (8u * e)) & 0xFFu;
                let lo = f32(byte & 0xFu) * dm.x + dm.y;
                let hi = f32(byte >> 4u) * dm.x + dm.y;
                let c = b * 32u + 4u * j + e;
                for (var i = 0u; i < nr; i++) {
                    let ar = (r0 + i) * p.k + c;
                    acc[i] += lo * a[ar] + hi * a[ar + 16u];
                }
            }
        }
    }
    store(o, r0, nr, acc);
}

// Q8_0: 32 values per block of 34 bytes: d as f16, then 32 signed bytes; value = q * d.
fn byte_at(i: u32) -> u32 {
    return (w[i >> 2u] >> (8u * (i & 3u))) & 0xFFu;
}

@compute @workgroup_size(64)
fn q8_0(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let nb = p.k / 32u;
    let wrow = o * nb * 34u;
    for (var b = 0u; b < nb; b++) {
        let base = wrow + b * 34u;
        let d = unpack2x16float(byte_at(base) | (byte_at(base + 1u) << 8u)).x;
        for (var e = 0u; e < 32u; e++) {
            let q = f32(bitcast<i32>(byte_at(base + 2u + e) << 24u) >> 24u) * d;
            let c = b * 32u + e;
            for (var i = 0u; i < nr; i++) {
                acc[i] += q * a[(r0 + i) * p.k + c];
            }
        }
    }
    store(o, r0, nr, acc);
}

// The formats below decode each weight to f32 as the host's `dequantize` does (the
// same operations in the same order) and add `w · a` to the accumulators column by
// column, as `matmul_f32.wgsl` does for a widened matrix: the two give the same bits
// (`weights.rs` tests it), at a quarter to a seventh of the bytes.

// One byte's signed value.
fn sbyte_at(i: u32) -> i32 {
    return bitcast<i32>(byte_at(i) << 24u) >> 24u;
}

// The f16 at byte `i` (little-endian).
fn half_at(i: u32) -> f32 {
    return unpack2x16float(byte_at(i) | (byte_at(i + 1u) << 8u)).x;
}

fn add_column(acc: ptr<function, array<f32, 8>>, v: f32, c: u32, r0: u32, nr: u32) {
    for (var i = 0u; i < nr; i++) {
        (*acc)[i] += v * a[(r0 + i) * p.k + c];
    }
}

// Q4_0: 32 values per block of 18 bytes: d as f16, then 16 bytes whose low nibbles
// are values 0..15 and high nibbles values 16..31; value = (q - 8) * d.
@compute @workgroup_size(64)
fn q4_0(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let nb = p.k / 32u;
    for (var b = 0u; b < nb; b++) {
        let base = (o * nb + b) * 18u;
        let d = half_at(base);
        for (var e = 0u; e < 32u; e++) {
            let byte = byte_at(base + 2u + (e & 15u));
            let q = (byte >> (4u * (e >> 4u))) & 0xFu;
            add_column(&acc, f32(i32(q) - 8) * d, b * 32u + e, r0, nr);
        }
    }
    store(o, r0, nr, acc);
}

// Q5_0: 32 values per block of 22 bytes: d as f16, a 32-bit word of fifth bits (bit
// e for value e), then Q4_0's nibbles; value = (q - 16) * d.
@compute @workgroup_size(64)
fn q5_0(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let nb = p.k / 32u;
    for (var b = 0u; b < nb; b++) {
        let base = (o * nb + b) * 22u;
        let d = half_at(base);
        let qh = byte_at(base + 2u) | (byte_at(base + 3u) << 8u) | (byte_at(base + 4u) << 16u)
            | (byte_at(base + 5u) << 24u);
        for (var e = 0u; e < 32u; e++) {
            let byte = byte_at(base + 6u + (e & 15u));
            let q = ((byte >> (4u * (e >> 4u))) & 0xFu) | (((qh >> e) & 1u) << 4u);
            add_column(&acc, f32(i32(q) - 16) * d, b * 32u + e, r0, nr);
        }
    }
    store(o, r0, nr, acc);
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

// Q4_K: 256 values per block of 144 bytes: d and dmin as f16, 12 bytes of 6-bit
// scales and mins of eight sub-blocks of 32, then 128 bytes: for sub-blocks 2i and
// 2i+1, 32 bytes whose low nibbles are the first's values and high nibbles the
// second's; value = (d * scale) * q - dmin * min.
@compute @workgroup_size(64)
fn q4_k(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let nb = p.k / 256u;
    for (var b = 0u; b < nb; b++) {
        let base = (o * nb + b) * 144u;
        let d = half_at(base);
        let dmin = half_at(base + 2u);
        for (var j = 0u; j < 8u; j++) {
            let sm = scale_min_k4(base + 4u, j);
            let scale = d * f32(sm.x);
            let least = dmin * f32(sm.y);
            let qs = base + 16u + (j >> 1u) * 32u;
            let shift = (j & 1u) * 4u;
            for (var l = 0u; l < 32u; l++) {
                let q = (byte_at(qs + l) >> shift) & 0xFu;
                add_column(&acc, scale * f32(q) - least, b * 256u + j * 32u + l, r0, nr);
            }
        }
    }
    store(o, r0, nr, acc);
}

// Q6_K: 256 values per block of 210 bytes: 128 bytes of low nibbles, 64 of high
// 2-bit pairs, 16 signed 8-bit scales (one per 16 values), d as f16; in each half
// of 128 values, value l + 32t (t = 0..3) takes nibble t of (ql[l], ql[l + 32])
// and bits 2t of qh[l]: value = (d * scale) * (q - 32).
@compute @workgroup_size(64)
fn q6_k(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let nb = p.k / 256u;
    for (var b = 0u; b < nb; b++) {
        let base = (o * nb + b) * 210u;
        let d = half_at(base + 208u);
        for (var h = 0u; h < 2u; h++) {
            let ql = base + h * 64u;
            let qh = base + 128u + h * 32u;
            let sc = base + 192u + h * 8u;
            for (var t = 0u; t < 4u; t++) {
                for (var l = 0u; l < 32u; l++) {
                    let low = (byte_at(ql + l + 32u * (t & 1u)) >> (4u * (t >> 1u))) & 0xFu;
                    let high = (byte_at(qh + l) >> (2u * t)) & 3u;
                    let q = i32(low | (high << 4u)) - 32;
                    let scale = d * f32(sbyte_at(sc + l / 16u + 2u * t));
                    add_column(&acc, scale * f32(q), b * 256u + h * 128u + 32u * t + l, r0, nr);
                }
            }
        }
    }
    store(o, r0, nr, acc);
}
