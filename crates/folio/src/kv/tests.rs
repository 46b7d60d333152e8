//! Property tests: random programs of sequence operations under a small pool, against a
//! plain token-list oracle. After every step each live table reads back exactly the
//! oracle's tokens, refcounts equal the number of holders, and no page is both free and
//! held; when everything is dropped every page is free or cached.

use super::store::PageStore;
use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    New(Vec<u32>),
    Append(usize, u32),
    Fork(usize),
    Truncate(usize, usize),
    Drop(usize),
    /// Forget the pages wholly before position `len - n` (a sliding window of `n`).
    Forget(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        prop::collection::vec(0u32..3, 0..12).prop_map(Op::New),
        (0usize..4, 0u32..3).prop_map(|(c, t)| Op::Append(c, t)),
        (0usize..4, 0u32..3).prop_map(|(c, t)| Op::Append(c, t)),
        (0usize..4).prop_map(Op::Fork),
        (0usize..4, 0usize..6).prop_map(|(c, n)| Op::Truncate(c, n)),
        (0usize..4).prop_map(Op::Drop),
        (0usize..4, 0usize..8).prop_map(|(c, n)| Op::Forget(c, n)),
    ]
}

fn holders(store: &PageStore, tables: &[(PageTable, Vec<u32>)]) -> Vec<u32> {
    super::holders(tables.iter().map(|(t, _)| t), store.num_pages())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]
    #[test]
    fn paged_tables_match_the_oracle(
        page_size in 1usize..5,
        n_pages in 2usize..14,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut store = PageStore::new(n_pages, page_size);
        let root = Hasher128::root(b"prop", page_size, b"");
        let mut live: Vec<(PageTable, Vec<u32>)> = Vec::new();
        for op in ops {
            let before = store.num_available();
            match op {
                Op::New(prompt) => {
                    let mut t = PageTable::new(root);
                    let hit = store.attach_indexed(&mut t, &prompt).unwrap();
                    prop_assert_eq!(hit % page_size, 0);
                    let mut ok = true;
                    for &tok in &prompt[hit..] {
                        if store.append(&mut t, tok).is_err() { ok = false; break; }
                    }
                    if ok {
                        live.push((t, prompt));
                    } else {
                        store.release_table(t).unwrap();
                    }
                }
                Op::Append(c, tok) if c < live.len() => {
                    let snapshot = live[c].0.content();
                    match store.append(&mut live[c].0, tok) {
                        Ok(()) => live[c].1.push(tok),
                        Err(KvError::OutOfPages { .. }) => {
                            prop_assert_eq!(live[c].0.content(), snapshot.clone());
                            prop_assert_eq!(before, 0);
                        }
                        Err(e) => prop_assert!(false, "append: {e}"),
                    }
                }
                Op::Fork(c) if c < live.len() => {
                    if let Ok(f) = store.fork(&mut live[c].0) {
                        let toks = live[c].1.clone();
                        live.push((f, toks));
                    }
                }
                Op::Truncate(c, n) if c < live.len() => {
                    let snapshot = live[c].0.content();
                    let full = live[c].1.len().saturating_sub(n) / page_size;
                    match store.truncate(&mut live[c].0, n) {
                        Ok(()) => {
                            prop_assert!(full >= live[c].0.held_from());
                            let l = live[c].1.len().saturating_sub(n);
                            live[c].1.truncate(l);
                        }
                        Err(KvError::OutOfPages { .. }) => prop_assert_eq!(live[c].0.content(), snapshot),
                        Err(KvError::Forgotten { .. }) => {
                            prop_assert!(live[c].0.held_from() > 0);
                            prop_assert_eq!(live[c].0.content(), snapshot);
                        }
                        Err(e) => prop_assert!(false, "truncate: {e}"),
                    }
                }
                Op::Forget(c, n) if c < live.len() => {
                    let t = &mut live[c].0;
                    let pos = t.len().saturating_sub(n);
                    let (before_from, se) = (t.held_from(), t.shared_end());
                    let held_before: Vec<bool> = (0..t.num_pages()).map(|i| t.holds(i)).collect();
                    let released = store.forget(t, pos).unwrap();
                    // Exactly the own committed pages wholly before `pos` not yet forgotten.
                    let target = (pos / page_size).min(t.num_committed());
                    prop_assert_eq!(released, target.saturating_sub(before_from.max(se)));
                    for (i, &was) in held_before.iter().enumerate() {
                        let gone = i >= se.max(before_from) && i < target;
                        prop_assert_eq!(t.holds(i), was && !gone, "page {}", i);
                    }
                }
                Op::Drop(c) if c < live.len() => {
                    let (t, _) = live.swap_remove(c);
                    store.release_table(t).unwrap();
                }
                _ => {}
            }
            for (t, want) in &live {
                prop_assert_eq!(t.len(), want.len());
                if t.held_from() == 0 {
                    prop_assert_eq!(&store.read_tokens(t).unwrap(), want);
                } else {
                    let forgotten = matches!(store.read_tokens(t), Err(KvError::Forgotten { .. }));
                    prop_assert!(forgotten);
                }
                // Every page still held holds the oracle's tokens.
                for i in (0..t.num_pages()).filter(|&i| t.holds(i)) {
                    let end = ((i + 1) * page_size).min(want.len());
                    prop_assert_eq!(store.tokens(t.page(i)).unwrap(), &want[i * page_size..end]);
                }
                prop_assert!((t.held_from()..t.num_pages()).all(|i| t.holds(i)));
            }
            let h = holders(&store, &live);
            if let Err(e) = store.check(&h) { prop_assert!(false, "{}", e); }
        }
        for (t, _) in live.drain(..) {
            store.release_table(t).unwrap();
        }
        prop_assert_eq!(store.count(PageState::Free) + store.count(PageState::Cached), n_pages);
        if let Err(e) = store.check(&vec![0; n_pages]) { prop_assert!(false, "{}", e); }
    }
}

#[test]
fn a_second_prompt_reuses_the_first_ones_pages() {
    let mut store = PageStore::new(16, 4);
    let root = Hasher128::root(b"m", 4, b"");
    let prompt: Vec<u32> = (0..14).collect();
    let mut a = PageTable::new(root);
    for &t in &prompt {
        store.append(&mut a, t).unwrap();
    }
    let mut b = PageTable::new(root);
    assert_eq!(store.attach_indexed(&mut b, &prompt).unwrap(), 12);
    assert_eq!(&b.pages()[..3], &a.pages()[..3]);
    assert_eq!(store.num_shared(), 3);
    // Another tenant's chain shares nothing.
    let mut c = PageTable::new(Hasher128::root(b"m", 4, b"tenant-b"));
    assert_eq!(store.attach_indexed(&mut c, &prompt).unwrap(), 0);
}

#[test]
fn truncate_across_a_committed_page_copies_instead_of_mutating() {
    let mut store = PageStore::new(8, 4);
    let root = Hasher128::root(b"m", 4, b"");
    let mut a = PageTable::new(root);
    for t in 0..8 {
        store.append(&mut a, t).unwrap();
    }
    let mut b = store.fork(&mut a).unwrap();
    let shared = b.pages()[1];
    store.truncate(&mut b, 3).unwrap();
    assert_eq!(store.read_tokens(&b).unwrap(), vec![0, 1, 2, 3, 4]);
    assert_ne!(
        b.pages()[1],
        shared,
        "the committed page was copied, not cut"
    );
    assert_eq!(store.tokens(shared).unwrap(), &[4, 5, 6, 7]);
    assert_eq!(store.read_tokens(&a).unwrap(), (0..8).collect::<Vec<_>>());
}

#[test]
fn fork_takes_no_reference_per_committed_page() {
    let mut store = PageStore::new(80, 4);
    let root = Hasher128::root(b"m", 4, b"");
    let mut a = PageTable::new(root);
    for t in 0..258u32 {
        store.append(&mut a, t).unwrap();
    }
    // 64 committed pages and a partial one: a fork copies only the partial page.
    let before = store.num_free();
    let mut b = store.fork(&mut a).unwrap();
    let mut c = store.fork(&mut b).unwrap();
    assert_eq!(store.num_free(), before - 2);
    for &p in &a.pages()[..64] {
        assert_eq!(
            store.refcount(p).unwrap(),
            1,
            "held once, by the fork group"
        );
    }
    let all = [&a, &b, &c];
    store.check(&super::holders(all, 80)).unwrap();
    assert_eq!(super::shared_pages(all, 80), 64);
    // A child rolls back into the shared pages; the others keep theirs.
    store.truncate(&mut c, 200).unwrap();
    assert_eq!(store.read_tokens(&c).unwrap(), (0..58).collect::<Vec<_>>());
    store.append(&mut c, 999).unwrap();
    store.check(&super::holders([&a, &b, &c], 80)).unwrap();
    assert_eq!(store.read_tokens(&a).unwrap(), (0..258).collect::<Vec<_>>());
    // Dropping the original first, then the rest, frees everything.
    store.release_table(a).unwrap();
    store.check(&super::holders([&b, &c], 80)).unwrap();
    assert_eq!(store.read_tokens(&b).unwrap(), (0..258).collect::<Vec<_>>());
    store.release_table(b).unwrap();
    store.release_table(c).unwrap();
    store.check(&[0; 80]).unwrap();
    assert_eq!(
        store.count(PageState::Free) + store.count(PageState::Cached),
        80
    );
}

#[test]
fn forgetting_releases_the_pages_before_the_window_and_forks_skip_them() {
    let mut store = PageStore::new(12, 2);
    let root = Hasher128::root(b"m", 2, b"");
    let mut a = PageTable::new(root);
    for t in 0..9u32 {
        store.append(&mut a, t).unwrap();
    }
    let pages = a.pages();
    // Pages 0..4 hold tokens 0..8 (committed), page 4 holds token 8.
    // Position 5: pages 0 and 1 lie wholly before it; page 2 holds token 5.
    assert_eq!(store.forget(&mut a, 5).unwrap(), 2);
    assert_eq!(a.held_from(), 2);
    assert_eq!(
        store.lru_order(),
        vec![pages[0], pages[1]],
        "cached, not freed"
    );
    assert_eq!(store.refcount(pages[2]).unwrap(), 1);
    store.check(&super::holders([&a], 12)).unwrap();
    // Forgetting again up to the same place releases nothing (no double release).
    assert_eq!(store.forget(&mut a, 5).unwrap(), 0);
    assert_eq!(store.forget(&mut a, 3).unwrap(), 0);
    store.check(&super::holders([&a], 12)).unwrap();
    assert_eq!(
        store.read_tokens(&a),
        Err(KvError::Forgotten {
            pages: 2,
            needed: "reading its tokens back"
        })
    );
    // A fork takes no reference on the forgotten pages.
    let mut b = store.fork(&mut a).unwrap();
    assert_eq!(a.shared_end(), 4);
    assert_eq!((a.holds(1), a.holds(2), b.holds(1)), (false, true, false));
    store.check(&super::holders([&a, &b], 12)).unwrap();
    // The child forgets nothing more of the shared pages: they are the group's.
    assert_eq!(store.forget(&mut b, 9).unwrap(), 0);
    // Truncating into the forgotten pages is refused, and changes nothing.
    let before = b.content();
    assert!(matches!(
        store.truncate(&mut b, 6),
        Err(KvError::Forgotten { pages: 2, .. })
    ));
    assert_eq!(b.content(), before);
    // Behind the fork point the group would have to be split at its gap: refused too.
    assert!(matches!(
        store.truncate(&mut b, 3),
        Err(KvError::Forgotten {
            needed: "truncating behind the fork point",
            ..
        })
    ));
    assert_eq!(b.content(), before);
    // Truncating the table's own pages works.
    store.truncate(&mut b, 1).unwrap();
    assert_eq!(b.len(), 8);
    store.check(&super::holders([&a, &b], 12)).unwrap();
    // Evicting the forgotten pages (another sequence reuses them) harms no table.
    let other = store.reserve_n(store.num_available()).unwrap();
    assert!(other.contains(&pages[0]) && other.contains(&pages[1]));
    for p in other {
        store.release(p).unwrap();
    }
    store.release_table(a).unwrap();
    store.check(&super::holders([&b], 12)).unwrap();
    store.release_table(b).unwrap();
    store.check(&[0; 12]).unwrap();
    assert_eq!(
        store.count(PageState::Free) + store.count(PageState::Cached),
        12
    );
}
