// y[r, o] (+)= sum_c a[r, c] * W[o, c] for the rows of `a`, W in its stored blocks
// (`w` as 32-bit words) and `a` in 8-bit blocks (`quantize.wgsl`): per block an
// integer dot product, scaled, as the CPU path's (llama.cpp's) Q4_1 × Q8 and
// Q8_0 × Q8 dot products. A chunk is one block. (`matmul_common.wgsl` comes first:
// the parameters, the format, the work split, the store.)
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

// Block c of W's row o against block c of each row's 8-bit input.
// - Q4_1: 5 words: (d, m) as two f16, then 16 bytes whose low nibbles are values
//   0..15 and high nibbles values 16..31; value = q * d + m.
// - Q8_0: 34 bytes: d as f16, then 32 signed bytes; value = q * d. Blocks are not
//   word-aligned (`word_at`).
fn chunk(acc: ptr<function, array<f32, 8>>, o: u32, c: u32, r0: u32, nr: u32) {
    let nb = p.k / 32u;
    var qw: array<u32, 8>;
    var dm: vec2<f32>;
    if (FORMAT == Q4_1) {
        let base = (o * nb + c) * 5u;
        dm = unpack2x16float(w[base]);
        for (var j = 0u; j < 4u; j++) {
            let q = w[base + 1u + j];
            qw[j] = q & 0x0F0F0F0Fu;
            qw[j + 4u] = (q >> 4u) & 0x0F0F0F0Fu;
        }
    } else {
        let base = (o * nb + c) * 34u;
        dm = vec2<f32>(half_at(base), 0.0);
        for (var j = 0u; j < 8u; j++) {
            qw[j] = word_at(base + 2u + 4u * j);
        }
    }
    for (var i = 0u; i < nr; i++) {
        let ab = ((r0 + i) * nb + c) * 10u;
        var isum = 0;
        for (var j = 0u; j < 8u; j++) {
            isum += dot4(qw[j], aq[ab + 2u + j]);
        }
        let ad = bitcast<f32>(aq[ab]);
        if (FORMAT == Q4_1) {
            (*acc)[i] += dm.x * ad * f32(isum) + dm.y * bitcast<f32>(aq[ab + 1u]);
        } else {
            (*acc)[i] += dm.x * ad * f32(isum);
        }
    }
}
