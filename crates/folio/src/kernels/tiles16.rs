//! The sixteen-row tile layouts of the AVX-512 path: one GGUF block column of sixteen
//! rows, one 32-bit lane per row, for every format that path has a tile kernel for
//! (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K), and each layout's way of putting one row's GGUF block
//! into its lane and reading it back ([`Tile16`]). Packing keeps every bit: `get` gives
//! back the block `put` was given, so a packed matrix still has GGUF's rows (the
//! embedding lookup, the outlier pass's block columns, another path's layout).
//!
//! The kernels' common shape (`avx512`, `avx512_kquants`): a vector of 64 bytes holds
//! four consecutive weights of each of the sixteen rows as unsigned bytes, built from
//! the stored bits with a few shifts and masks per tile (shared by every activation row
//! of a call), and one `vpdpbusd` with the activations' four matching bytes broadcast
//! adds four products to each row.
//!
//! The quantized values are stored as compactly as GGUF stores them (only the K-quants'
//! 6-bit scales are widened to a byte each), so decode, which streams the weights,
//! reads about as many bytes as the file holds.

use super::quant::*;
use super::scalar;
use bytemuck::{Pod, Zeroable};

/// A column of sixteen rows' blocks in a lane-per-row layout: `put` stores row `r`'s
/// GGUF block in lane r; `get` gives it back bit for bit.
pub trait Tile16: Pod {
    /// The GGUF block one lane holds.
    type Block: Pod;
    fn put(&mut self, r: usize, b: &Self::Block);
    fn get(&self, r: usize) -> Self::Block;
}

/// Sixteen rows' Q5_0 blocks: the scales, `qh` (the fifth bits: bit k of byte 4r + e is
/// bit 4 of weight 4k + e of row r), then `qs` as [`BlockQ4_1x16`]'s (byte 4r + e of
/// `qs[j]`: weight 4j + e in the low nibble, 16 + 4j + e in the high). Weight vector k
/// (weights 4k..4k+4 of every row) is nibbles | fifth bits moved to bit 4.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5_0x16 {
    pub d: [u16; 16],
    pub qh: [u8; 64],
    pub qs: [[u8; 64]; 4],
}

/// Sixteen rows' Q4_0 blocks: the scales, then `qs` as [`BlockQ4_1x16`]'s.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4_0x16 {
    pub d: [u16; 16],
    pub qs: [[u8; 64]; 4],
}

/// Sixteen rows' IQ4_NL blocks: the scales, then the 4-bit indices as [`BlockQ4_0x16`]'s.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockIq4Nlx16 {
    pub d: [u16; 16],
    pub qs: [[u8; 64]; 4],
}

/// Sixteen rows' Q4_K blocks (256 weights each): the scales and the mins of the
/// super-block, the sub-blocks' 6-bit scales one byte each (`sc[j][r]`, sub-block j of
/// row r), their mins as pairs (`m[i][2r + e]` = min of sub-block 2i + e: a pair of
/// 16-bit lanes per row once widened, for `vpdpwssd` against pairs of activation sums),
/// then `qs[8p + k]` = bytes 32p + 4k..+4 of GGUF's `qs` for each row: low nibbles are
/// weights 64p + 4k.. (sub-block 2p), high ones 64p + 32 + 4k.. (sub-block 2p + 1).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4Kx16 {
    pub d: [u16; 16],
    pub dmin: [u16; 16],
    pub sc: [[u8; 16]; 8],
    pub m: [[u8; 32]; 4],
    pub qs: [[u8; 64]; 32],
}

/// Sixteen rows' Q6_K blocks (256 weights each): the scales, the sub-blocks' scales
/// (`sc[s][r]`, sub-block s of 16 weights of row r), then the 6-bit values (0..64, the
/// weight being d·sc·(q - 32)) in vectors of four weights per row: `ql[v]` holds the low
/// four bits of weights 4v.. (low nibble, v < 32) and 128 + 4v.. (high nibble); the two
/// high bits of weights 4g + e are bits 2t..2t+2 of byte 4r + e of `qh[g % 16]`, t = g / 16.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ6Kx16 {
    pub d: [u16; 16],
    pub sc: [[i8; 16]; 16],
    pub ql: [[u8; 64]; 32],
    pub qh: [[u8; 64]; 16],
}

/// Sixteen rows' Q5_K blocks: [`BlockQ4Kx16`]'s fields, and `qh[j]` the fifth bits of
/// sub-block j (bit k of byte 4r + e is bit 4 of weight 32j + 4k + e of row r, as
/// [`BlockQ5_0x16`]'s `qh` is of its block).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5Kx16 {
    pub k4: BlockQ4Kx16,
    pub qh: [[u8; 64]; 8],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0x16>() == 16 * 22);
const _: () = assert!(std::mem::size_of::<BlockQ4_0x16>() == 16 * 18);
const _: () = assert!(std::mem::size_of::<BlockIq4Nlx16>() == 16 * 18);
const _: () = assert!(std::mem::size_of::<BlockQ4Kx16>() == 2368);
// Q4_K and Q5_K take four bytes a row more than GGUF (their 6-bit scales and mins one
// byte each).
const _: () = assert!(std::mem::size_of::<BlockQ5Kx16>() == 16 * (176 + 4));
const _: () = assert!(std::mem::size_of::<BlockQ6Kx16>() == 16 * 210);

impl Tile16 for BlockQ4_1x16 {
    type Block = BlockQ4_1;
    fn put(&mut self, r: usize, b: &BlockQ4_1) {
        self.d[r] = b.d;
        self.m[r] = b.m;
        put_nibbles(&mut self.qs, r, &b.qs);
    }
    fn get(&self, r: usize) -> BlockQ4_1 {
        BlockQ4_1 {
            d: self.d[r],
            m: self.m[r],
            qs: get_nibbles(&self.qs, r),
        }
    }
}

impl Tile16 for BlockQ8_0x16 {
    type Block = BlockQ8_0;
    fn put(&mut self, r: usize, b: &BlockQ8_0) {
        self.d[r] = b.d;
        for (k, q) in self.qs.iter_mut().enumerate() {
            for e in 0..4 {
                q[4 * r + e] = (b.qs[4 * k + e] as u8) ^ 0x80;
            }
        }
    }
    fn get(&self, r: usize) -> BlockQ8_0 {
        BlockQ8_0 {
            d: self.d[r],
            qs: std::array::from_fn(|j| (self.qs[j / 4][4 * r + j % 4] ^ 0x80) as i8),
        }
    }
}

/// Row r's sixteen bytes of nibbles (Q4_0's layout) into the lane of `qs`, and back.
fn put_nibbles(qs: &mut [[u8; 64]; 4], r: usize, from: &[u8; QK / 2]) {
    for (j, q) in qs.iter_mut().enumerate() {
        q[4 * r..4 * r + 4].copy_from_slice(&from[4 * j..4 * j + 4]);
    }
}

fn get_nibbles(qs: &[[u8; 64]; 4], r: usize) -> [u8; QK / 2] {
    std::array::from_fn(|j| qs[j / 4][4 * r + j % 4])
}

impl Tile16 for BlockQ4_0x16 {
    type Block = BlockQ4_0;
    fn put(&mut self, r: usize, b: &BlockQ4_0) {
        self.d[r] = b.d;
        put_nibbles(&mut self.qs, r, &b.qs);
    }
    fn get(&self, r: usize) -> BlockQ4_0 {
        BlockQ4_0 {
            d: self.d[r],
            qs: get_nibbles(&self.qs, r),
        }
    }
}

impl Tile16 for BlockIq4Nlx16 {
    type Block = BlockIq4Nl;
    fn put(&mut self, r: usize, b: &BlockIq4Nl) {
        self.d[r] = b.d;
        put_nibbles(&mut self.qs, r, &b.qs);
    }
    fn get(&self, r: usize) -> BlockIq4Nl {
        BlockIq4Nl {
            d: self.d[r],
            qs: get_nibbles(&self.qs, r),
        }
    }
}

impl Tile16 for BlockQ5_0x16 {
    type Block = BlockQ5_0;
    fn put(&mut self, r: usize, b: &BlockQ5_0) {
        self.d[r] = b.d;
        put_nibbles(&mut self.qs, r, &b.qs);
        put_bits(&mut self.qh, r, |i| {
            (u32::from_le_bytes(b.qh) >> i) & 1 != 0
        });
    }
    fn get(&self, r: usize) -> BlockQ5_0 {
        let h = (0..32).fold(0u32, |h, i| h | (u32::from(get_bit(&self.qh, r, i)) << i));
        BlockQ5_0 {
            d: self.d[r],
            qh: h.to_le_bytes(),
            qs: get_nibbles(&self.qs, r),
        }
    }
}

/// Stores 32 bits of row r, one per weight i of a block of 32 (`bit(i)`), in a plane of
/// fifth bits: bit k of byte 4r + e holds weight 4k + e's.
fn put_bits(plane: &mut [u8; 64], r: usize, bit: impl Fn(usize) -> bool) {
    for e in 0..4 {
        plane[4 * r + e] = (0..8).fold(0u8, |byte, k| byte | (u8::from(bit(4 * k + e)) << k));
    }
}

/// Weight i's bit of row r in a plane [`put_bits`] wrote.
fn get_bit(plane: &[u8; 64], r: usize, i: usize) -> bool {
    (plane[4 * r + i % 4] >> (i / 4)) & 1 != 0
}

/// GGUF's twelve bytes of a Q4_K block's eight 6-bit scales and mins (the inverse of
/// [`q4k_scale_min`]).
fn q4k_pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    s
}

impl Tile16 for BlockQ4Kx16 {
    type Block = BlockQ4K;
    fn put(&mut self, r: usize, b: &BlockQ4K) {
        self.d[r] = b.d;
        self.dmin[r] = b.dmin;
        for j in 0..8 {
            let (sc, m) = q4k_scale_min(j, &b.scales);
            self.sc[j][r] = sc;
            self.m[j / 2][2 * r + j % 2] = m;
        }
        for (v, q) in self.qs.iter_mut().enumerate() {
            q[4 * r..4 * r + 4].copy_from_slice(&b.qs[4 * v..4 * v + 4]);
        }
    }
    fn get(&self, r: usize) -> BlockQ4K {
        let sc: [u8; 8] = std::array::from_fn(|j| self.sc[j][r]);
        let m: [u8; 8] = std::array::from_fn(|j| self.m[j / 2][2 * r + j % 2]);
        BlockQ4K {
            d: self.d[r],
            dmin: self.dmin[r],
            scales: q4k_pack_scales(&sc, &m),
            qs: std::array::from_fn(|i| self.qs[i / 4][4 * r + i % 4]),
        }
    }
}

impl Tile16 for BlockQ5Kx16 {
    type Block = BlockQ5K;
    fn put(&mut self, r: usize, b: &BlockQ5K) {
        let low = BlockQ4K {
            d: b.d,
            dmin: b.dmin,
            scales: b.scales,
            qs: b.qs,
        };
        self.k4.put(r, &low);
        for (j, plane) in self.qh.iter_mut().enumerate() {
            put_bits(plane, r, |l| (b.qh[l] >> j) & 1 != 0);
        }
    }
    fn get(&self, r: usize) -> BlockQ5K {
        let low = self.k4.get(r);
        let qh = std::array::from_fn(|l| {
            (0..8).fold(0u8, |h, j| h | (u8::from(get_bit(&self.qh[j], r, l)) << j))
        });
        BlockQ5K {
            d: low.d,
            dmin: low.dmin,
            scales: low.scales,
            qh,
            qs: low.qs,
        }
    }
}

impl Tile16 for BlockQ6Kx16 {
    type Block = BlockQ6K;
    fn put(&mut self, r: usize, b: &BlockQ6K) {
        self.d[r] = b.d;
        for (s, sc) in self.sc.iter_mut().enumerate() {
            sc[r] = b.scales[s];
        }
        let v = scalar::q6k_values(b);
        for e in 0..4 {
            let byte = 4 * r + e;
            for g in 0..32 {
                let (lo, hi) = ((v[4 * g + e] + 32) as u8, (v[128 + 4 * g + e] + 32) as u8);
                self.ql[g][byte] = (lo & 0xF) | ((hi & 0xF) << 4);
            }
            for g in 0..16 {
                self.qh[g][byte] = (0..4).fold(0, |h, t| {
                    h | ((((v[4 * (g + 16 * t) + e] + 32) as u8) >> 4) << (2 * t))
                });
            }
        }
    }
    fn get(&self, r: usize) -> BlockQ6K {
        // The 6-bit values in weight order, then GGUF's bits of each (the inverse of
        // `scalar::q6k_values`).
        let q: [u8; QK_K] = std::array::from_fn(|i| {
            let (g, e) = (i / 4, i % 4);
            let raw = self.ql[g % 32][4 * r + e];
            let lo = if g < 32 { raw & 0xF } else { raw >> 4 };
            let hi = (self.qh[g % 16][4 * r + e] >> (2 * (g / 16))) & 3;
            lo | (hi << 4)
        });
        let mut b = BlockQ6K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: std::array::from_fn(|s| self.sc[s][r]),
            d: self.d[r],
        };
        for n in 0..2 {
            let y = &q[n * 128..];
            for l in 0..32 {
                b.ql[n * 64 + l] = (y[l] & 0xF) | ((y[l + 64] & 0xF) << 4);
                b.ql[n * 64 + l + 32] = (y[l + 32] & 0xF) | ((y[l + 96] & 0xF) << 4);
                b.qh[n * 32 + l] = (y[l] >> 4)
                    | ((y[l + 32] >> 4) << 2)
                    | ((y[l + 64] >> 4) << 4)
                    | ((y[l + 96] >> 4) << 6);
            }
        }
        b
    }
}
