// RoPE on every head of Q and K, from the host's (cos, sin) table of each row (the
// same table the CPU path uses: every scaling type is the host's). Pair j of a head is
// (2j, 2j + 1) (adjacent) or (j, j + half) (halves). Dispatch: (ceil(heads * half / 64), rows).
struct P { rows: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, half: u32, adjacent: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> tab: array<f32>;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> k: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (r >= p.rows || i >= (p.n_heads + p.n_kv_heads) * p.half) {
        return;
    }
    let h = i / p.half;
    let j = i % p.half;
    var a = j;
    var b = j + p.half;
    if (p.adjacent != 0u) {
        a = 2u * j;
        b = 2u * j + 1u;
    }
    let c = tab[(r * p.half + j) * 2u];
    let s = tab[(r * p.half + j) * 2u + 1u];
    if (h < p.n_heads) {
        let base = (r * p.n_heads + h) * p.head_dim;
        let x0 = q[base + a];
        let x1 = q[base + b];
        q[base + a] = x0 * c - x1 * s;
        q[base + b] = x0 * s + x1 * c;
    } else {
        let base = (r * p.n_kv_heads + h - p.n_heads) * p.head_dim;
        let x0 = k[base + a];
        let x1 = k[base + b];
        k[base + a] = x0 * c - x1 * s;
        k[base + b] = x0 * s + x1 * c;
    }
}
