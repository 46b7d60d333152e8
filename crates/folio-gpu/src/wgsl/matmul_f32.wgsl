// y[r, o] (+)= sum_c a[r, c] * W[o, c] with W as f32 (a matrix whose type the kernels
// do not decode, dequantized at load) and `a` unquantized.
// Dispatch: (ceil(n / 64), ceil(rows / TR)).
struct P { k: u32, n: u32, rows: u32, add: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const TR: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let o = gid.x;
    let r0 = gid.y * TR;
    if (o >= p.n || r0 >= p.rows) {
        return;
    }
    let nr = min(TR, p.rows - r0);
    var acc: array<f32, 8>;
    let wrow = o * p.k;
    for (var c = 0u; c < p.k; c++) {
        let v = w[wrow + c];
        for (var i = 0u; i < nr; i++) {
            acc[i] += v * a[(r0 + i) * p.k + c];
        }
    }
    for (var i = 0u; i < nr; i++) {
        let yi = (r0 + i) * p.n + o;
        if (p.add != 0u) {
            y[yi] += acc[i];
        } else {
            y[yi] = acc[i];
        }
    }
}
