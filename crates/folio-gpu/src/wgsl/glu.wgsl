// gate = act(gate) * up, element by element; act is SiLU, or with `gelu` set GELU's
// tanh approximation as the CPU (and llama.cpp) compute it: of the input rounded to
// f16, the result rounded to f16, 0 at or below -10 and the input itself at or above
// 10. Dispatch: (ceil(ffn / 64), rows).
struct P { rows: u32, n: u32, gelu: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;

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

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if (r >= p.rows || i >= p.n) {
        return;
    }
    let at = r * p.n + i;
    let g = gate[at];
    if (p.gelu != 0u) {
        gate[at] = gelu(g) * up[at];
    } else {
        gate[at] = g / (1.0 + exp(-g)) * up[at];
    }
}
