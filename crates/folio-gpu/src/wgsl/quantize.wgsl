// Activations into 8-bit blocks, as the CPU path (and llama.cpp) quantizes matmul
// inputs, a block at a time, dividing as the host does (`div.wgsl`, which comes first). The module that includes this file says where the values
// come from (`value(i)`, element i of the rows being quantized) and where the words go
// (`put_q8(i, word)`, `put_q8k(i, word)`): `quantize_rows.wgsl` (rows of a buffer) and
// `norm.wgsl` (the rows it has just normed).
//
// - Blocks of 32 (`q8_block`): d = amax / 127 and q = round-half-even(x * 127 / amax);
//   d and s = d * sum(q) kept at f16 precision; a block with a NaN has d = s = NaN and
//   q = 0 (every product with it NaN, as on the host). A block is 10 words: d, s, then
//   the 32 q as four signed bytes per word.
// - Blocks of 256 for the K-quants' matmuls (`q8k_block`, `matmul_k.wgsl`), as
//   llama.cpp's `quantize_row_q8_K_ref`: the first value of largest magnitude, big,
//   maps to -127 (iscale = -127 / big), q = min(round-half-even(x * iscale), 127),
//   d = 1 / iscale (f32); a block with a NaN has d = NaN (every product with it NaN,
//   as on the host). A block is 81 words: d, the 256 q as four signed bytes per word,
//   then the 16 sums of each 16 q.

// NaN by its bits: a compiler may take `v != v` to be false.
fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7FFFFFFFu) > 0x7F800000u;
}

// The block of 32 values from `src` into the 10 words from `dst`.
fn q8_block(src: u32, dst: u32) {
    var amax = 0.0;
    var nan = false;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(value(src + i)));
        nan = nan || is_nan(value(src + i));
    }
    if (nan) {
        put_q8(dst, 0x7FC00000u);
        put_q8(dst + 1u, 0x7FC00000u);
        for (var w = 0u; w < 8u; w++) {
            put_q8(dst + 2u + w, 0u);
        }
        return;
    }
    let d = div_exact(amax, 127.0);
    var id = 0.0;
    if (amax != 0.0) {
        id = div_exact(127.0, amax);
    }
    var sum = 0;
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var e = 0u; e < 4u; e++) {
            let q = i32(round(value(src + 4u * w + e) * id));
            sum += q;
            word |= (u32(q) & 0xFFu) << (8u * e);
        }
        put_q8(dst + 2u + w, word);
    }
    put_q8(dst, bitcast<u32>(quantizeToF16(d)));
    put_q8(dst + 1u, bitcast<u32>(quantizeToF16(d * f32(sum))));
}

// The block of 256 values from `src` into the 81 words from `dst`.
fn q8k_block(src: u32, dst: u32) {
    var big = 0.0;
    var amax = 0.0;
    var nan = false;
    for (var i = 0u; i < 256u; i++) {
        let v = value(src + i);
        nan = nan || is_nan(v);
        if (abs(v) > amax) {
            amax = abs(v);
            big = v;
        }
    }
    if (amax == 0.0 || nan) {
        for (var i = 1u; i < 81u; i++) {
            put_q8k(dst + i, 0u);
        }
        put_q8k(dst, select(0u, 0x7FC00000u, nan));
        return;
    }
    let iscale = div_exact(-127.0, big);
    for (var s = 0u; s < 16u; s++) {
        var sum = 0;
        for (var w = 0u; w < 4u; w++) {
            var word = 0u;
            for (var e = 0u; e < 4u; e++) {
                let q = min(i32(round(iscale * value(src + 16u * s + 4u * w + e))), 127);
                sum += q;
                word |= (u32(q) & 0xFFu) << (8u * e);
            }
            put_q8k(dst + 1u + 4u * s + w, word);
        }
        put_q8k(dst + 65u + s, bitcast<u32>(sum));
    }
    put_q8k(dst, bitcast<u32>(div_exact(1.0, iscale)));
}
