// RMSNorm where the model norms more than a layer's input, one workgroup per row of
// `dim` values (rows = rows of the batch times heads for a per-head norm):
// - `in_place`: a[r] = a[r] / sqrt(mean(a[r]^2) + eps) * g (per-head Q/K norms);
// - `add`: b[r] += a[r] / sqrt(mean(a[r]^2) + eps) * g (a post-norm: the normed output
//   of a block added to the residual stream b).
// Dispatch: (rows, 1).
struct P { dim: u32, rows: u32, eps: f32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> b: array<f32>;

var<workgroup> part: array<f32, 64>;

// 1 / the root mean square (with eps) of row r of `a`.
fn inv_rms(r: u32, t: u32) -> f32 {
    var s = 0.0;
    for (var i = t; i < p.dim; i += 64u) {
        let v = a[r * p.dim + i];
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
    return 1.0 / sqrt(part[0] / f32(p.dim) + p.eps);
}

@compute @workgroup_size(64)
fn in_place(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let scale = inv_rms(r, t);
    for (var i = t; i < p.dim; i += 64u) {
        a[r * p.dim + i] = a[r * p.dim + i] * scale * g[i];
    }
}

@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wg.x;
    let scale = inv_rms(r, t);
    for (var i = t; i < p.dim; i += 64u) {
        b[r * p.dim + i] += a[r * p.dim + i] * scale * g[i];
    }
}
