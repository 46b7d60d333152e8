// Paged attention: one workgroup per (head, row). The row's keys are positions
// first..=pos of its own sequence, found through the step's page table (CSR, `tab`):
//   tab[2r], tab[2r + 1]           row r's position and sequence
//   tab[seqs + 3s .. seqs + 3s + 3] sequence s's first page entry, page count, fill
//   tab[entry ..]                  the page ids themselves
// K/V come from the device pool (two f16 per word): key t of a sequence sits in page
// pages[t / page_size], slot t % page_size. Keys go 64 at a time: each lane scores one,
// then every lane folds the block into its share of the value dimensions (an online
// softmax: running maximum m, running sum l). With a cap, scores are soft-capped.
struct P {
    rows: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32,
    page_size: u32, kv_dim: u32, scale: f32, window: u32,
    seqs: u32, cap: f32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> tab: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> kpool: array<u32>;
@group(0) @binding(4) var<storage, read> vpool: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;
var<workgroup> info: array<u32, 3>;

// Word index of pair 0 of KV head `kvh` of key `key` (pages from entry `first`).
fn key_base(first: u32, key: u32, kvh: u32) -> u32 {
    let page = tab[first + key / p.page_size];
    let slot = key % p.page_size;
    return (page * p.page_size + slot) * (p.kv_dim / 2u) + kvh * (p.head_dim / 2u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let h = wg.x;
    let r = wg.y;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let hp = p.head_dim / 2u;
    if (t == 0u) {
        let pos = tab[2u * r];
        let s = tab[2u * r + 1u];
        var first = 0u;
        if (p.window > 0u && pos + 1u > p.window) {
            first = pos + 1u - p.window;
        }
        info[0] = first;
        info[1] = pos + 1u;
        info[2] = tab[p.seqs + 3u * s];
    }
    let qd = p.n_heads * p.head_dim;
    for (var i = t; i < p.head_dim; i += 64u) {
        qs[i] = q[r * qd + h * p.head_dim + i];
    }
    let first = workgroupUniformLoad(&info[0]);
    let n = workgroupUniformLoad(&info[1]);
    let pages = workgroupUniformLoad(&info[2]);
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var k0 = first; k0 < n; k0 += 64u) {
        let key = k0 + t;
        var s = -3.0e38;
        if (key < n) {
            let base = key_base(pages, key, kvh);
            var d = 0.0;
            for (var e = 0u; e < hp; e++) {
                let kk = unpack2x16float(kpool[base + e]);
                d += qs[2u * e] * kk.x + qs[2u * e + 1u] * kk.y;
            }
            if (p.cap > 0.0) {
                // Soft-capping (Gemma 2), as the CPU's (and ggml's): the scale divided
                // by the cap before tanh.
                s = p.cap * tanh(d * (p.scale / p.cap));
            } else {
                s = d * p.scale;
            }
        }
        sc[t] = s;
        workgroupBarrier();
        let cnt = min(64u, n - k0);
        var bm = m;
        for (var j = 0u; j < cnt; j++) {
            bm = max(bm, sc[j]);
        }
        let corr = exp(m - bm);
        l *= corr;
        for (var c = 0u; c < 4u; c++) {
            acc[c] *= corr;
        }
        for (var j = 0u; j < cnt; j++) {
            let wj = exp(sc[j] - bm);
            l += wj;
            let base = key_base(pages, k0 + j, kvh);
            for (var c = 0u; c < 2u; c++) {
                let e = t + 64u * c;
                if (e < hp) {
                    let vv = unpack2x16float(vpool[base + e]);
                    acc[2u * c] += wj * vv.x;
                    acc[2u * c + 1u] += wj * vv.y;
                }
            }
        }
        m = bm;
        workgroupBarrier();
    }
    let o = r * qd + h * p.head_dim;
    for (var c = 0u; c < 2u; c++) {
        let e = t + 64u * c;
        if (e < hp) {
            out[o + 2u * e] = acc[2u * c] / l;
            out[o + 2u * e + 1u] = acc[2u * c + 1u] / l;
        }
    }
}
