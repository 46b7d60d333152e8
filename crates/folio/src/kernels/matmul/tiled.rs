//! The threaded matmul: [`matmul`] and [`matmul_add`] split the row tiles of every
//! matrix in the call over the pool's threads, each thread a contiguous share run column
//! block by column block, and threads that finish take items from the others' lists.
//! Each item runs in `runners`.

use super::out::OutView;
use super::runners::{run_tile, run_tiles_one_row};
use super::{ActKind, Activations, QMatrix, PARALLEL_ROWS};
use crate::kernels::pool::{share, ThreadPool, WorkList};
use crate::kernels::Isa;

/// Activation rows per block of the matmul's outer loop (32 rows of 576 8-bit values
/// take ~23 KB: they stay in L1).
const COL_BLOCK: usize = 32;

/// For each `(w, out)`: `out[t * w.rows + r] = dot(w row r, x row t)` for every
/// activation row t of `act`. Matrices must have `cols` equal to the activations'.
pub fn matmul(
    pool: &ThreadPool,
    isa: Isa,
    act: &mut Activations,
    jobs: &mut [(&QMatrix, &mut [f32])],
) {
    matmul_into(pool, isa, act, jobs, false);
}

/// [`matmul`] of one matrix added to `out`: `out[t * w.rows + r] += dot(w row r, x row
/// t)`, each sum rounded once, as a matmul then an add would (a residual connection
/// without its own pass over the rows).
pub fn matmul_add(
    pool: &ThreadPool,
    isa: Isa,
    act: &mut Activations,
    w: &QMatrix,
    out: &mut [f32],
) {
    matmul_into(pool, isa, act, &mut [(w, out)], true);
}

/// [`matmul`], or with `add` [`matmul_add`].
fn matmul_into(
    pool: &ThreadPool,
    isa: Isa,
    act: &mut Activations,
    jobs: &mut [(&QMatrix, &mut [f32])],
    add: bool,
) {
    prepare(pool, isa, act, jobs);
    let act = &*act;
    let views: Vec<(&QMatrix, OutView)> = jobs
        .iter_mut()
        .map(|(w, o)| (*w, OutView::new(o, add)))
        .collect();
    let tiles: Vec<usize> = views
        .iter()
        .map(|(w, _)| w.rows.div_ceil(w.tile_rows()))
        .collect();
    let total: usize = tiles.iter().sum();
    let n_threads = pool.parallelism().min(total.max(1));
    // Global tile index -> (matrix, its first row).
    let locate = |tile: usize| {
        let mut base = 0;
        for (j, &nt) in tiles.iter().enumerate() {
            if tile < base + nt {
                return (j, (tile - base) * views[j].0.tile_rows());
            }
            base += nt;
        }
        unreachable!("tile {tile} past the last matrix")
    };
    // Each task owns a contiguous share of the tiles and runs it column block by column
    // block (a block of activation rows stays in L1 while the task's weight tiles, in
    // its thread's L2, pass over it): a work item is (column block, a few tiles of the
    // share). The owner takes items from the front of its list; a task that has
    // finished takes them from the front of another's too, so a thread slowed down (a
    // busy neighbour, the other thread's serial work) never leaves the rest waiting.
    // From the front, not the back: a thief then reads weights in ascending order, and
    // decode (bound by memory) ran ~1.5x slower on items taken in descending order (the
    // hardware prefetcher's loss). With few activation rows a tile is quick work:
    // items of several tiles keep claiming cheap.
    let per = if act.n >= PARALLEL_ROWS { 1 } else { 8 };
    let n_blocks = act.n.div_ceil(COL_BLOCK);
    let lists: Vec<WorkList> = (0..n_threads)
        .map(|i| {
            let (a, b) = share(total, i, n_threads);
            WorkList::new((b - a).div_ceil(per) * n_blocks)
        })
        .collect();
    let item = |i: usize, k: usize| {
        let (a, b) = share(total, i, n_threads);
        let chunks = (b - a).div_ceil(per);
        let (cb, c) = (k / chunks, k % chunks);
        let t0 = cb * COL_BLOCK;
        let t1 = (t0 + COL_BLOCK).min(act.n);
        let (mut tile, end) = (a + c * per, (a + (c + 1) * per).min(b));
        while tile < end {
            let (j, r0) = locate(tile);
            let (w, out) = &views[j];
            // This item's tiles of matrix j.
            let tr = w.tile_rows();
            let count = (tiles[j] - r0 / tr).min(end - tile);
            if t1 - t0 == 1 && run_tiles_one_row(isa, w, act, r0, count, t0, out) {
                tile += count;
                continue;
            }
            for k in 0..count {
                let r = r0 + k * tr;
                run_tile(isa, w, act, r..(r + tr).min(w.rows), t0..t1, out);
            }
            tile += count;
        }
    };
    drain(pool, &lists, &item);
}

/// Checks each job's shapes (the matrix as wide as the activations, the output large
/// enough) and makes every activation form the jobs' kernels read.
fn prepare(pool: &ThreadPool, isa: Isa, act: &mut Activations, jobs: &[(&QMatrix, &mut [f32])]) {
    for (w, out) in jobs.iter() {
        assert_eq!(
            w.cols, act.cols,
            "matmul: weight and activation widths differ"
        );
        assert!(out.len() >= act.n * w.rows, "matmul: output too small");
    }
    for (w, _) in jobs.iter() {
        act.ensure(pool, isa, w.act_kind());
        if w.reads_sums(isa) {
            act.ensure(pool, isa, ActKind::Q8Sums);
        }
    }
}

/// Runs `item(list, k)` for every item k of every list on `pool`'s threads, one thread
/// per list: each takes its own list's items from the front, then the other lists'
/// (from the next list on), also from the front.
fn drain(pool: &ThreadPool, lists: &[WorkList], item: &(impl Fn(usize, usize) + Sync)) {
    let n_threads = lists.len();
    pool.run(&|i| {
        if i >= n_threads {
            return;
        }
        while let Some(k) = lists[i].pop_front() {
            item(i, k);
        }
        for j in (1..n_threads).map(|o| (i + o) % n_threads) {
            while let Some(k) = lists[j].pop_front() {
                item(j, k);
            }
        }
    });
}
