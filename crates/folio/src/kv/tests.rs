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
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        prop::collection::vec(0u32..3, 0..12).prop_map(Op::New),
        (0usize..4, 0u32..3).prop_map(|(c, t)| Op::Append(c, t)),
        (0usize..4, 0u32..3).prop_map(|(c, t)| Op::Append(c, t)),
        (0usize..4).prop_map(Op::Fork),
        (0usize..4, 0usize..6).prop_map(|(c, n)| Op::Truncate(c, n)),
        (0usize..4).prop_map(Op::Drop),
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
                    let hit = store.attach_prefix(&mut t, &prompt).unwrap();
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
                    match store.truncate(&mut live[c].0, n) {
                        Ok(()) => { let l = live[c].1.len().saturating_sub(n); live[c].1.truncate(l); }
                        Err(KvError::OutOfPages { .. }) => prop_assert_eq!(live[c].0.content(), snapshot),
                        Err(e) => prop_assert!(false, "truncate: {e}"),
                    }
                }
                Op::Drop(c) if c < live.len() => {
                    let (t, _) = live.swap_remove(c);
                    store.release_table(t).unwrap();
                }
                _ => {}
            }
            for (t, want) in &live {
                prop_assert_eq!(&store.read_tokens(t).unwrap(), want);
                prop_assert_eq!(t.len(), want.len());
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
    assert_eq!(store.attach_prefix(&mut b, &prompt).unwrap(), 12);
    assert_eq!(&b.pages()[..3], &a.pages()[..3]);
    assert_eq!(store.num_shared(), 3);
    // Another tenant's chain shares nothing.
    let mut c = PageTable::new(Hasher128::root(b"m", 4, b"tenant-b"));
    assert_eq!(store.attach_prefix(&mut c, &prompt).unwrap(), 0);
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
