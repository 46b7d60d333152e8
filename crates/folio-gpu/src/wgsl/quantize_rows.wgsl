// Rows of activations into 8-bit blocks (`quantize.wgsl`, which comes first): `main`
// in blocks of 32, `q8k` in blocks of 256, an invocation a block. Dispatch:
// (ceil(blocks / 64), rows).
struct P { k: u32, rows: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> aq: array<u32>;

fn value(i: u32) -> f32 {
    return a[i];
}

fn put_q8(i: u32, word: u32) {
    aq[i] = word;
}

fn put_q8k(i: u32, word: u32) {
    aq[i] = word;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let r = gid.y;
    let nb = p.k / 32u;
    if (r >= p.rows || b >= nb) {
        return;
    }
    q8_block(r * p.k + b * 32u, (r * nb + b) * 10u);
}

@compute @workgroup_size(64)
fn q8k(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x;
    let r = gid.y;
    let nb = p.k / 256u;
    if (r >= p.rows || b >= nb) {
        return;
    }
    q8k_block(r * p.k + b * 256u, (r * nb + b) * 81u);
}
