// RMSNorm, one workgroup per row of `dim` values: y = x / sqrt(mean(x^2) + eps) * g.
// - `picked`: b[r] = norm(a[idx[r]]) (a layer's input, the final norm of the rows
//   that want logits or states);
// - `in_place`: a[r] = norm(a[r]) (per-head Q/K norms: rows of head_dim);
// - `add`: b[r] += norm(a[r]) (a post-norm: a block's normed output added to the
//   residual stream b);
// - `picked_quantized`: `picked`, then each row of b into the 8-bit blocks the
//   matmuls after it read (`quantize.wgsl`, which comes first): in blocks of 32 into
//   aq where bit 0 of `quant` is set, of 256 into akq where bit 1 is (and `dim` is
//   whole blocks of 256). The same words as `picked` and then `quantize_rows.wgsl`'s
//   kernels, in one dispatch instead of two or three: the blocks are made from the
//   values written to b, read back after a barrier.
// Dispatch: (rows, 1).
struct P { dim: u32, rows: u32, eps: f32, quant: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> b: array<f32>;
@group(0) @binding(4) var<storage, read> idx: array<u32>;
@group(0) @binding(5) var<storage, read_write> aq: array<u32>;
@group(0) @binding(6) var<storage, read_write> akq: array<u32>;

fn value(i: u32) -> f32 {
    return b[i];
}

fn put_q8(i: u32, word: u32) {
    aq[i] = word;
}

fn put_q8k(i: u32, word: u32) {
    akq[i] = word;
}

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

// Row `r` of b: the norm of row idx[r] of a.
fn picked_row(r: u32, t: u32) {
    let src = idx[r] * p.dim;
    let scale = inv_rms(src, t);
    let dst = r * p.dim;
    for (var i = t; i < p.dim; i += 64u) {
        b[dst + i] = a[src + i] * scale * g[i];
    }
}

@compute @workgroup_size(64)
fn picked(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    picked_row(wg.x, t);
}

@compute @workgroup_size(64)
fn picked_quantized(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wg.x;
    picked_row(r, t);
    // Every lane's values of the row visible to the lanes that quantize them.
    storageBarrier();
    if ((p.quant & 1u) != 0u) {
        let nb = p.dim / 32u;
        for (var blk = t; blk < nb; blk += 64u) {
            q8_block(r * p.dim + blk * 32u, (r * nb + blk) * 10u);
        }
    }
    if ((p.quant & 2u) != 0u && p.dim % 256u == 0u) {
        let nb = p.dim / 256u;
        for (var blk = t; blk < nb; blk += 64u) {
            q8k_block(r * p.dim + blk * 256u, (r * nb + blk) * 81u);
        }
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
