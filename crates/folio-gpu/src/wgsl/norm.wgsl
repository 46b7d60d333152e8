// RMSNorm, one workgroup per row of `dim` values: y = x / sqrt(mean(x^2) + eps) * g.
// - `picked`: b[r] = norm(a[idx[r]]) (a layer's input, the final norm of the rows
//   that want logits or states);
// - `in_place`: a[r] = norm(a[r]) (per-head Q/K norms: rows of head_dim);
// - `add`: b[r] += norm(a[r]) (a post-norm: a block's normed output added to the
//   residual stream b).
// Dispatch: (rows, 1).
struct P { dim: u32, rows: u32, eps: f32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> b: array<f32>;
@group(0) @binding(4) var<storage, read> idx: array<u32>;

var<workgroup> part: array<f32, 64>;

// 1 / the root mean square (with eps) of the row of `a` from element `src`.
fn inv_rms(src: u32, t: u32) -> f32 {
    var s = 0.0;
    for (var i = t; i < p.dim; i += 64u) {
        let v = a[src + i];
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
fn picked(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let src = idx[wg.x] * p.dim;
    let scale = inv_rms(src, t);
    let dst = wg.x * p.dim;
    for (var i = t; i < p.dim; i += 64u) {
        b[dst + i] = a[src + i] * scale * g[i];
    }
}

@compute @workgroup_size(64)
fn in_place(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let at = wg.x * p.dim;
    let scale = inv_rms(at, t);
    for (var i = t; i < p.dim; i += 64u) {
        a[at + i] = a[at + i] * scale * g[i];
    }
}

@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let at = wg.x * p.dim;
    let scale = inv_rms(at, t);
    for (var i = t; i < p.dim; i += 64u) {
        b[at + i] += a[at + i] * scale * g[i];
    }
}
