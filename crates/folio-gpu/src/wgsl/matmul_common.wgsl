// What every matmul kernel shares (the kernels' files are appended to this one): the
// parameters, the output, the rows per invocation and the store.
// y[r, at + o] (+)= Σ_c a[r, c] · W[o, c] over the rows of `a`, W's n rows (a piece of
// a matrix starting at its row `at`; y's rows are `stride` wide). Each invocation
// computes one output column for up to TR rows (a weight block is decoded once per
// TR rows). Dispatch: (ceil(n / 64), ceil(rows / TR)).
struct P { k: u32, n: u32, rows: u32, add: u32, stride: u32, at: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const TR: u32 = 8u;

// Invocation `gid`'s output column, first row and number of rows; none past the ends.
fn invocation(gid: vec3<u32>) -> vec3<u32> {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return vec3<u32>(o, r0, 0u);
    }
    return vec3<u32>(o, r0, min(TR, p.rows - r0));
}

fn store(o: u32, r0: u32, nr: u32, acc: array<f32, 8>) {
    var acc2 = acc;
    for (var i = 0u; i < nr; i++) {
        let yi = (r0 + i) * p.stride + p.at + o;
        if (p.add != 0u) {
            y[yi] += acc2[i];
        } else {
            y[yi] = acc2[i];
        }
    }
}

// Byte `i` of `w`, and what it holds as a signed byte and (with the next) an f16.
fn byte_at(i: u32) -> u32 {
    return (w[i >> 2u] >> (8u * (i & 3u))) & 0xFFu;
}

fn sbyte_at(i: u32) -> i32 {
    return bitcast<i32>(byte_at(i) << 24u) >> 24u;
}

fn half_at(i: u32) -> f32 {
    return unpack2x16float(byte_at(i) | (byte_at(i + 1u) << 8u)).x;
}
