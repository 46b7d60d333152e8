// Each new row's K and V into its slot of the device pool (two f16 per word, as the
// host's f16 pool rounds them), and into this step's copy of the new rows (layer by
// layer) that goes back to the host's storage: the f16 values the pool holds, widened
// to f32, so the host stores the device's bits (the pool keeps pages across steps and
// the host's copy must be the same). Dispatch: (ceil(kv_dim / 2 / 64), rows).
struct P { rows: u32, kv_dim: u32, layer: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> slots: array<u32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> kpool: array<u32>;
@group(0) @binding(5) var<storage, read_write> vpool: array<u32>;
@group(0) @binding(6) var<storage, read_write> knew: array<f32>;
@group(0) @binding(7) var<storage, read_write> vnew: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    let r = gid.y;
    let half = p.kv_dim / 2u;
    if (r >= p.rows || e >= half) {
        return;
    }
    let src = r * p.kv_dim + 2u * e;
    let dst = slots[r] * half + e;
    let kh = pack2x16float(vec2<f32>(k[src], k[src + 1u]));
    let vh = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
    kpool[dst] = kh;
    vpool[dst] = vh;
    let out = (p.layer * p.rows + r) * p.kv_dim + 2u * e;
    let kw = unpack2x16float(kh);
    let vw = unpack2x16float(vh);
    knew[out] = kw.x;
    knew[out + 1u] = kw.y;
    vnew[out] = vw.x;
    vnew[out + 1u] = vw.y;
}
