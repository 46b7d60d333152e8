//! The attention plan's rules, without kernels or K/V: every key of every (row, KV head)
//! in exactly one unit, in order; cut points that depend on the position only; disjoint
//! partial states; the threads' shares; the keys asked for ahead.

use super::plan::{first_key, Ahead, Plan, Shape};
use super::{HEADS_TOGETHER_KEYS, ROW_BLOCK, SPLIT_KEYS};

fn shape(threads: usize, window: Option<usize>) -> Shape {
    Shape {
        n_kv_heads: 3,
        state: 64 + 2,
        group: 3,
        window,
        threads,
    }
}

/// A step of prefill chunks and decode rows: (seq, first position, rows).
fn rows(seqs: &[(usize, usize, usize)]) -> Vec<(usize, usize)> {
    seqs.iter()
        .flat_map(|&(s, p, n)| (p..p + n).map(move |q| (s, q)))
        .collect()
}

/// Row `r`'s key ranges for KV head `kh`, in the order the combine takes them.
fn ranges(plan: &Plan, rows: &[(usize, usize)], r: usize, kh: u32) -> Vec<(usize, usize)> {
    let (a, b) = plan.block_units[r];
    plan.units[a..b]
        .iter()
        .filter(|u| u.h0 <= kh && kh < u.h1 && u.r0 as usize <= r && r < u.r1 as usize)
        .map(|u| {
            let from = (u.k0 as usize).max(first_key(plan.window, rows[r].1));
            (from, u.k1.min(rows[r].1 as u32 + 1) as usize)
        })
        .collect()
}

const STEPS: &[&[(usize, usize, usize)]] = &[
    &[(0, 0, 1)],
    &[(0, 5000, 1)],
    &[(0, 0, 100), (1, 3000, 1), (2, 70, 1)],
    &[(0, 900, 300), (1, 2047, 2)],
    &[
        (0, 10, 1),
        (1, 20, 1),
        (2, 30, 1),
        (3, 40, 1),
        (4, 50, 1),
        (5, 9000, 1),
        (6, 1, 1),
        (7, 2, 1),
    ],
];

#[test]
fn every_key_of_every_row_and_head_is_in_exactly_one_unit_in_order() {
    for window in [None, Some(700)] {
        for step in STEPS {
            let rows = rows(step);
            for threads in [1, 2, 8] {
                for page in [16, 4096] {
                    let plan = Plan::new(&rows, |_| page, shape(threads, window));
                    for (r, &(_, pos)) in rows.iter().enumerate() {
                        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                        for kh in 0..3 {
                            let got = ranges(&plan, &rows, r, kh);
                            let mut at = lo;
                            for (k0, k1) in &got {
                                assert_eq!(*k0, at, "row {r} head {kh}: {got:?}");
                                at = *k1;
                            }
                            assert_eq!(at, pos + 1, "row {r} head {kh}: {got:?}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_rows_cut_points_depend_on_its_position_only() {
    for window in [None, Some(700)] {
        let alone = |pos: usize| {
            let rows = [(0, pos)];
            let plan = Plan::new(&rows, |_| 16, shape(1, window));
            ranges(&plan, &rows, 0, 0)
        };
        for step in STEPS {
            let rows = rows(step);
            for threads in [1, 2, 8] {
                let plan = Plan::new(&rows, |_| 16, shape(threads, window));
                for (r, &(_, pos)) in rows.iter().enumerate() {
                    assert_eq!(ranges(&plan, &rows, r, 1), alone(pos), "row {r} at {pos}");
                    for (k0, _) in ranges(&plan, &rows, r, 1).iter().skip(1) {
                        assert_eq!(k0 % SPLIT_KEYS, 0);
                    }
                }
            }
        }
    }
}

#[test]
fn blocks_are_runs_of_one_sequence_at_consecutive_positions() {
    let rows = rows(&[(0, 0, 70), (1, 5, 1), (2, 0, 3)]);
    let plan = Plan::new(&rows, |_| 16, shape(2, None));
    let blocks: Vec<_> = plan.block_units.iter().collect();
    // 70 rows: blocks of 32, 32 and 6; then two blocks of their own.
    let starts: Vec<usize> = (0..rows.len())
        .filter(|&r| r == 0 || blocks[r] != blocks[r - 1])
        .collect();
    assert_eq!(starts, [0, ROW_BLOCK, 2 * ROW_BLOCK, 70, 71]);
    // With a window too.
    let plan = Plan::new(&rows, |_| 16, shape(2, Some(8)));
    let windowed: Vec<_> = plan.block_units.iter().collect();
    assert_eq!(windowed, blocks);
}

#[test]
fn partial_states_are_disjoint_and_fill_the_buffer() {
    for step in STEPS {
        let rows = rows(step);
        let s = shape(2, None);
        let plan = Plan::new(&rows, |_| 16, s);
        let mut at = 0;
        for u in &plan.units {
            assert_eq!(u.off, at);
            at += u.rows() * u.heads() * s.group * s.state;
        }
        assert_eq!(at, plan.partial_len);
    }
}

#[test]
fn threads_own_contiguous_shares_of_about_equal_work() {
    // One long decode row over 8 chunks, paged: one unit per chunk with every head.
    let rows = [(0usize, 8 * SPLIT_KEYS - 1)];
    let plan = Plan::new(&rows, |_| 16, shape(4, None));
    assert_eq!(plan.units.len(), 8);
    assert!(plan.units.iter().all(|u| u.heads() == 3));
    assert_eq!(plan.threads(), 4);
    assert!(
        (0..4).all(|t| plan.owned(t).len() == 2),
        "{:?}",
        plan.bounds
    );
    // Over one contiguous run (pages of a chunk or more) one unit per head and chunk.
    let plan = Plan::new(&rows, |_| 8 * SPLIT_KEYS, shape(4, None));
    assert_eq!(plan.units.len(), 24);
    // Never more threads than units.
    let plan = Plan::new(&[(0, 3)], |_| 16, shape(8, None));
    assert_eq!(plan.threads(), plan.units.len());
}

#[test]
fn a_decode_unit_asks_for_its_next_piece_then_for_the_next_units_first() {
    // Eight decode rows: each one unit with every head (many rows), on one thread.
    let rows = rows(&[(0, 999, 1), (1, 99, 1), (2, 5, 1), (3, 5, 1)]);
    let rows: Vec<_> = rows.iter().copied().cycle().take(8).collect();
    let plan = Plan::new(&rows, |_| 16, shape(1, None));
    assert_eq!(plan.units.len(), 8);
    let piece = HEADS_TOGETHER_KEYS;
    assert_eq!(
        plan.ahead(&rows, 0, 0, piece),
        Ahead {
            seq: 0,
            from: piece,
            to: 2 * piece
        }
    );
    // At row 0's last piece: row 1's first.
    assert_eq!(
        plan.ahead(&rows, 0, 0, 1000),
        Ahead {
            seq: 1,
            from: 0,
            to: 100
        }
    );
    // The last unit: nothing.
    let last = plan.units.len() - 1;
    let a = plan.ahead(&rows, 0, last, 6);
    assert_eq!(a.from, a.to);
}
