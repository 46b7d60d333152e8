// y[r, o] (+)= sum_c a[r, c] * W[o, c] for the rows of `a`, W in K-quant super-blocks
// of 256 values (`w` as 32-bit words) and `a` in 8-bit blocks of 256 (`quantize.wgsl`'s
// `q8k`): per super-block the CPU path's (llama.cpp's) arithmetic, its integer sums
// exact and scaled once: x.d · (d · Σ_s sc_s Σ q·a − dmin · Σ_s m_s Σ a) (Q6_K and Q3_K
// without the mins). A chunk is one super-block (CHUNK = 256). (`matmul_common.wgsl`
// comes first: the parameters, the format, the work split, the store.)
//
// An input block is Q8K_WORDS = 81 words: d (f32), 64 words of 256 signed bytes, then
// the 16 sums of each 16 values (one word each).
@group(0) @binding(2) var<storage, read> aq: array<u32>;

const Q8K_WORDS: u32 = 81u;

// Super-block c of W's row o against block c of each row's 8-bit input. Each 32
// values j (j = 0..7) are decoded once into eight words of unsigned bytes q, then, per
// row, Σ q·a over each 16 (`dot4I8Packed`: every q is below 128) is weighted by its
// scale into `sumi` and its offset into `summ`:
// - Q4_K (144 bytes): d, dmin (f16), 12 bytes of 6-bit scales and mins of the eight
//   32s, then 128 bytes whose low nibbles are 32s 2i's values and high nibbles 2i+1's;
//   weight = d·sc·q − dmin·m.
// - Q5_K (176 bytes): Q4_K's head, 32 bytes qh (bit j of qh[l]: value 32j + l's fifth
//   bit), then Q4_K's nibbles.
// - Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed
//   scales (one per 16), d; in each half of 128 values, value l + 32t takes nibble
//   t >> 1 of ql[l + 32 (t & 1)] and bits 2t of qh[l]; weight = d·sc·(q − 32).
// - Q2_K (84 bytes): 16 bytes of 4-bit scales (low) and mins (high), one per 16, 64
//   bytes of 2-bit values (value 128n + 32k + l is bits 2k of byte 32n + l), d, dmin;
//   weight = d·sc·q − dmin·m.
// - Q3_K (110 bytes): 32 bytes hmask, 64 bytes of 2-bit values (Q2_K's layout), 12
//   bytes of 16 packed scales, d; value 32j + l is its 2-bit value, plus 4 where bit j
//   of hmask[l] is set, less 4; weight = d·sc·q.
// The offsets of Q6_K's and Q3_K's values (32, 4) are taken out of the integer sums
// (z · Σ a, Σ a from the input block's sums), as the CPU's are exact in integers.
fn chunk(acc: ptr<function, array<f32, 8>>, o: u32, c: u32, r0: u32, nr: u32) {
    let nb = p.k / 256u;
    var sumi: array<i32, 8>;
    var summ: array<i32, 8>;
    var d = 0.0;
    var dmin = 0.0;
    var base = 0u;
    switch FORMAT {
        case 4u: {
            base = (o * nb + c) * 144u;
        }
        case 7u: {
            base = (o * nb + c) * 176u;
        }
        case 5u: {
            base = (o * nb + c) * 210u;
        }
        case 11u: {
            base = (o * nb + c) * 84u;
        }
        default: {
            base = (o * nb + c) * 110u;
        }
    }
    for (var j = 0u; j < 8u; j++) {
        var qw: array<u32, 8>;
        // Each 16's scale, offset (z, subtracted from every value) and min.
        var sc = vec2<i32>(0);
        var mn = vec2<i32>(0);
        var z = 0;
        switch FORMAT {
            case 4u, 7u: {
                let sm = vec2<i32>(scale_min_k4(base + 4u, j));
                sc = vec2<i32>(sm.x);
                mn = vec2<i32>(sm.y);
                let q5 = FORMAT == Q5_K;
                let at = base + select(16u, 48u, q5) + (j / 2u) * 32u;
                for (var g = 0u; g < 8u; g++) {
                    qw[g] = (w[(at >> 2u) + g] >> (4u * (j & 1u))) & 0x0F0F0F0Fu;
                    if (q5) {
                        qw[g] |= ((w[((base + 16u) >> 2u) + g] >> j) & 0x01010101u) << 4u;
                    }
                }
            }
            case 5u: {
                let half = j / 4u;
                let t = j % 4u;
                for (var g = 0u; g < 8u; g++) {
                    let ql = word_at(base + half * 64u + 32u * (t & 1u) + 4u * g) >> (4u * (t >> 1u));
                    let qh = word_at(base + 128u + half * 32u + 4u * g) >> (2u * t);
                    qw[g] = (ql & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4u);
                }
                let s = base + 192u + 2u * j;
                sc = vec2<i32>(sbyte_at(s), sbyte_at(s + 1u));
                z = 32;
            }
            case 11u: {
                for (var g = 0u; g < 8u; g++) {
                    qw[g] = (w[((base + 16u + 32u * (j / 4u)) >> 2u) + g] >> (2u * (j % 4u))) & 0x03030303u;
                }
                let s0 = byte_at(base + 2u * j);
                let s1 = byte_at(base + 2u * j + 1u);
                sc = vec2<i32>(i32(s0 & 0xFu), i32(s1 & 0xFu));
                mn = vec2<i32>(i32(s0 >> 4u), i32(s1 >> 4u));
            }
            default: {
                for (var g = 0u; g < 8u; g++) {
                    let q2 = (word_at(base + 32u + 32u * (j / 4u) + 4u * g) >> (2u * (j % 4u))) & 0x03030303u;
                    let hm = (word_at(base + 4u * g) >> j) & 0x01010101u;
                    qw[g] = q2 | (hm << 2u);
                }
                sc = vec2<i32>(scale_q3k(base + 96u, 2u * j), scale_q3k(base + 96u, 2u * j + 1u));
                z = 4;
            }
        }
        for (var i = 0u; i < TR; i++) {
            if (i >= nr) {
                break;
            }
            let ab = ((r0 + i) * nb + c) * Q8K_WORDS;
            for (var h = 0u; h < 2u; h++) {
                var isum = 0;
                for (var g = 4u * h; g < 4u * h + 4u; g++) {
                    isum += dot4I8Packed(qw[g], aq[ab + 1u + 8u * j + g]);
                }
                let bsum = bitcast<i32>(aq[ab + 65u + 2u * j + h]);
                sumi[i] += sc[h] * (isum - z * bsum);
                summ[i] += mn[h] * bsum;
            }
        }
    }
    switch FORMAT {
        case 4u, 7u: {
            d = half_at(base);
            dmin = half_at(base + 2u);
        }
        case 5u: {
            d = half_at(base + 208u);
        }
        case 11u: {
            d = half_at(base + 80u);
            dmin = half_at(base + 82u);
        }
        default: {
            d = half_at(base + 108u);
        }
    }
    for (var i = 0u; i < TR; i++) {
        if (i >= nr) {
            break;
        }
        let ad = bitcast<f32>(aq[((r0 + i) * nb + c) * Q8K_WORDS]);
        if (FORMAT == Q6_K || FORMAT == Q3_K) {
            (*acc)[i] += ad * d * f32(sumi[i]);
        } else {
            (*acc)[i] += ad * (d * f32(sumi[i]) - dmin * f32(summ[i]));
        }
    }
}
