// Final-logit soft-capping (Gemma 2): y = tanh(y * (1 / cap)) * cap, as the CPU's
// `ops::softcap`. Dispatch: (ceil(n / 64), rows).
struct P { rows: u32, n: u32, cap: f32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (r >= p.rows || i >= p.n) {
        return;
    }
    let at = r * p.n + i;
    y[at] = tanh(y[at] * (1.0 / p.cap)) * p.cap;
}
