// Activations into 8-bit blocks, as the CPU path (and llama.cpp) quantizes matmul
// inputs: per 32 values, d = amax / 127 and q = round-half-even(x * 127 / amax); d and
// s = d * sum(q) kept at f16 precision; a block with a NaN has d = s = NaN and q = 0
// (every product with it NaN, as on the host). A block is 10 words: d, s, then the 32
// q as four signed bytes per word. Dispatch: (ceil(blocks / 64), rows).
struct P { k: u32, rows: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> aq: array<u32>;

// NaN by its bits: a compiler may take `v != v` to be false.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7FFFFFFFu) > 0x7F800000u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let r = gid.y;
    let nb = p.k / 32u;
    if (r >= p.rows || b >= nb) {
        return;
    }
    let src = r * p.k + b * 32u;
    let dst = (r * nb + b) * 10u;
    var amax = 0.0;
    var nan = false;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(a[src + i]));
        nan = nan || is_nan(a[src + i]);
    }
    if (nan) {
        aq[dst] = 0x7FC00000u;
        aq[dst + 1u] = 0x7FC00000u;
        for (var w = 0u; w < 8u; w++) {
            aq[dst + 2u + w] = 0u;
        }
        return;
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    var sum = 0;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var e = 0u; e < 4u; e++) {
            let q = i32(round(a[src + 4u * w + e] * id));
            sum += q;
            word |= (u32(q) & 0xFFu) << (8u * e);
        }
        aq[dst + 2u + w] = word;
    }
    aq[dst] = bitcast<u32>(quantizeToF16(d));
    aq[dst + 1u] = bitcast<u32>(quantizeToF16(d * f32(sum)));
}

// Activations into 8-bit blocks of 256 for the K-quants' matmuls (`matmul_k.wgsl`), as
// the CPU path (and llama.cpp's `quantize_row_q8_K_ref`) quantizes them: per 256
// values, the first of largest magnitude, big, maps to -127 (iscale = -127 / big), q =
// min(round-half-even(x * iscale), 127), d = 1 / iscale (f32); a block with a NaN has
// d = NaN (every product with it NaN, as on the host). A block is 81 words: d, the 256
// q as four signed bytes per word, then the 16 sums of each 16 q. Dispatch:
// (ceil(blocks / 64), rows).
@compute @workgroup_size(64)
fn q8k(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let r = gid.y;
    let nb = p.k / 256u;
    if (r >= p.rows || b >= nb) {
        return;
    }
    let src = r * p.k + b * 256u;
    let dst = (r * nb + b) * 81u;
    var big = 0.0;
    var amax = 0.0;
    var nan = false;
    for (var i = 0u; i < 256u; i++) {
        let v = a[src + i];
        nan = nan || is_nan(v);
        if (abs(v) > amax) {
            amax = abs(v);
            big = v;
        }
    }
    if (amax == 0.0 || nan) {
        for (var i = 1u; i < 81u; i++) {
            aq[dst + i] = 0u;
        }
        aq[dst] = select(0u, 0x7FC00000u, nan);
        return;
    }
    let iscale = -127.0 / big;
    for (var s = 0u; s < 16u; s++) {
        var sum = 0;
        for (var w = 0u; w < 4u; w++) {
            var word = 0u;
            for (var e = 0u; e < 4u; e++) {
                let q = min(i32(round(iscale * a[src + 16u * s + 4u * w + e])), 127);
                sum += q;
                word |= (u32(q) & 0xFFu) << (8u * e);
            }
            aq[dst + 1u + 4u * s + w] = word;
        }
        aq[dst + 65u + s] = bitcast<u32>(sum);
    }
    aq[dst] = bitcast<u32>(1.0 / iscale);
}
