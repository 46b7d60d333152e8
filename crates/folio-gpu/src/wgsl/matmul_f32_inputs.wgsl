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
