//! Property tests of the paged cache through the interface a step uses (`KvSeq`:
//! reserve, write the planned slots, commit): random programs of new sequence (with
//! prefix reuse from the index, whole pages and partly matching ones), append, fork,
//! truncate and drop under a small pool. K/V are synthetic but, like a model's, a
//! function of the token prefix. After every step each live sequence reads back exactly
//! the K/V a contiguous `BasicCache` holds for the same tokens, and the page store's
//! invariants hold; when everything is dropped every page is free or cached.

use folio::kv::{BasicCache, KvSeq, KvStorage, Logits};
use folio::kv::{PageState, PageTable, PagedKv};
use proptest::prelude::*;

const LAYERS: usize = 2;
const KV_DIM: usize = 4;

/// K/V of position `pos` given the tokens up to it (a function of the prefix).
fn kv_of(tokens: &[u32], pos: usize, layer: usize) -> ([f32; KV_DIM], [f32; KV_DIM]) {
    let h = tokens[..=pos]
        .iter()
        .fold(7u32, |h, &t| h.wrapping_mul(31).wrapping_add(t))
        % 1000;
    let k = [tokens[pos] as f32, pos as f32, h as f32, layer as f32];
    let v = [
        h as f32 * 0.5,
        tokens[pos] as f32 + 0.25,
        -(pos as f32),
        1.0,
    ];
    (k, v)
}

/// Appends `new` tokens the way a forward step does: reserve, write every layer of
/// the planned slots, commit.
fn step<S: KvSeq>(c: &mut S, all: &[u32], new: usize) -> bool {
    let pos0 = all.len() - new;
    let Ok(batch) = c.reserve(&all[pos0..], Logits::None) else {
        return false;
    };
    let st = &batch.seqs[0];
    for p in pos0..all.len() {
        for l in 0..LAYERS {
            let (k, v) = kv_of(all, p, l);
            let (page, slot) = st.slot(p);
            c.storage().write(page.0, l, slot, &k, &v);
        }
    }
    c.commit().unwrap();
    true
}

/// Every stored K and V row of a paged table, in position order.
fn paged_rows(kv: &mut PagedKv, t: &PageTable) -> Vec<Vec<u16>> {
    let (pages, ps) = (t.pages(), kv.page_size());
    let arena = kv.storage();
    (0..t.len())
        .flat_map(|p| (0..LAYERS).map(move |l| (p, l)))
        .flat_map(|(p, l)| {
            let (k, v) = arena.run(pages[p / ps].0, l, p % ps);
            [k.raw()[..KV_DIM].to_vec(), v.raw()[..KV_DIM].to_vec()]
        })
        .collect()
}

/// The same rows of the contiguous oracle.
fn basic_rows(b: &BasicCache) -> Vec<Vec<u16>> {
    (0..b.len())
        .flat_map(|p| (0..LAYERS).map(move |l| (p, l)))
        .flat_map(|(p, l)| [b.k_row(l, p).to_vec(), b.v_row(l, p).to_vec()])
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    New(Vec<u32>),
    Append(usize, Vec<u32>),
    Fork(usize),
    Truncate(usize, usize),
    Drop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let toks = || prop::collection::vec(0u32..3, 1..10);
    prop_oneof![
        toks().prop_map(Op::New),
        (0usize..4, toks()).prop_map(|(c, t)| Op::Append(c, t)),
        (0usize..4).prop_map(Op::Fork),
        (0usize..4, 0usize..12).prop_map(|(c, n)| Op::Truncate(c, n)),
        (0usize..4).prop_map(Op::Drop),
    ]
}

struct Live {
    table: PageTable,
    oracle: BasicCache,
    tokens: Vec<u32>,
}

fn oracle_for(tokens: &[u32]) -> BasicCache {
    let mut b = BasicCache::new(LAYERS, KV_DIM, 4096);
    assert!(step(&mut b, tokens, tokens.len()) || tokens.is_empty());
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]
    #[test]
    fn paged_sequences_read_back_the_oracle_kv(
        page_size in 1usize..5,
        n_pages in 3usize..16,
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut kv = PagedKv::new(n_pages, page_size, LAYERS, KV_DIM, 4096, b"prop-model");
        let mut live: Vec<Live> = Vec::new();
        for op in ops {
            match op {
                Op::New(prompt) => {
                    let mut table = kv.new_table(None);
                    let mut seq = kv.seq(&mut table);
                    let kept = seq.reuse_prefix(&prompt);
                    prop_assert!(kept < prompt.len());
                    if step(&mut seq, &prompt, prompt.len() - kept) {
                        live.push(Live { table, oracle: oracle_for(&prompt), tokens: prompt });
                    } else {
                        prop_assert_eq!(seq.len(), kept, "a failed step takes nothing");
                        kv.release(table).unwrap();
                    }
                }
                Op::Append(c, more) if c < live.len() => {
                    let l = &mut live[c];
                    let mut all = l.tokens.clone();
                    all.extend(&more);
                    if step(&mut kv.seq(&mut l.table), &all, more.len()) {
                        l.tokens = all;
                        l.oracle = oracle_for(&l.tokens);
                    }
                }
                Op::Fork(c) if c < live.len() => {
                    if let Ok(table) = kv.fork(&mut live[c].table) {
                        let tokens = live[c].tokens.clone();
                        live.push(Live { table, oracle: oracle_for(&tokens), tokens });
                    }
                }
                Op::Truncate(c, n) if c < live.len() => {
                    let l = &mut live[c];
                    let keep = l.tokens.len().saturating_sub(n);
                    kv.seq(&mut l.table).truncate(keep);
                    // Without a page for a copy-on-write the cut falls back to a page boundary.
                    let now = kv.seq(&mut l.table).len();
                    prop_assert!(now <= keep && now + page_size > keep);
                    l.tokens.truncate(now);
                    l.oracle.truncate(now);
                }
                Op::Drop(c) if c < live.len() => {
                    let l = live.swap_remove(c);
                    kv.release(l.table).unwrap();
                }
                _ => {}
            }
            for l in live.iter_mut() {
                prop_assert_eq!(kv.read_tokens(&l.table).unwrap(), l.tokens.clone());
                prop_assert!(paged_rows(&mut kv, &l.table) == basic_rows(&l.oracle), "K/V differ from the oracle");
            }
            let holders = folio::kv::holders(live.iter().map(|l| &l.table), n_pages);
            if let Err(e) = kv.check(&holders) { prop_assert!(false, "{}", e); }
        }
        for l in live.drain(..) {
            kv.release(l.table).unwrap();
        }
        prop_assert_eq!(kv.count(PageState::Free) + kv.count(PageState::Cached), n_pages);
    }
}
