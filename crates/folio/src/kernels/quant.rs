//! Block layouts of the quantized formats, byte-for-byte as GGUF stores them, plus the
//! 8-bit activation blocks the integer dot products consume.
//!
//! Weight blocks keep their scales as raw f16 bits (`u16`) so a slice of file bytes can
//! be viewed as a slice of blocks without copying (`bytemuck` checks size and alignment).

use bytemuck::{Pod, Zeroable};

pub const QK: usize = 32;
pub const QK_K: usize = 256;

/// Q4_0: 32 weights = d * (q - 8), q in 0..16; low nibbles hold 0..16, high 16..32.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

/// Q4_1: 32 weights = d * q + m, q in 0..16; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}

/// Q8_0: 32 weights = d * q, q in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}

/// Q4_K: 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min
/// packed into `scales`; weight = d * sc * q - dmin * m.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 weights in 16 sub-blocks of 16 with i8 scales; q is 6 bits (4 in `ql`,
/// 2 in `qh`) minus 32; weight = d * sc * q.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}

/// Q5_0: 32 weights = d * (q - 16), q in 0..32: the low 4 bits as Q4_0's nibbles, bit 4
/// of weight j is bit j of `qh` (little-endian u32).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: 32 weights = d * q + m, q in 0..32; bits as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// IQ4_NL: 32 weights = d * IQ4NL_VALUES[q], q a 4-bit index; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockIq4Nl {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

/// The 16 levels of IQ4_NL, a non-uniform grid denser near zero (GGUF's fixed table).
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Q2_K: 256 weights in 16 sub-blocks of 16; `scales[s]` holds sub-block s's 4-bit scale
/// (low nibble) and 4-bit min (high); q is 2 bits; weight = d * sc * q - dmin * m.
/// Weight 128n + 32k + l is bits 2k..2k+2 of `qs[32n + l]`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}

/// Q3_K: 256 weights in 16 sub-blocks of 16 with signed 6-bit scales (minus 32, packed
/// in `scales`); q is 2 low bits (laid out as Q2_K's) and a high bit in `hmask` (bit k
/// of `hmask[l]` for weight 32k + l) that, when clear, subtracts 4; weight = d * sc * q.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: u16,
}

/// Q5_K: Q4_K's scales and nibbles plus a fifth bit per weight (bit k of `qh[l]` for
/// weight 32k + l); weight = d * sc * q - dmin * m, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Four rows' Q4_1 blocks at the same column, packed at load time so a kernel converts
/// the four scales and four mins with one instruction: `dm` = [d0..d3, m0..m3].
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_1x4 {
    pub dm: [u16; 8],
    pub qs: [[u8; QK / 2]; 4],
}

/// Four rows' Q8_0 blocks at the same column, packed at load time: the four scales,
/// then the rows' first 16 weights (row 0..3), then their last 16. A 4-row kernel reads
/// one stream, and each half of four rows is one 64-byte load.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8_0x4 {
    pub d: [u16; 4],
    pub qs: [[i8; QK / 2]; 8],
}

/// Sixteen rows' Q4_1 blocks at the same column, for the AVX-512 path's lane-per-row
/// kernel: the scales, the mins, then `qs[j]` = bytes 4j..4j+4 of row 0, row 1, … row
/// 15 (each byte a low nibble, weight i, and a high one, weight 16 + i).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_1x16 {
    pub d: [u16; 16],
    pub m: [u16; 16],
    pub qs: [[u8; 64]; 4],
}

/// Sixteen rows' Q8_0 blocks at the same column, for the AVX-512 path's lane-per-row
/// kernel: the scales, then `qs[k]` = weights 4k..4k+4 of row 0, row 1, … row 15, each
/// moved up by 128 into an unsigned byte (`q ^ 0x80`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8_0x16 {
    pub d: [u16; 16],
    pub qs: [[u8; 64]; 8],
}

/// 8-bit activations for the 32-element formats: x ≈ d * q; `s` = d * Σq, which lets
/// offset formats (Q4_0's -8, Q4_1's min) fold their constant term into one multiply.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK],
}

/// 8-bit activations for the K-quants: one scale per 256, sums of each 16 for the mins.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ8>() == 40);
const _: () = assert!(std::mem::size_of::<BlockQ4_1x4>() == 80);
const _: () = assert!(std::mem::size_of::<BlockQ8_0x4>() == 136);
const _: () = assert!(std::mem::size_of::<BlockQ4_1x16>() == 320);
const _: () = assert!(std::mem::size_of::<BlockQ8_0x16>() == 544);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Unpacks the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block.
#[inline]
pub fn q4k_scale_min(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 16 signed scales (-32..32) of a Q3_K block, one per sub-block of 16: the low 4
/// bits from `s[0..8]` (low nibbles for 0..8, high for 8..16), the high 2 bits from
/// `s[8..12]` (bits 2(k/4).. of byte 8 + k%4).
#[inline]
pub fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|k| {
        let lo = if k < 8 { s[k] & 0xF } else { s[k - 8] >> 4 };
        let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        (lo | (hi << 4)) as i8 - 32
    })
}
