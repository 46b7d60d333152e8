//! K/V element storage shared by the paged arena and the contiguous cache: f16 (the
//! default, what llama.cpp stores), f32, or 8-bit with one f16 scale per head row
//! (`kernels::kv_rows` describes the format), chosen at run time.

use crate::kernels::advise_huge_pages;
use crate::kernels::{quantize_kv_q8, rotate_heads, to_f16};
pub use crate::kernels::{KvDtype, KvRows};

/// The K rows and the V rows of one run of slots.
pub type KvPair<'a> = (KvRows<'a>, KvRows<'a>);

/// A flat buffer of K/V elements of one dtype. Element positions are the same for
/// every dtype; 8-bit elements keep their scales aside, one per `hd` elements.
pub enum KvBuf {
    F16(Vec<u16>),
    F32(Vec<f32>),
    Q8 { q: Vec<i8>, d: Vec<u16>, hd: usize },
}

impl KvBuf {
    /// `len` zeroed elements, on huge pages where the system gives them (a decode step
    /// reads every page of a long context: 4 KiB pages would miss the TLB on each).
    /// `head_dim` is the head size (8-bit rows keep a scale per head row; `len` is then
    /// a multiple of it).
    pub fn new(dtype: KvDtype, len: usize, head_dim: usize) -> Self {
        match dtype {
            KvDtype::F16 => {
                let mut v = vec![0; len];
                advise_huge_pages(&mut v);
                KvBuf::F16(v)
            }
            KvDtype::F32 => {
                let mut v = vec![0.0; len];
                advise_huge_pages(&mut v);
                KvBuf::F32(v)
            }
            KvDtype::Q8 => {
                let hd = head_dim.max(1);
                let mut q = vec![0i8; len];
                advise_huge_pages(&mut q);
                let mut d = vec![0u16; len.div_ceil(hd)];
                advise_huge_pages(&mut d);
                KvBuf::Q8 { q, d, hd }
            }
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            KvBuf::F16(_) => KvDtype::F16,
            KvBuf::F32(_) => KvDtype::F32,
            KvBuf::Q8 { .. } => KvDtype::Q8,
        }
    }

    /// Stores `src` at element `at`, converted to the buffer's dtype (8-bit: whole head
    /// rows, rotated then quantized: `kernels::kv_rows`).
    pub fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvBuf::F16(v) => to_f16(src, &mut v[at..at + src.len()]),
            KvBuf::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            KvBuf::Q8 { q, d, hd } => {
                let h = *hd;
                assert!(at.is_multiple_of(h) && src.len().is_multiple_of(h));
                let (q, d) = (
                    &mut q[at..at + src.len()],
                    &mut d[at / h..(at + src.len()) / h],
                );
                let mut x = src.to_vec();
                rotate_heads(&mut x, h);
                quantize_kv_q8(&x, h, q, d);
            }
        }
    }

    /// Elements `from..to` as typed rows.
    pub fn rows(&self, from: usize, to: usize) -> KvRows<'_> {
        match self {
            KvBuf::F16(v) => KvRows::F16(&v[from..to]),
            KvBuf::F32(v) => KvRows::F32(&v[from..to]),
            KvBuf::Q8 { q, d, hd } => KvRows::Q8 {
                q: &q[from..to],
                d: &d[from / hd..to.div_ceil(*hd)],
                hd: *hd,
            },
        }
    }

    /// Bytes that elements `from..to` take (whole head rows).
    pub fn bytes_of(&self, from: usize, to: usize) -> usize {
        match self {
            KvBuf::Q8 { hd, .. } => self.dtype().row_bytes(to - from, *hd),
            _ => self.dtype().row_bytes(to - from, 1),
        }
    }

    /// Appends the stored bytes of elements `from..to` (whole head rows) to `out`,
    /// little-endian: the elements, then for 8-bit rows their scales. For copying and
    /// persisting without conversion; [`KvBuf::put_bytes`] is the inverse.
    pub fn get_bytes(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        let le = cfg!(target_endian = "little");
        match self {
            KvBuf::F16(v) if le => out.extend_from_slice(bytemuck::cast_slice(&v[from..to])),
            KvBuf::F32(v) if le => out.extend_from_slice(bytemuck::cast_slice(&v[from..to])),
            KvBuf::F16(v) => v[from..to]
                .iter()
                .for_each(|h| out.extend_from_slice(&h.to_le_bytes())),
            KvBuf::F32(v) => v[from..to]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            KvBuf::Q8 { q, d, hd } => {
                out.extend(q[from..to].iter().map(|&b| b as u8));
                d[from / hd..to / hd]
                    .iter()
                    .for_each(|h| out.extend_from_slice(&h.to_le_bytes()));
            }
        }
    }

    /// Stores elements `from..to` from `bytes`, as [`KvBuf::get_bytes`] wrote them
    /// (`bytes` is exactly [`KvBuf::bytes_of`] long).
    pub fn put_bytes(&mut self, from: usize, to: usize, bytes: &[u8]) {
        let le16 = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
        let le = cfg!(target_endian = "little");
        match self {
            KvBuf::F16(v) if le => {
                bytemuck::cast_slice_mut::<u16, u8>(&mut v[from..to]).copy_from_slice(bytes)
            }
            KvBuf::F32(v) if le => {
                bytemuck::cast_slice_mut::<f32, u8>(&mut v[from..to]).copy_from_slice(bytes)
            }
            KvBuf::F16(v) => {
                for (o, c) in v[from..to].iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = le16(c);
                }
            }
            KvBuf::F32(v) => {
                for (o, c) in v[from..to].iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            KvBuf::Q8 { q, d, hd } => {
                let (qb, db) = bytes.split_at(to - from);
                for (o, &b) in q[from..to].iter_mut().zip(qb) {
                    *o = b as i8;
                }
                for (o, c) in d[from / *hd..to / *hd].iter_mut().zip(db.chunks_exact(2)) {
                    *o = le16(c);
                }
            }
        }
    }

    /// The raw 16-bit units of elements `from..to` (two per f32 element) of f16 or f32
    /// rows: for tests and copying in bulk. 8-bit rows have none (it panics on them):
    /// [`KvBuf::get_bytes`] reads every dtype.
    pub fn raw(&self, from: usize, to: usize) -> &[u16] {
        match self {
            KvBuf::F16(v) => &v[from..to],
            KvBuf::F32(v) => bytemuck::cast_slice(&v[from..to]),
            KvBuf::Q8 { .. } => panic!("8-bit K/V rows have no 16-bit units"),
        }
    }

    /// Mutable raw units of elements `from..to` (f16 or f32 rows, as [`KvBuf::raw`]).
    pub fn raw_mut(&mut self, from: usize, to: usize) -> &mut [u16] {
        match self {
            KvBuf::F16(v) => &mut v[from..to],
            KvBuf::F32(v) => bytemuck::cast_slice_mut(&mut v[from..to]),
            KvBuf::Q8 { .. } => panic!("8-bit K/V rows have no 16-bit units"),
        }
    }

    /// Copies elements `src..src+n` to `dst..dst+n` within the buffer (whole head rows).
    pub fn copy_within(&mut self, src: usize, dst: usize, n: usize) {
        match self {
            KvBuf::F16(v) => v.copy_within(src..src + n, dst),
            KvBuf::F32(v) => v.copy_within(src..src + n, dst),
            KvBuf::Q8 { q, d, hd } => {
                q.copy_within(src..src + n, dst);
                d.copy_within(src / *hd..(src + n) / *hd, dst / *hd);
            }
        }
    }
}
