// y[r, i] += bias[i] for every row of y (n wide). Dispatch: (ceil(n / 64), rows).
struct P { rows: u32, n: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (r >= p.rows || i >= p.n) {
        return;
    }
    y[r * p.n + i] += bias[i];
}
