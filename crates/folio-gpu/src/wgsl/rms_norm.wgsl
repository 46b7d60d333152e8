// RMSNorm of picked rows: y[r] = x[idx[r]] / sqrt(mean(x[idx[r]]^2) + eps) * g.
// One workgroup per output row.
struct P { dim: u32, rows: u32, eps: f32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> idx: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

var<workgroup> part: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let src = idx[r] * p.dim;
    var s = 0.0;
    for (var i = t; i < p.dim; i += 64u) {
        let v = x[src + i];
        s += v * v;
    }
    part[t] = s;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w = w >> 1u) {
        if (t < w) {
            part[t] += part[t + w];
        }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(part[0] / f32(p.dim) + p.eps);
    let dst = r * p.dim;
    for (var i = t; i < p.dim; i += 64u) {
        y[dst + i] = x[src + i] * scale * g[i];
    }
}
