// Element-wise kernels over `rows` rows of `n` values (a, row-major), one invocation
// per value. Dispatch: (ceil(n / 64), rows).
// - `glu`: a = act(a) * b (a the gate, b up): SiLU, or with `x` set GELU's tanh
//   approximation as the CPU (and llama.cpp) compute it: of the input rounded to f16,
//   the result rounded to f16, 0 at or below -10 and the input itself at or above 10.
// - `bias`: a[r, i] += b[i] (Q/K/V biases).
// - `softcap`: a = tanh(a * (1 / cap)) * cap, cap = bitcast<f32>(x) (final-logit
//   soft-capping, as the CPU's `ops::softcap`).
struct P { rows: u32, n: u32, x: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;

fn gelu(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let h = quantizeToF16(x);
    return quantizeToF16(0.5 * h * (1.0 + tanh(0.7978846 * h * (1.0 + 0.044715 * h * h))));
}

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
    let g = a[i.x];
    if (p.x != 0u) {
        a[i.x] = gelu(g) * b[i.x];
    } else {
        a[i.x] = g / (1.0 + exp(-g)) * b[i.x];
    }
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
