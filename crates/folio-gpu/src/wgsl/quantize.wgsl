// Activations into 8-bit blocks, as the CPU path (and llama.cpp) quantizes matmul
// inputs: per 32 values, d = amax / 127 and q = round-half-even(x * 127 / amax); d and
// s = d * sum(q) kept at f16 precision. A block is 10 words: d, s, then the 32 q as
// four signed bytes per word. Dispatch: (ceil(blocks / 64), rows).
struct P { k: u32, rows: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> aq: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let r = gid.y;
    let nb = p.k / 32u;
    if (r >= p.rows || b >= nb) {
        return;
    }
    let src = r * p.k + b * 32u;
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(a[src + i]));
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    let dst = (r * nb + b) * 10u;
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
