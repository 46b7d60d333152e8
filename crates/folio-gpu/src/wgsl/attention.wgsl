// Paged attention: one workgroup per (group of heads, row, chunk of keys). A group is
// `group` consecutive query heads that share one K/V head (GQA; the host picks it, up
// to GMAX, and 1 where it is asked to): each key's K and V are read once for all of
// them, and each head's arithmetic is what it is in a workgroup of its own, in the same
// order (the same bits). The query is rotated
// by RoPE as it is loaded (`rope.wgsl`; `half` pairs, `adjacent`). The row's keys are
// positions first..=pos of its own sequence, found through the step's page table (CSR,
// `tab`):
//   tab[2r], tab[2r + 1]           row r's position and sequence
//   tab[seqs + 3s .. seqs + 3s + 3] sequence s's first page entry, page count, fill
//   tab[entry ..]                  the page ids themselves
// K/V come from the device pool (two f16 per word; or with KV_Q8 a slot's 8-bit values
// four per word, then one f32 scale per K/V head: `pool.rs`): key t of a sequence sits
// in page pages[t / page_size], slot t % page_size. 8-bit K/V is stored rotated (each
// head row times the normalized Walsh-Hadamard matrix H, as the host rotates it where
// head_dim is a power of two: `rotate`), so the query is rotated too (q·k = Hq·Hk) and
// the output rotated back (Σ p·Hv = H Σ p·v; H is its own inverse). Keys go 64 at a
// time: each lane scores one, then every lane folds the block into its share of the
// value dimensions (an online softmax: running maximum m, running sum l). With a cap,
// scores are soft-capped.
//
// Split and combine (the CPU's rule for a long row: cut points at fixed multiples, so
// they depend on the row's position only): with `chunk_keys` > 0 the keys are cut at
// multiples of it, workgroup (h, r · chunks + c) takes the keys of
// chunk c and writes its state (m, l, the unnormalized sums) to `part`, and `combine`
// (one workgroup per (head, row)) rescales the chunks' states to their largest m, adds
// them in chunk order and divides. With `chunk_keys` = 0 one workgroup takes every key
// and writes the output. Dispatch: (heads / group, rows · chunks); combine: (heads,
// rows).
struct P {
    rows: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32,
    page_size: u32, kv_dim: u32, scale: f32, window: u32,
    seqs: u32, cap: f32, rotate: u32, norm: f32,
    chunk_keys: u32, chunks: u32, half: u32, adjacent: u32, group: u32,
}
@group(0) @binding(0) var<uniform> p: P;
// The outputs first: `combine` binds only them.
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<f32>;
@group(0) @binding(3) var<storage, read> tab: array<u32>;
@group(0) @binding(4) var<storage, read> q: array<f32>;
@group(0) @binding(5) var<storage, read> kpool: array<u32>;
@group(0) @binding(6) var<storage, read> vpool: array<u32>;
@group(0) @binding(7) var<storage, read> rope_tab: array<f32>;

// 8-bit K/V (a pipeline constant).
override KV_Q8: bool = false;

// The most heads a workgroup takes; the group's queries, head i's from i · head_dim
// (group · head_dim at most 2048: the host's rule), and their scores of a block of
// keys, head i's from 64 i.
const GMAX: u32 = 8u;
var<workgroup> qs: array<f32, 2048>;
var<workgroup> sc: array<f32, 512>;
var<workgroup> info: array<u32, 3>;

// The pool slot of key `key` (pages from entry `first`).
fn key_slot(first: u32, key: u32) -> u32 {
    return tab[first + key / p.page_size] * p.page_size + key % p.page_size;
}

// Word index of KV head `kvh`'s first values in pool slot `slot`.
fn key_base(slot: u32, kvh: u32) -> u32 {
    if (KV_Q8) {
        return slot * (p.kv_dim / 4u + p.kv_dim / p.head_dim) + kvh * (p.head_dim / 4u);
    }
    return slot * (p.kv_dim / 2u) + kvh * (p.head_dim / 2u);
}

// The f32 scale of KV head `kvh` in 8-bit pool slot `slot`.
fn scale_at(slot: u32, kvh: u32) -> u32 {
    return slot * (p.kv_dim / 4u + p.kv_dim / p.head_dim) + p.kv_dim / 4u + kvh;
}

// Signed byte b (0..3) of word x.
fn sbyte(x: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(x << (24u - 8u * b)) >> 24u);
}

// qs[at..at + head_dim] times H (`wht.wgsl`). Run by one invocation.
fn rotate_qs(at: u32) {
    for (var e = 0u; e < p.head_dim; e++) {
        wht[e] = qs[at + e];
    }
    rotate_wht(p.head_dim, p.norm);
    for (var e = 0u; e < p.head_dim; e++) {
        qs[at + e] = wht[e];
    }
}

// Where chunk c of (head h, row r)'s state starts in `part`: m, l, then head_dim sums.
fn part_at(h: u32, r: u32, c: u32) -> u32 {
    return ((r * p.n_heads + h) * p.chunks + c) * (p.head_dim + 2u);
}

// Writes the finished output of (head h, row r): `o` normalized, rotated back over
// 8-bit K/V. Every invocation calls it (it may synchronize the workgroup).
fn write_out(h: u32, r: u32, t: u32, o: array<f32, 4>) {
    let hp = p.head_dim / 2u;
    let at = r * p.n_heads * p.head_dim + h * p.head_dim;
    if (KV_Q8 && p.rotate != 0u) {
        // Through qs, once its last readers (the keys' loop, or the head before) are
        // past a barrier.
        workgroupBarrier();
        for (var c = 0u; c < 2u; c++) {
            let e = t + 64u * c;
            if (e < hp) {
                qs[2u * e] = o[2u * c];
                qs[2u * e + 1u] = o[2u * c + 1u];
            }
        }
        workgroupBarrier();
        if (t == 0u) {
            rotate_qs(0u);
        }
        workgroupBarrier();
        for (var i = t; i < p.head_dim; i += 64u) {
            out[at + i] = qs[i];
        }
        return;
    }
    for (var c = 0u; c < 2u; c++) {
        let e = t + 64u * c;
        if (e < hp) {
            out[at + 2u * e] = o[2u * c];
            out[at + 2u * e + 1u] = o[2u * c + 1u];
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let g = p.group;
    let h0 = wg.x * g;
    let r = wg.y / p.chunks;
    let chunk = wg.y % p.chunks;
    let kvh = h0 / (p.n_heads / p.n_kv_heads);
    let hp = p.head_dim / 2u;
    let hd = p.head_dim;
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
    let adjacent = p.adjacent != 0u;
    for (var i = 0u; i < GMAX; i++) {
        if (i >= g) {
            break;
        }
        let head = r * p.n_heads * hd + (h0 + i) * hd;
        for (var e = t; e < hd; e += 64u) {
            let other = q[head + rope_other(e, p.half, adjacent)];
            qs[i * hd + e] = rope_at(q[head + e], other, r, e, p.half, adjacent);
        }
    }
    var first = workgroupUniformLoad(&info[0]);
    var n = workgroupUniformLoad(&info[1]);
    let pages = workgroupUniformLoad(&info[2]);
    if (p.chunk_keys > 0u) {
        first = max(first, chunk * p.chunk_keys);
        n = min(n, (chunk + 1u) * p.chunk_keys);
    }
    if (KV_Q8 && p.rotate != 0u) {
        if (t == 0u) {
            for (var i = 0u; i < g; i++) {
                rotate_qs(i * hd);
            }
        }
        workgroupBarrier();
    }
    // Each head's running maximum and sum, and its share of the value dimensions.
    var m: array<f32, GMAX>;
    var l: array<f32, GMAX>;
    var acc: array<array<f32, 4>, GMAX>;
    for (var i = 0u; i < GMAX; i++) {
        m[i] = -3.0e38;
    }
    for (var k0 = first; k0 < n; k0 += 64u) {
        let key = k0 + t;
        var d: array<f32, GMAX>;
        if (key < n) {
            let slot = key_slot(pages, key);
            let base = key_base(slot, kvh);
            if (KV_Q8) {
                for (var e = 0u; e < hd / 4u; e++) {
                    let w = kpool[base + e];
                    for (var b = 0u; b < 4u; b++) {
                        let kb = sbyte(w, b);
                        for (var i = 0u; i < GMAX; i++) {
                            if (i >= g) {
                                break;
                            }
                            d[i] += qs[i * hd + 4u * e + b] * kb;
                        }
                    }
                }
                let ks = bitcast<f32>(kpool[scale_at(slot, kvh)]);
                for (var i = 0u; i < GMAX; i++) {
                    d[i] *= ks;
                }
            } else {
                for (var e = 0u; e < hp; e++) {
                    let kk = unpack2x16float(kpool[base + e]);
                    for (var i = 0u; i < GMAX; i++) {
                        if (i >= g) {
                            break;
                        }
                        d[i] += qs[i * hd + 2u * e] * kk.x + qs[i * hd + 2u * e + 1u] * kk.y;
                    }
                }
            }
        }
        for (var i = 0u; i < GMAX; i++) {
            if (i >= g) {
                break;
            }
            var s = -3.0e38;
            if (key < n) {
                if (p.cap > 0.0) {
                    // Soft-capping (Gemma 2), as the CPU's (and ggml's): the scale
                    // divided by the cap before tanh.
                    s = p.cap * tanh(d[i] * (p.scale / p.cap));
                } else {
                    s = d[i] * p.scale;
                }
            }
            sc[64u * i + t] = s;
        }
        workgroupBarrier();
        let cnt = min(64u, n - k0);
        var bm: array<f32, GMAX>;
        for (var i = 0u; i < GMAX; i++) {
            if (i >= g) {
                break;
            }
            bm[i] = m[i];
            for (var j = 0u; j < cnt; j++) {
                bm[i] = max(bm[i], sc[64u * i + j]);
            }
            let corr = exp(m[i] - bm[i]);
            l[i] *= corr;
            for (var c = 0u; c < 4u; c++) {
                acc[i][c] *= corr;
            }
        }
        for (var j = 0u; j < cnt; j++) {
            var wj: array<f32, GMAX>;
            for (var i = 0u; i < GMAX; i++) {
                if (i >= g) {
                    break;
                }
                wj[i] = exp(sc[64u * i + j] - bm[i]);
                l[i] += wj[i];
            }
            let slot = key_slot(pages, k0 + j);
            let base = key_base(slot, kvh);
            var vs = 1.0;
            if (KV_Q8) {
                vs = bitcast<f32>(vpool[scale_at(slot, kvh)]);
            }
            for (var c = 0u; c < 2u; c++) {
                let e = t + 64u * c;
                if (e < hp) {
                    var vv: vec2<f32>;
                    if (KV_Q8) {
                        let w = vpool[base + e / 2u];
                        vv = vec2<f32>(sbyte(w, 2u * (e % 2u)), sbyte(w, 2u * (e % 2u) + 1u)) * vs;
                    } else {
                        vv = unpack2x16float(vpool[base + e]);
                    }
                    for (var i = 0u; i < GMAX; i++) {
                        if (i >= g) {
                            break;
                        }
                        acc[i][2u * c] += wj[i] * vv.x;
                        acc[i][2u * c + 1u] += wj[i] * vv.y;
                    }
                }
            }
        }
        for (var i = 0u; i < GMAX; i++) {
            m[i] = bm[i];
        }
        workgroupBarrier();
    }
    if (p.chunk_keys > 0u) {
        for (var i = 0u; i < GMAX; i++) {
            if (i >= g) {
                break;
            }
            let at = part_at(h0 + i, r, chunk);
            if (t == 0u) {
                part[at] = m[i];
                part[at + 1u] = l[i];
            }
            for (var c = 0u; c < 2u; c++) {
                let e = t + 64u * c;
                if (e < hp) {
                    part[at + 2u + 2u * e] = acc[i][2u * c];
                    part[at + 3u + 2u * e] = acc[i][2u * c + 1u];
                }
            }
        }
        return;
    }
    for (var i = 0u; i < GMAX; i++) {
        if (i >= g) {
            break;
        }
        var o = acc[i];
        for (var c = 0u; c < 4u; c++) {
            o[c] /= l[i];
        }
        write_out(h0 + i, r, t, o);
    }
}

@compute @workgroup_size(64)
fn combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let h = wg.x;
    let r = wg.y;
    let hp = p.head_dim / 2u;
    var big = -3.0e38;
    for (var c = 0u; c < p.chunks; c++) {
        big = max(big, part[part_at(h, r, c)]);
    }
    var l = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var c = 0u; c < p.chunks; c++) {
        let at = part_at(h, r, c);
        let w = exp(part[at] - big);
        l += part[at + 1u] * w;
        for (var i = 0u; i < 2u; i++) {
            let e = t + 64u * i;
            if (e < hp) {
                acc[2u * i] += part[at + 2u + 2u * e] * w;
                acc[2u * i + 1u] += part[at + 3u + 2u * e] * w;
            }
        }
    }
    for (var c = 0u; c < 4u; c++) {
        acc[c] /= l;
    }
    write_out(h, r, t, acc);
}
