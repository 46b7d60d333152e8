// Division rounded as IEEE 754 rounds it (binary32, to nearest, ties to even), in
// integer arithmetic. WGSL (and Vulkan, for SPIR-V's OpFDiv) lets a GPU's `/` be 2.5
// ulp off; the 8-bit blocks' scales (`quantize.wgsl`) and the 8-bit K/V's
// (`kv_store.wgsl`) must be the host's words, and the host divides exactly. Used once
// or twice a block, never in an inner loop: 26 steps of a long division.
//
// Subnormal operands and results are exact too (operands as bits: nothing here is an
// f32 operation a device could flush); a NaN operand, 0 / 0 and inf / inf give a NaN,
// x / 0 and inf / x a signed infinity, x / inf a signed zero.

fn div_exact(a: f32, b: f32) -> f32 {
    return bitcast<f32>(div_bits(bitcast<u32>(a), bitcast<u32>(b)));
}

// A binary32 significand with its implicit bit, in [2^23, 2^24), and its biased
// exponent (below 1 for a subnormal, shifted up to that range); x must not be zero.
fn unpacked(x: u32) -> vec2<i32> {
    var e = i32((x >> 23u) & 0xFFu);
    var m = x & 0x7FFFFFu;
    if (e == 0) {
        e = 1;
        while (m < 0x800000u) {
            m <<= 1u;
            e -= 1;
        }
    } else {
        m |= 0x800000u;
    }
    return vec2<i32>(i32(m), e);
}

fn div_bits(ua: u32, ub: u32) -> u32 {
    let sign = (ua ^ ub) & 0x80000000u;
    let aa = ua & 0x7FFFFFFFu;
    let ab = ub & 0x7FFFFFFFu;
    let inf = 0x7F800000u;
    if (aa > inf || ab > inf || (aa == inf && ab == inf) || (aa == 0u && ab == 0u)) {
        return 0x7FC00000u;
    }
    if (aa == inf || ab == 0u) {
        return sign | inf;
    }
    if (ab == inf || aa == 0u) {
        return sign;
    }
    let x = unpacked(aa);
    let y = unpacked(ab);
    var ma = u32(x.x);
    let mb = u32(y.x);
    // The quotient's biased exponent where ma / mb is in [1, 2).
    var e = x.y - y.y + 127;
    if (ma < mb) {
        ma <<= 1u;
        e -= 1;
    }
    if (e >= 255) {
        return sign | inf;
    }
    // q = floor(ma * 2^25 / mb), 26 bits; the remainder r says whether it was exact.
    var q = 0u;
    var r = ma;
    for (var i = 0u; i < 26u; i++) {
        q <<= 1u;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1u;
    }
    // The significand is q / 2^s: s = 2 for a normal result, more below the normals
    // (in units of the smallest subnormal, q * 2^(e - 3)).
    let s = u32(select(3 - e, 2, e >= 1));
    if (s > 26u) {
        // Below half the smallest subnormal.
        return sign;
    }
    var m = q >> s;
    let rest = q & ((1u << s) - 1u);
    let half = 1u << (s - 1u);
    if (rest > half || (rest == half && (r != 0u || (m & 1u) == 1u))) {
        m += 1u;
    }
    // The exponent field plus the significand: a carry out of the significand (or
    // into the normals from a subnormal) moves the exponent up by itself.
    let bits = (u32(max(e, 1) - 1) << 23u) + m;
    return sign | min(bits, inf);
}
