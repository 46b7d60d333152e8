// Each new row's K (rotated by RoPE here: `rope.wgsl`) and V into its slot of the
// device pool (two f16 per word, as the host's f16 pool rounds them), and, where `back` (a host storage that holds no rows
// on the device), into this step's copy of the new rows (layer by layer) that goes
// back to it: the f16 values the pool holds, widened to f32, so the host stores the
// device's bits. Dispatch: (ceil(kv_dim / 2 / 64), rows).
//
// `q8`: the same into an 8-bit pool (`pool.rs`), one invocation per (row, K/V head),
// as the host quantizes (`folio::kernels::quantize_kv_q8`): the head row rotated where
// `rotate` (times the normalized Walsh-Hadamard matrix, the host's butterfly order,
// `norm` = 1/sqrt(head_dim)), d = amax / 127 at f16 precision, q = round(x / d) half
// away from zero, clamped to ±127 (d and 1 / d divided as the host divides:
// `div.wgsl`, which comes first). The step's copy for the host (where `back`) is the
// f32 rows themselves: the host quantizes them again. Dispatch: (ceil(rows · kv heads
// / 64), 1).
struct P {
    rows: u32, kv_dim: u32, layer: u32, head_dim: u32, rotate: u32, norm: f32, back: u32,
    half: u32, adjacent: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> slots: array<u32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> kpool: array<u32>;
@group(0) @binding(5) var<storage, read_write> vpool: array<u32>;
@group(0) @binding(6) var<storage, read_write> knew: array<f32>;
@group(0) @binding(7) var<storage, read_write> vnew: array<f32>;
@group(0) @binding(8) var<storage, read> rope_tab: array<f32>;

// Value e of row r's K (kv_dim wide) rotated by RoPE.
fn k_at(r: u32, e: u32) -> f32 {
    let head = r * p.kv_dim + e / p.head_dim * p.head_dim;
    let i = e % p.head_dim;
    let adjacent = p.adjacent != 0u;
    let other = k[head + rope_other(i, p.half, adjacent)];
    return rope_at(k[head + i], other, r, i, p.half, adjacent);
}

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
    let kh = pack2x16float(vec2<f32>(k_at(r, 2u * e), k_at(r, 2u * e + 1u)));
    let vh = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
    kpool[dst] = kh;
    vpool[dst] = vh;
    if (p.back == 0u) {
        return;
    }
    let out = (p.layer * p.rows + r) * p.kv_dim + 2u * e;
    let kw = unpack2x16float(kh);
    let vw = unpack2x16float(vh);
    knew[out] = kw.x;
    knew[out + 1u] = kw.y;
    vnew[out] = vw.x;
    vnew[out + 1u] = vw.y;
}

// wht[0..head_dim] quantized in place (each value its integer); returns the scale.
fn quantize_head() -> f32 {
    var amax = 0.0;
    for (var e = 0u; e < p.head_dim; e++) {
        amax = max(amax, abs(wht[e]));
    }
    let d = quantizeToF16(min(div_exact(amax, 127.0), 65504.0));
    var inv = 0.0;
    if (d != 0.0) {
        inv = div_exact(1.0, d);
    }
    for (var e = 0u; e < p.head_dim; e++) {
        let x = wht[e] * inv;
        wht[e] = clamp(sign(x) * floor(abs(x) + 0.5), -127.0, 127.0);
    }
    return d;
}

// Word i of the quantized head: values 4i..4i+3 as signed bytes.
fn head_word(i: u32) -> u32 {
    var w = 0u;
    for (var b = 0u; b < 4u; b++) {
        w |= (bitcast<u32>(i32(wht[4u * i + b])) & 0xFFu) << (8u * b);
    }
    return w;
}

@compute @workgroup_size(64)
fn q8(@builtin(global_invocation_id) gid: vec3<u32>) {
    let heads = p.kv_dim / p.head_dim;
    let r = gid.x / heads;
    let h = gid.x % heads;
    if (r >= p.rows) {
        return;
    }
    let stride = p.kv_dim / 4u + heads;
    let dst = slots[r] * stride + h * (p.head_dim / 4u);
    let scale = slots[r] * stride + p.kv_dim / 4u + h;
    let out = (p.layer * p.rows + r) * p.kv_dim + h * p.head_dim;
    store_q8(false, r, h, dst, scale, out);
    store_q8(true, r, h, dst, scale, out);
}

// Head h of row r's K (RoPE applied) or, `is_v`, V: to the host's copy at `out`, and
// rotated and quantized into its pool slot (values from word `dst`, scale at word
// `scale`).
fn store_q8(is_v: bool, r: u32, h: u32, dst: u32, scale: u32, out: u32) {
    let src = r * p.kv_dim + h * p.head_dim;
    for (var e = 0u; e < p.head_dim; e++) {
        var x = 0.0;
        if (is_v) {
            x = v[src + e];
        } else {
            x = k_at(r, h * p.head_dim + e);
        }
        wht[e] = x;
        if (p.back == 0u) {
            continue;
        }
        if (is_v) {
            vnew[out + e] = x;
        } else {
            knew[out + e] = x;
        }
    }
    if (p.rotate != 0u) {
        rotate_wht(p.head_dim, p.norm);
    }
    let d = bitcast<u32>(quantize_head());
    if (is_v) {
        vpool[scale] = d;
    } else {
        kpool[scale] = d;
    }
    for (var i = 0u; i < p.head_dim / 4u; i++) {
        let word = head_word(i);
        if (is_v) {
            vpool[dst + i] = word;
        } else {
            kpool[dst + i] = word;
        }
    }
}
