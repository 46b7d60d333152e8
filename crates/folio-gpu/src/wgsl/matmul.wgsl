// y[r, o] (+)= sum_c a[r, c] * W[o, c] for the rows of `a`, W in its stored blocks
// (`w` as 32-bit words) and `a` in 8-bit blocks (`quantize.wgsl`): per block an
// integer dot product, scaled, as the CPU path's (llama.cpp's) dot products of the
// 32-value formats with 8-bit blocks. A chunk is one block. (`matmul_common.wgsl`
// comes first: the parameters, the format, the work split, the store.)
@group(0) @binding(2) var<storage, read> aq: array<u32>;

// IQ4_NL's 16 levels (GGUF's fixed table), as integers.
const IQ4NL_Q = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

// The nibbles of word `q` (four of a block's 16 bytes), as four bytes of values:
// low nibbles, or (`high`) high ones.
fn nibbles(q: u32, high: bool) -> u32 {
    return select(q, q >> 4u, high) & 0x0F0F0F0Fu;
}

// Bits 4j..4j+3 of Q5's word of fifth bits, each at bit 4 of its byte.
fn fifth_bits(qh: u32, j: u32) -> u32 {
    var out = 0u;
    for (var b = 0u; b < 4u; b++) {
        out |= ((qh >> (4u * j + b)) & 1u) << (8u * b + 4u);
    }
    return out;
}

// Block c of W's row o against block c of each row's 8-bit input: its 32 values as
// eight words of signed bytes, value = f * (q - z) + m, and each row's integer sum
// `Σ q·a - z·Σ a` scaled (the CPU's `isum`: exact in integers).
// - Q4_0 (18 bytes): d, then 16 bytes whose low nibbles are values 0..15 and high
//   nibbles values 16..31; z = 8.
// - Q4_1 (20 bytes): d, m, then Q4_0's nibbles.
// - Q5_0 (22 bytes): d, a word of fifth bits (bit e for value e), then Q4_0's
//   nibbles; z = 16.
// - Q5_1 (24 bytes): d, m, then Q5_0's fifth bits and nibbles.
// - Q8_0 (34 bytes): d, then 32 signed bytes.
// - IQ4_NL (18 bytes): d, then Q4_0's nibbles, each an index into a table of levels.
// Blocks of 18, 22 and 34 bytes are not word-aligned (`word_at`).
fn chunk(acc: ptr<function, array<f32, 8>>, o: u32, c: u32, r0: u32, nr: u32) {
    let nb = p.k / 32u;
    var qw: array<u32, 8>;
    var d = 0.0;
    var m = 0.0;
    var z = 0;
    switch FORMAT {
        case 0u, 10u: {
            let base = (o * nb + c) * 18u;
            d = half_at(base);
            for (var j = 0u; j < 4u; j++) {
                let q = word_at(base + 2u + 4u * j);
                qw[j] = nibbles(q, false);
                qw[j + 4u] = nibbles(q, true);
            }
            if (FORMAT == IQ4_NL) {
                for (var j = 0u; j < 8u; j++) {
                    var lv = 0u;
                    for (var b = 0u; b < 4u; b++) {
                        let l = IQ4NL_Q[(qw[j] >> (8u * b)) & 0xFu];
                        lv |= (bitcast<u32>(l) & 0xFFu) << (8u * b);
                    }
                    qw[j] = lv;
                }
            } else {
                z = 8;
            }
        }
        case 1u: {
            let base = (o * nb + c) * 5u;
            let dm = unpack2x16float(w[base]);
            d = dm.x;
            m = dm.y;
            for (var j = 0u; j < 4u; j++) {
                let q = w[base + 1u + j];
                qw[j] = nibbles(q, false);
                qw[j + 4u] = nibbles(q, true);
            }
        }
        case 2u, 9u: {
            let q51 = FORMAT == Q5_1;
            let base = (o * nb + c) * select(22u, 24u, q51);
            d = half_at(base);
            if (q51) {
                m = half_at(base + 2u);
            } else {
                z = 16;
            }
            // The word of fifth bits, then the nibbles.
            let at = base + select(2u, 4u, q51);
            let qh = word_at(at);
            for (var j = 0u; j < 4u; j++) {
                let q = word_at(at + 4u + 4u * j);
                qw[j] = nibbles(q, false) | fifth_bits(qh, j);
                qw[j + 4u] = nibbles(q, true) | fifth_bits(qh, j + 4u);
            }
        }
        default: {
            let base = (o * nb + c) * 34u;
            d = half_at(base);
            for (var j = 0u; j < 8u; j++) {
                qw[j] = word_at(base + 2u + 4u * j);
            }
        }
    }
    for (var i = 0u; i < TR; i++) {
        if (i >= nr) {
            break;
        }
        let ab = ((r0 + i) * nb + c) * 10u;
        var isum = 0;
        var asum = 0;
        for (var j = 0u; j < 8u; j++) {
            let aw = aq[ab + 2u + j];
            // Four signed bytes times four, summed (`dot4I8Packed`: one instruction
            // where the device has 8-bit dot products, naga's unpacking elsewhere).
            isum += dot4I8Packed(qw[j], aw);
            asum += dot4I8Packed(0x01010101u, aw);
        }
        isum -= z * asum;
        let ad = bitcast<f32>(aq[ab]);
        if (FORMAT == Q4_1 || FORMAT == Q5_1) {
            (*acc)[i] += d * ad * f32(isum) + m * bitcast<f32>(aq[ab + 1u]);
        } else {
            (*acc)[i] += d * ad * f32(isum);
        }
    }
}
