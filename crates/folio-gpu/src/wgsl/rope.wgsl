// RoPE, applied where Q and K are read (`kv_store.wgsl` as it stores K, `attention.wgsl`
// as it loads Q), not by a dispatch of its own: value i of a head row at step row r,
// from the host's (cos, sin) table of each row (`rope_tab`, bound by the kernel that
// includes this; `half` pairs a row: the same table the CPU path uses, so every scaling
// type is the host's). Pair j of a head is (2j, 2j + 1) (adjacent) or (j, j + half)
// (halves); values from 2 half on are not rotated. Each value is what the host's
// rotation of the pair (x0, x1) gives: x0 c - x1 s and x0 s + x1 c.

// The other value of value i's pair (i itself where i is not rotated).
fn rope_other(i: u32, half: u32, adjacent: bool) -> u32 {
    if (i >= 2u * half) {
        return i;
    }
    if (adjacent) {
        return i ^ 1u;
    }
    if (i < half) {
        return i + half;
    }
    return i - half;
}

// Value i (x) of a head row at step row r, rotated with the other value of its pair (y).
fn rope_at(x: f32, y: f32, r: u32, i: u32, half: u32, adjacent: bool) -> f32 {
    if (i >= 2u * half) {
        return x;
    }
    var j = i % half;
    var first = i < half;
    if (adjacent) {
        j = i / 2u;
        first = (i & 1u) == 0u;
    }
    let c = rope_tab[(r * half + j) * 2u];
    let s = rope_tab[(r * half + j) * 2u + 1u];
    if (first) {
        return x * c - y * s;
    }
    return y * s + x * c;
}
