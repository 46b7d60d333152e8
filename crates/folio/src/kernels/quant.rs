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
const _: () = assert!(std::mem::size_of::<BlockQ8>() == 40);
const _: () = assert!(std::mem::size_of::<BlockQ4_1x4>() == 80);
const _: () = assert!(std::mem::size_of::<BlockQ8_0x4>() == 136);
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
