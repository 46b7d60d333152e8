// Element-wise kernels over `rows` rows of `n` values (a, row-major), one invocation
// per value. Dispatch: (ceil(n / 64), rows).
// - `glu`: a = act(a) * b (a the gate, b up): SiLU, or with `x` set GELU's tanh
//   approximation (`act.wgsl`, which this file follows).
// - `bias`: a[r, i] += b[i] (Q/K/V biases).
// - `softcap`: a = tanh(a * (1 / cap)) * cap, cap = bitcast<f32>(x) (final-logit
//   soft-capping, as the CPU's `ops::softcap`).
struct P { rows: u32, n: u32, x: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;

// Value (row, column) of the invocation, or none past the ends.
fn at(gid: vec3<u32>) -> vec2<u32> {
    return vec2<u32>(gid.y * p.n + gid.x, u32(gid.y < p.rows && gid.x < p.n));
}

@compute @workgroup_size(64)
fn glu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.y == 0u) {
        return;
    }
    a[i.x] = gated(a[i.x], b[i.x], p.x != 0u);
}

@compute @workgroup_size(64)
fn bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.y != 0u) {
        a[i.x] += b[gid.x];
    }
}

@compute @workgroup_size(64)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = at(gid);
    if (i.y != 0u) {
        let cap = bitcast<f32>(p.x);
        a[i.x] = tanh(a[i.x] * (1.0 / cap)) * cap;
    }
}
