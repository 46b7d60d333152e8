// y[r, o] (+)= sum_c a[r, c] * W[o, c] for the rows of `a`, W in its stored blocks
// (`w` as 32-bit words) and `a` in 8-bit blocks (`quantize.wgsl`): per block an
// integer dot product, scaled, as the CPU path's (llama.cpp's) Q4_1 × Q8 and
// Q8_0 × Q8 dot products. (`matmul_common.wgsl` comes first: the parameters, the
// output, the dispatch.)
@group(0) @binding(2) var<storage, read> aq: array<u32>;

// Four signed bytes times four signed bytes, summed.
fn dot4(x: u32, y: u32) -> i32 {
    var s = 0;
    for (var e = 0u; e < 4u; e++) {
        let sh = 24u - 8u * e;
        s += (bitcast<i32>(x << sh) >> 24u) * (bitcast<i32>(y << sh) >> 24u);
    }
    return s;
}

// Q4_1: 32 values per block of 5 words: (d, m) as two f16, then 16 bytes whose low
// nibbles are values 0..15 and high nibbles values 16..31; value = q * d + m.
@compute @workgroup_size(64)
fn q4_1(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = invocation(gid);
    let o = at.x;
    let r0 = at.y;
    let nr = at.z;
    if (nr == 0u) {
        return;
    }
    var acc: array<f32, 8>;
    let nb = p.k / 32u;
    let wrow = o * nb * 5u;
    for (var b = 0u; b < nb; b++) {
        let base = wrow + b * 5u;
        let dm = unpack2x16float(w[base]);
        var lo: array<u32, 4>;
        var hi: array<u32, 4>;
        for (var j = 0u; j < 4u; j++) {
            let q = w[base + 1u + j];
            lo[j] = q & 0x0F0F0F0Fu;
            hi[j] = (q >> 4u) & 0x0F0F0F0Fu;
        }
        for (var i = 0u; i < nr; i++) {
            let ab = ((r0 + i) * nb + b) * 10u;
            var isum = 0;
            for (var j = 0u; j < 4u; j++) {
                isum += dot4(lo[j], aq[ab + 2u + j]) + dot4(hi[j], aq[ab + 6u + j]);
            }
            let ad = bitcast<f32>(aq[ab]);
            let s = bitcast<f32>(aq[ab + 1u]);
            acc[i] += dm.x * ad * f32(isum) + dm.y * s;
        }
    }
    store(o, r0, nr, acc);
}

// Q8_0: 32 values per block of 34 bytes: d as f16, then 32 signed bytes; value = q * d.
// Blocks are not word-aligned: bytes are read out of their words (`byte_at`).
fn word_at(i: u32) -> u32 {
    return byte_at(i) | (byte_at(i + 1u) << 8u) | (byte_at(i + 2u) << 16u) | (byte_at(i + 3u) << 24u);
}

@compute @workgroup_size(64)
fn q8_0(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = invocation(gid);
    let o = at.x;
    let r0 = at.y;
    let nr = at.z;
    if (nr == 0u) {
        return;
    }
    var acc: array<f32, 8>;
    let nb = p.k / 32u;
    let wrow = o * nb * 34u;
    for (var b = 0u; b < nb; b++) {
        let base = wrow + b * 34u;
        let d = unpack2x16float(byte_at(base) | (byte_at(base + 1u) << 8u)).x;
        var qw: array<u32, 8>;
        for (var j = 0u; j < 8u; j++) {
            qw[j] = word_at(base + 2u + 4u * j);
        }
        for (var i = 0u; i < nr; i++) {
            let ab = ((r0 + i) * nb + b) * 10u;
            var isum = 0;
            for (var j = 0u; j < 8u; j++) {
                isum += dot4(qw[j], aq[ab + 2u + j]);
            }
            acc[i] += d * bitcast<f32>(aq[ab]) * f32(isum);
        }
    }
    store(o, r0, nr, acc);
}
