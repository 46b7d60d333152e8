//! One item of the threaded matmul's work on the path's kernels: a tile of weight rows
//! against a block of activation rows (`run_tile`: the sixteen-row tiles of AVX-512 and,
//! for Q4_1, Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_K, Q5_K and Q6_K, of the AVX2 paths, the AVX2 four-row
//! tiles and register tiles over GGUF rows, else a dot per pair), or one
//! activation row against a run of whole tiles in one call (`run_tiles_one_row`, decode).

use super::out::OutView;
#[cfg(target_arch = "x86_64")]
use super::Layout;
use super::{Activations, QMatrix};
#[cfg(target_arch = "x86_64")]
use crate::gguf::GgmlType;
#[cfg(target_arch = "x86_64")]
use crate::kernels::quant::{BlockQ4_1x4, BlockQ8, BlockQ8_0x4, QK};
use crate::kernels::Isa;
use std::ops::Range;

/// Rows of the four-row tile kernels.
#[cfg(target_arch = "x86_64")]
const ROW_TILE: usize = 4;

/// Sixteen rows from `r0` (the first `real` of them real, the rest padding) × activation
/// rows `t0..n` through the AVX-512 lane-per-row kernels, sixteen activation rows per
/// call (the whole batch of a 16-sequence decode step: each weight loaded once) or up
/// to eight, which write (or add) their results straight into `out`; every (row,
/// column) gets the same arithmetic whatever the width.
#[cfg(target_arch = "x86_64")]
fn run_tile16(
    w: &QMatrix,
    act: &Activations,
    r0: usize,
    real: usize,
    t0: usize,
    n: usize,
    out: &OutView,
) {
    use crate::kernels::avx512::{tile_q4_1x16, tile_q8_0x16};
    macro_rules! widths {
        ($k:expr, |$c:ident| $call:expr, $($w:literal)*) => {
            match $k {
                $($w => {
                    const $c: usize = $w;
                    $call
                })*
                _ => unreachable!("widths cover 1..=8 and 16"),
            }
        };
    }
    use crate::kernels::avx512_kquants::{tile_kx16, tile_q32x16, tile_q6kx16};
    use crate::kernels::tiles16::{
        BlockIq4Nlx16, BlockQ4Kx16, BlockQ4_0x16, BlockQ5Kx16, BlockQ5_0x16,
    };
    let mut t = t0;
    while t < n {
        let k = if n - t >= 16 { 16 } else { (n - t).min(8) };
        let nb = w.blocks_per_row();
        let o = out.tile_out(t * w.rows + r0, w.rows, k, real);
        // Each row its own slice: given one slice and a stride instead, LLVM spilled the
        // sixteen-row Q8_0 kernel's accumulators (269 zmm spills), row barrier or not.
        let q8 = || act.q8_rows(t, k, w.cols);
        let q8k = || act.q8k_rows(t, k, w.cols);
        let sums = || act.sums_rows(t, k, w.cols);
        let tile = r0 / 16;
        match w.ty {
            // SAFETY: AVX-512 paths are only produced after running the features; `o`'s
            // rows are this call's alone (`tile_out`).
            GgmlType::Q4_1 => widths!(k, |C| unsafe {
                tile_q4_1x16::<C>(w.tiles(tile, 1), per_row(q8(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::Q8_0 => widths!(k, |C| unsafe {
                tile_q8_0x16::<C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::Q5_0 => widths!(k, |C| unsafe {
                tile_q32x16::<BlockQ5_0x16, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::Q4_0 => widths!(k, |C| unsafe {
                tile_q32x16::<BlockQ4_0x16, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::IQ4_NL => widths!(k, |C| unsafe {
                tile_q32x16::<BlockIq4Nlx16, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::Q4_K => widths!(k, |C| unsafe {
                tile_kx16::<BlockQ4Kx16, C>(w.tiles(tile, 1), per_row(q8k(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::Q5_K => widths!(k, |C| unsafe {
                tile_kx16::<BlockQ5Kx16, C>(w.tiles(tile, 1), per_row(q8k(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            // SAFETY: as above.
            GgmlType::Q6_K => widths!(k, |C| unsafe {
                tile_q6kx16::<C>(w.tiles(tile, 1), per_row(q8k(), nb), &o)
            }, 1 2 3 4 5 6 7 8 16),
            ty => unreachable!("no sixteen-row tile kernel for {ty}"),
        }
        t += k;
    }
}

/// Activation rows per call of the AVX2 paths' sixteen-row kernels (each half of eight
/// rows: its weight vectors and this many accumulators in the sixteen ymm registers).
/// Measured on Llama 3.2 1B's shapes (ffn_up Q4_K, ffn_down Q6_K, 512 rows): CPU time
/// at width 1, 2, 3, 4 was 1.39, 1.17, 1.06, 1 (Q4_K) and 1.59, 1.16, 1.05, 1 (Q6_K);
/// 5, 6 and 8 were no faster (spills).
#[cfg(target_arch = "x86_64")]
const AVX2_TILE16_WIDTH: usize = 4;

/// [`run_tile16`] on the AVX2 and AVX-VNNI paths (Q5_0, Q4_K, Q6_K:
/// `kernels::avx2_tiles16`; Q4_1, Q8_0, Q4_0, IQ4_NL, Q5_K: `avx2_tiles16_more`), up to [`AVX2_TILE16_WIDTH`] activation rows per call; every
/// (row, column) gets the same arithmetic whatever the width.
#[cfg(target_arch = "x86_64")]
fn run_tile16_avx2(
    isa: Isa,
    w: &QMatrix,
    act: &Activations,
    (r0, real): (usize, usize),
    t0: usize,
    n: usize,
    out: &OutView,
) {
    use crate::kernels::avx2_tiles16::{
        expand_q5_0x16, tile_q4kx16, tile_q5_0x16, tile_q5_0x16_bytes, tile_q6kx16,
    };
    use crate::kernels::avx2_tiles16_more::{tile_q4_1x16, tile_q4x16, tile_q5kx16, tile_q8_0x16};
    use crate::kernels::tiles16::{BlockIq4Nlx16, BlockQ4_0x16};
    macro_rules! widths {
        ($k:expr, |$c:ident| $call:expr, $($w:literal)*) => {
            match $k {
                $($w => {
                    const $c: usize = $w;
                    $call
                })*
                _ => unreachable!("widths cover 1..=AVX2_TILE16_WIDTH"),
            }
        };
    }
    // Q5_0 tiles against more activation rows than one call takes: the tile's weight
    // vectors unpacked once into this thread's scratch, the calls then load them (the
    // same bits; `avx2_tiles16::Q5_0Bytes` says why).
    let nb = w.blocks_per_row();
    let tile = r0 / 16;
    let unpack = w.ty == GgmlType::Q5_0 && n - t0 > AVX2_TILE16_WIDTH;
    // The scratch is taken from the thread only when it is used (the other formats'
    // tile calls touch no thread-local).
    let mut scratch = Vec::new();
    if unpack {
        scratch = Q5_0_SCRATCH.take();
        scratch.resize(nb, [[0; 64]; 8]);
        // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c.
        unsafe { expand_q5_0x16(w.tiles(tile, 1), &mut scratch) };
    }
    let mut t = t0;
    while t < n {
        let k = (n - t).min(AVX2_TILE16_WIDTH);
        let o = out.tile_out(t * w.rows + r0, w.rows, k, real);
        let q8 = || act.q8_rows(t, k, w.cols);
        let q8k = || act.q8k_rows(t, k, w.cols);
        let sums = || act.sums_rows(t, k, w.cols);
        match w.ty {
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c,
            // and the AVX-VNNI one after running its `vpdpbusd`; `o`'s rows are this
            // call's alone (`tile_out`); `scratch` is this tile's, unpacked above.
            GgmlType::Q5_0 if unpack => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q5_0x16_bytes::<D, C>(w.tiles(tile, 1), &scratch, per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q5_0 => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q5_0x16::<D, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q4_K => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q4kx16::<D, C>(w.tiles(tile, 1), per_row(q8k(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q6_K => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q6kx16::<D, C>(w.tiles(tile, 1), per_row(q8k(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q4_1 => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q4_1x16::<D, C>(w.tiles(tile, 1), per_row(q8(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q8_0 => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q8_0x16::<D, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q4_0 => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q4x16::<D, BlockQ4_0x16, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::IQ4_NL => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q4x16::<D, BlockIq4Nlx16, C>(w.tiles(tile, 1), per_row(q8(), nb), per_row(sums(), nb), &o)
            }, 1 2 3 4)),
            // SAFETY: as above.
            GgmlType::Q5_K => with_dot!(isa, D => widths!(k, |C| unsafe {
                tile_q5kx16::<D, C>(w.tiles(tile, 1), per_row(q8k(), nb), &o)
            }, 1 2 3 4)),
            ty => unreachable!("no AVX2 sixteen-row tile kernel for {ty}"),
        }
        t += k;
    }
    if unpack {
        Q5_0_SCRATCH.set(scratch);
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`run_tile16_avx2`]'s unpacked Q5_0 tile: one per thread, taken and put back
    /// by each call (a tile's blocks: 512 bytes each).
    static Q5_0_SCRATCH: std::cell::Cell<Vec<crate::kernels::avx2_tiles16::Q5_0Bytes>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// `C` activation rows of `nb` blocks each, back to back in `v`, as one slice per row.
#[cfg(target_arch = "x86_64")]
fn per_row<T, const C: usize>(v: &[T], nb: usize) -> [&[T]; C] {
    std::array::from_fn(|c| &v[c * nb..(c + 1) * nb])
}

/// Runs a four-row tile kernel over activation rows `t0..n` in calls as wide as the
/// widest width listed (the rest in one narrower call), and writes the first `real`
/// rows' results; `act.row` names the activations' row accessor the kernel reads.
/// Every (row, column) gets the same arithmetic whatever the width.
#[cfg(target_arch = "x86_64")]
macro_rules! by_columns {
    ($w:expr, $act:ident.$row:ident, $out:expr, $r0:expr, $real:expr, $t0:expr, $n:expr,
     |$a:ident, $o:ident| $call:expr, $($c:literal)*) => {{
        let widest = [$($c),*].into_iter().max().unwrap_or(1);
        let mut t = $t0;
        while t < $n {
            let k = ($n - t).min(widest);
            let mut all = [[0f32; 8]; 4];
            match k {
                $($c => {
                    let $a: [&[BlockQ8]; $c] = std::array::from_fn(|c| $act.$row(t + c, $w.cols));
                    let mut $o = [[0f32; $c]; 4];
                    $call;
                    for (d, s) in all.iter_mut().zip($o) {
                        d[..$c].copy_from_slice(&s);
                    }
                })*
                _ => unreachable!("widths cover 1..=widest"),
            }
            for (r, row) in all.iter().enumerate().take($real) {
                for (c, &v) in row.iter().enumerate().take(k) {
                    $out.write((t + c) * $w.rows + $r0 + r, v);
                }
            }
            t += k;
        }
    }};
}

/// Activation row t against `count` whole tiles from row r0, in one kernel call where
/// the path has a one-row form over tiles (the same bits as `run_tile` tile by tile).
/// False, with nothing written, where it has none or the last tile holds padding rows.
#[inline]
pub(super) fn run_tiles_one_row(
    isa: Isa,
    w: &QMatrix,
    act: &Activations,
    r0: usize,
    count: usize,
    t: usize,
    out: &OutView,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && w.layout == Layout::Tiles16 && r0 + count * 16 <= w.rows {
        use crate::kernels::{avx512, avx512_kquants as kq};
        let nb = w.blocks_per_row();
        let tiles = r0 / 16;
        let o = out.run(t * w.rows + r0, count * 16);
        let add = out.add;
        let q8 = || act.q8_row(t, w.cols);
        let q8k = || act.q8k_row(t, w.cols);
        let sums = || act.sums_row(t, w.cols);
        match w.ty {
            // SAFETY: AVX-512 paths are only produced after running the features.
            GgmlType::Q4_1 => unsafe {
                avx512::tiles_q4_1x16_one_row(w.tiles(tiles, count), nb, q8(), o, add)
            },
            // SAFETY: as above.
            GgmlType::Q8_0 => unsafe {
                avx512::tiles_q8_0x16_one_row(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            },
            // SAFETY: as above.
            GgmlType::Q5_0 => unsafe {
                kq::tiles_q5_0x16_one_row(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            },
            // SAFETY: as above.
            GgmlType::Q4_0 => unsafe {
                kq::tiles_q4_0x16_one_row(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            },
            // SAFETY: as above.
            GgmlType::IQ4_NL => unsafe {
                kq::tiles_iq4nlx16_one_row(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            },
            // SAFETY: as above.
            GgmlType::Q4_K => unsafe {
                kq::tiles_q4kx16_one_row(w.tiles(tiles, count), nb, q8k(), o, add)
            },
            // SAFETY: as above.
            GgmlType::Q5_K => unsafe {
                kq::tiles_q5kx16_one_row(w.tiles(tiles, count), nb, q8k(), o, add)
            },
            // SAFETY: as above.
            GgmlType::Q6_K => unsafe {
                kq::tiles_q6kx16_one_row(w.tiles(tiles, count), nb, q8k(), o, add)
            },
            ty => unreachable!("no sixteen-row tile kernel for {ty}"),
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2()
        && w.layout == Layout::Tiles16
        && QMatrix::avx2_tiles16(w.ty)
        && r0 + count * 16 <= w.rows
    {
        use crate::kernels::{avx2_tiles16 as kt, avx2_tiles16_more as km};
        let nb = w.blocks_per_row();
        let tiles = r0 / 16;
        let o = out.run(t * w.rows + r0, count * 16);
        let add = out.add;
        let q8 = || act.q8_row(t, w.cols);
        let q8k = || act.q8k_row(t, w.cols);
        let sums = || act.sums_row(t, w.cols);
        match w.ty {
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c,
            // and the AVX-VNNI one after running its `vpdpbusd`.
            GgmlType::Q5_0 => with_dot!(isa, D => unsafe {
                kt::tiles_q5_0x16_one_row::<D>(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::Q4_K => with_dot!(isa, D => unsafe {
                kt::tiles_q4kx16_one_row::<D>(w.tiles(tiles, count), nb, q8k(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::Q6_K => with_dot!(isa, D => unsafe {
                kt::tiles_q6kx16_one_row::<D>(w.tiles(tiles, count), nb, q8k(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::Q4_1 => with_dot!(isa, D => unsafe {
                km::tiles_q4_1x16_one_row::<D>(w.tiles(tiles, count), nb, q8(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::Q8_0 => with_dot!(isa, D => unsafe {
                km::tiles_q8_0x16_one_row::<D>(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::Q4_0 => with_dot!(isa, D => unsafe {
                km::tiles_q4_0x16_one_row::<D>(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::IQ4_NL => with_dot!(isa, D => unsafe {
                km::tiles_iq4nlx16_one_row::<D>(w.tiles(tiles, count), nb, q8(), sums(), o, add)
            }),
            // SAFETY: as above.
            GgmlType::Q5_K => with_dot!(isa, D => unsafe {
                km::tiles_q5kx16_one_row::<D>(w.tiles(tiles, count), nb, q8k(), o, add)
            }),
            ty => unreachable!("no AVX2 sixteen-row tile kernel for {ty}"),
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && w.layout == Layout::Tiles4 && r0 + count * ROW_TILE <= w.rows {
        use crate::kernels::avx2;
        let nb = w.cols / QK;
        let a = act.q8_row(t, w.cols);
        let mut o = [0f32; 8 * ROW_TILE];
        for first in (0..count).step_by(8) {
            let k = (count - first).min(8);
            let tile = r0 / ROW_TILE + first;
            let o = &mut o[..k * ROW_TILE];
            let q4 = || w.tiles::<BlockQ4_1x4>(tile, k);
            let q8 = || w.tiles::<BlockQ8_0x4>(tile, k);
            match w.ty {
                // SAFETY: AVX2 paths are only produced after detecting avx2, fma and
                // f16c, and the AVX-VNNI and AVX-512 ones after running `vpdpbusd`.
                GgmlType::Q4_1 => with_dot!(isa, D => unsafe {
                    avx2::tiles_q4_1x4_one_row::<D>(q4(), nb, a, o)
                }),
                // SAFETY: as above.
                GgmlType::Q8_0 => with_dot!(isa, D => unsafe {
                    avx2::tiles_q8_0x4_one_row::<D>(q8(), nb, a, o)
                }),
                _ => return false,
            }
            out.write_run(t * w.rows + tile * ROW_TILE, o);
        }
        return true;
    }
    let _ = (isa, w, act, r0, count, t, out);
    false
}

/// Rows `rows` of `w` (one tile's, or fewer where the last tile holds padding) against
/// activation rows `acts`, written (or added) into `out`. (A range is passed as a pair
/// of registers, as its two ends were as separate arguments: the call is the same.)
pub(super) fn run_tile(
    isa: Isa,
    w: &QMatrix,
    act: &Activations,
    rows: Range<usize>,
    acts: Range<usize>,
    out: &OutView,
) {
    let (r0, r1, t0, n) = (rows.start, rows.end, acts.start, acts.end);
    #[cfg(target_arch = "x86_64")]
    if w.layout == Layout::Tiles16 && (isa.avx512() || (isa.avx2() && QMatrix::avx2_tiles16(w.ty)))
    {
        if isa.avx512() {
            run_tile16(w, act, r0, r1 - r0, t0, n, out);
        } else {
            run_tile16_avx2(isa, w, act, (r0, r1 - r0), t0, n, out);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && w.layout == Layout::Tiles4 && w.ty == GgmlType::Q8_0 {
        let tile = w.tile_q8_0(r0 / 4);
        // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c, and
        // the AVX-VNNI and AVX-512 ones after running `vpdpbusd`.
        with_dot!(isa, D => by_columns!(w, act.q8_row, out, r0, r1 - r0, t0, n, |a, o| unsafe {
            crate::kernels::avx2::tile_q8_0x4::<D, _>(tile, a, &mut o)
        }, 1 2));
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && w.layout == Layout::Tiles4 && w.ty == GgmlType::Q4_1 {
        let tile = w.tile_q4_1(r0 / 4);
        let real = r1 - r0;
        let emit = |t: usize, o: &[[f32; 3]; 4], k: usize| {
            for (r, row) in o.iter().enumerate().take(real) {
                for (c, &v) in row.iter().enumerate().take(k) {
                    out.write((t + c) * w.rows + r0 + r, v);
                }
            }
        };
        // Three activation rows per call (the widest tile that stays in registers);
        // every (row, column) gets the same arithmetic whatever the width.
        let mut t = t0;
        while t < n {
            let k = (n - t).min(3);
            let q = |c: usize| act.q8_row(t + c, w.cols);
            let mut o = [[0f32; 3]; 4];
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c,
            // and the AVX-VNNI one after running its `vpdpbusd`.
            with_dot!(isa, D => unsafe {
                use crate::kernels::avx2::tile_q4_1x4;
                match k {
                    3 => tile_q4_1x4::<D, 3>(tile, [q(0), q(1), q(2)], &mut o),
                    2 => {
                        let mut o2 = [[0f32; 2]; 4];
                        tile_q4_1x4::<D, 2>(tile, [q(0), q(1)], &mut o2);
                        for (d, s) in o.iter_mut().zip(o2) {
                            d[..2].copy_from_slice(&s);
                        }
                    }
                    _ => {
                        let mut o1 = [[0f32; 1]; 4];
                        tile_q4_1x4::<D, 1>(tile, [q(0)], &mut o1);
                        for (d, s) in o.iter_mut().zip(o1) {
                            d[0] = s[0];
                        }
                    }
                }
            });
            emit(t, &o, k);
            t += k;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2()
        && r1 - r0 == ROW_TILE
        && w.layout == Layout::Rows
        && matches!(
            w.ty,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::IQ4_NL
        )
    {
        let mut t = t0;
        while t + 2 <= n {
            let mut o = [[0f32; 2]; ROW_TILE];
            // SAFETY: AVX2 paths are only produced after detecting avx2, fma and f16c,
            // and the AVX-VNNI one after running its `vpdpbusd`.
            with_dot!(isa, D => unsafe { w.tile_avx2::<D, ROW_TILE, 2>(r0, act, t, &mut o) });
            for (r, row) in o.iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    out.write((t + c) * w.rows + r0 + r, v);
                }
            }
            t += 2;
        }
        if t < n {
            let mut o = [[0f32; 1]; ROW_TILE];
            // SAFETY: as above.
            with_dot!(isa, D => unsafe { w.tile_avx2::<D, ROW_TILE, 1>(r0, act, t, &mut o) });
            for (r, row) in o.iter().enumerate() {
                out.write(t * w.rows + r0 + r, row[0]);
            }
        }
        return;
    }
    for r in r0..r1 {
        for t in t0..n {
            out.write(t * w.rows + r, w.dot(isa, r, act, t));
        }
    }
}
