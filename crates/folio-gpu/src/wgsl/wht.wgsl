// What the 8-bit K/V kernels share (prepended to `kv_store.wgsl` and
// `attention.wgsl`): head rows times the normalized Walsh-Hadamard matrix H, in the
// host's butterfly order (`folio::kernels::rotate_heads`), so the device rotates the
// bits the host does. H is its own inverse.
var<private> wht: array<f32, 256>;

// wht[0..n] times H (n a power of two; `norm` = 1 / sqrt(n)), in place.
fn rotate_wht(n: u32, norm: f32) {
    for (var h = 1u; h < n; h *= 2u) {
        for (var i = 0u; i < n; i += 2u * h) {
            for (var j = i; j < i + h; j++) {
                let a = wht[j];
                let b = wht[j + h];
                wht[j] = a + b;
                wht[j + h] = a - b;
            }
        }
    }
    for (var e = 0u; e < n; e++) {
        wht[e] *= norm;
    }
}
