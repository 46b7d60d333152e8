//! Property tests of the paged cache through the interface a step uses (`KvSeq`:
//! reserve, write the planned slots, commit): random programs of new sequence (with
//! prefix reuse from the index, whole pages and partly matching ones), append, fork,
//! truncate and drop under a small pool. K/V are synthetic but, like a model's, a
//! function of the token prefix. After every step each live sequence reads back exactly
//! the K/V a contiguous `BasicCache` holds for the same tokens, and the page store's
//! invariants hold; when everything is dropped every page is free or cached.
//!
//! The same programs run a second way, as the GPU backend runs them: each step's rows
//! are written on a device (`Dev`, a second arena that follows the GPU pool's rules:
//! what a step reads and the device does not hold goes up first; pages recorded by
//! generation) and only recorded as held in the pool (`KvArena::hold`); some steps
//! read a table back (`KvArena::sync`, as a snapshot or the disk tier does). After
//! every step each live sequence's K/V, read where it is (the device for held slots,
//! which the device must hold at the page's generation), is the oracle's.

use folio::kv::{BasicCache, DevicePages, Fetch, KvArena, KvDtype, KvSeq, KvStorage, Logits};
use folio::kv::{PageState, PageTable, PagedKv};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};

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

/// A device's copy of the pool, as the GPU backend keeps it (`folio-gpu`'s `pool.rs`):
/// its own arena, and per page the host generation it holds and how many slots.
struct Dev {
    arena: Mutex<KvArena>,
    held: Mutex<Vec<(u64, usize)>>,
}

impl Dev {
    fn new(n_pages: usize, page_size: usize) -> Arc<Self> {
        Arc::new(Dev {
            arena: Mutex::new(KvArena::new(
                n_pages,
                LAYERS,
                page_size,
                KV_DIM,
                KV_DIM,
                KvDtype::F16,
            )),
            held: Mutex::new(vec![(0, 0); n_pages]),
        })
    }

    /// One step's rows of `st` on the device, as the GPU backend runs it: the slots it
    /// reads that the device does not hold go up from `host` (only those past the
    /// held ones where the generation matches), the rows are written here, held in
    /// `host`, and the pages recorded at their new generations.
    fn step(&self, host: &mut KvArena, st: &folio::SeqStep, all: &[u32]) {
        let ps = st.page_size;
        let mut held = self.held.lock().unwrap();
        let mut dev = self.arena.lock().unwrap();
        for (i, page) in st.pages.iter().enumerate() {
            let n = st.start.saturating_sub(i * ps).min(ps);
            let (g, slots) = held[page.0 as usize];
            let from = if g == host.generation(page.0) {
                slots
            } else {
                0
            };
            if n > from {
                assert!(
                    from > 0 || host.held_slots(page.0).is_empty(),
                    "page {} lost",
                    page.0
                );
                let mut bytes = Vec::new();
                for s in from..n {
                    bytes.clear();
                    host.read_slot(page.0, s, &mut bytes);
                    dev.write_slot(page.0, s, &bytes);
                }
                held[page.0 as usize] = (host.generation(page.0), n);
            }
        }
        let mut writes: Vec<(u32, usize, usize)> = Vec::new();
        for p in st.start..st.end() {
            let (page, slot) = st.slot(p);
            for l in 0..LAYERS {
                let (k, v) = kv_of(all, p, l);
                dev.write(page.0, l, slot, &k, &v);
            }
            match writes.last_mut() {
                Some(w) if w.0 == page.0 => w.2 = slot + 1,
                _ => writes.push((page.0, slot, slot + 1)),
            }
        }
        for (page, a, b) in writes {
            let (g, slots) = held[page as usize];
            let valid = if g == host.generation(page) { slots } else { 0 };
            host.hold(page, a..b);
            let slots = if a <= valid { valid.max(b) } else { valid };
            held[page as usize] = (host.generation(page), slots);
        }
    }

    /// The raw K and V of `slot` of `page`, layer `l`, as the device holds it.
    fn row(&self, page: u32, l: usize, slot: usize) -> [Vec<u16>; 2] {
        let dev = self.arena.lock().unwrap();
        let (k, v) = dev.run(page, l, slot);
        [k.raw()[..KV_DIM].to_vec(), v.raw()[..KV_DIM].to_vec()]
    }
}

impl DevicePages for Dev {
    fn fetch(&self, pages: &[Fetch], _dtype: KvDtype) -> Result<Vec<Vec<u8>>, String> {
        let held = self.held.lock().unwrap();
        let dev = self.arena.lock().unwrap();
        pages
            .iter()
            .map(|f| match held[f.page as usize] {
                (g, n) if g == f.generation => {
                    let mut out = Vec::new();
                    (f.slots.start..f.slots.end.min(n))
                        .for_each(|s| dev.read_slot(f.page, s, &mut out));
                    Ok(out)
                }
                (g, _) => Err(format!(
                    "page {}: generation {g}, not {}",
                    f.page, f.generation
                )),
            })
            .collect()
    }

    fn copy(&self, src: (u32, u64), dst: (u32, u64), n: usize) -> Result<bool, String> {
        let mut held = self.held.lock().unwrap();
        let (g, slots) = held[src.0 as usize];
        if g != src.1 || slots < n {
            return Ok(false);
        }
        self.arena.lock().unwrap().copy_slots(src.0, dst.0, n);
        held[dst.0 as usize] = (dst.1, n);
        Ok(true)
    }
}

/// Appends `new` tokens the way a forward step does: reserve, write every layer of
/// the planned slots (through the storage, or on `dev`), commit.
fn step<S: KvSeq<Storage = A>, A: KvStorage + AsArena>(
    c: &mut S,
    all: &[u32],
    new: usize,
    dev: Option<&Dev>,
) -> bool {
    let pos0 = all.len() - new;
    let Ok(batch) = c.reserve(&all[pos0..], Logits::None) else {
        return false;
    };
    let st = &batch.seqs[0];
    match dev.and_then(|d| c.storage().arena().map(|a| (d, a))) {
        Some((d, arena)) => d.step(arena, st, all),
        None => {
            for p in pos0..all.len() {
                for l in 0..LAYERS {
                    let (k, v) = kv_of(all, p, l);
                    let (page, slot) = st.slot(p);
                    c.storage().write(page.0, l, slot, &k, &v);
                }
            }
        }
    }
    c.commit().unwrap();
    true
}

/// The pool's arena behind a sequence's storage (the oracle has none).
trait AsArena {
    fn arena(&mut self) -> Option<&mut KvArena>;
}

impl AsArena for KvArena {
    fn arena(&mut self) -> Option<&mut KvArena> {
        Some(self)
    }
}

impl AsArena for BasicCache {
    fn arena(&mut self) -> Option<&mut KvArena> {
        None
    }
}

/// Every stored K and V row of a paged table, in position order: held slots as the
/// device holds them (which must be at the page's generation), the rest as the pool's.
fn paged_rows(kv: &mut PagedKv, t: &PageTable, dev: Option<&Dev>) -> Vec<Vec<u16>> {
    let (pages, ps) = (t.pages(), kv.page_size());
    let arena = kv.storage();
    let mut out = Vec::new();
    for p in 0..t.len() {
        let (page, slot) = (pages[p / ps].0, p % ps);
        for l in 0..LAYERS {
            match dev {
                Some(d) if arena.held_slots(page).contains(&slot) => {
                    let (g, n) = d.held.lock().unwrap()[page as usize];
                    assert!(
                        g == arena.generation(page) && slot < n,
                        "slot {slot} of page {page} is held, but the device has generation \
                         {g} ({n} slots), the pool {}",
                        arena.generation(page)
                    );
                    out.extend(d.row(page, l, slot));
                }
                _ => {
                    let (k, v) = arena.run(page, l, slot);
                    out.extend([k.raw()[..KV_DIM].to_vec(), v.raw()[..KV_DIM].to_vec()]);
                }
            }
        }
    }
    out
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
    /// A table's K/V read back from the device (a snapshot's file, the disk tier).
    Sync(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let toks = || prop::collection::vec(0u32..3, 1..10);
    prop_oneof![
        toks().prop_map(Op::New),
        (0usize..4, toks()).prop_map(|(c, t)| Op::Append(c, t)),
        (0usize..4).prop_map(Op::Fork),
        (0usize..4, 0usize..12).prop_map(|(c, n)| Op::Truncate(c, n)),
        (0usize..4).prop_map(Op::Drop),
        (0usize..4).prop_map(Op::Sync),
    ]
}

struct Live {
    table: PageTable,
    oracle: BasicCache,
    tokens: Vec<u32>,
}

fn oracle_for(tokens: &[u32]) -> BasicCache {
    let mut b = BasicCache::new(LAYERS, KV_DIM, 4096);
    assert!(step(&mut b, tokens, tokens.len(), None) || tokens.is_empty());
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
        run(page_size, n_pages, ops, false)?;
    }

    #[test]
    fn rows_held_on_a_device_read_back_the_oracle_kv(
        page_size in 1usize..5,
        n_pages in 3usize..16,
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(page_size, n_pages, ops, true)?;
    }
}

/// One program on a pool of `n_pages` pages of `page_size`, its rows written through
/// the pool's storage or (`on_device`) held on a device.
fn run(
    page_size: usize,
    n_pages: usize,
    ops: Vec<Op>,
    on_device: bool,
) -> Result<(), TestCaseError> {
    let mut kv = PagedKv::new(n_pages, page_size, LAYERS, KV_DIM, 4096, b"prop-model");
    let dev = on_device.then(|| Dev::new(n_pages, page_size));
    if let Some(d) = &dev {
        let device: Arc<dyn DevicePages> = d.clone();
        kv.storage().attach(&device).unwrap();
    }
    let dev = dev.as_deref();
    let mut live: Vec<Live> = Vec::new();
    for op in ops {
        match op {
            Op::New(prompt) => {
                let mut table = kv.new_table(None);
                let mut seq = kv.seq(&mut table);
                let kept = seq.reuse_prefix(&prompt);
                prop_assert!(kept < prompt.len());
                if step(&mut seq, &prompt, prompt.len() - kept, dev) {
                    live.push(Live {
                        table,
                        oracle: oracle_for(&prompt),
                        tokens: prompt,
                    });
                } else {
                    prop_assert_eq!(seq.len(), kept, "a failed step takes nothing");
                    kv.release(table).unwrap();
                }
            }
            Op::Append(c, more) if c < live.len() => {
                let l = &mut live[c];
                let mut all = l.tokens.clone();
                all.extend(&more);
                if step(&mut kv.seq(&mut l.table), &all, more.len(), dev) {
                    l.tokens = all;
                    l.oracle = oracle_for(&l.tokens);
                }
            }
            Op::Fork(c) if c < live.len() => {
                if let Ok(table) = kv.fork(&mut live[c].table) {
                    let tokens = live[c].tokens.clone();
                    live.push(Live {
                        table,
                        oracle: oracle_for(&tokens),
                        tokens,
                    });
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
            Op::Sync(c) if c < live.len() => {
                let pages: Vec<u32> = live[c].table.pages().iter().map(|p| p.0).collect();
                kv.storage().sync(&pages).unwrap();
                prop_assert!(pages.iter().all(|&p| kv.storage().held_slots(p).is_empty()));
            }
            _ => {}
        }
        for l in live.iter_mut() {
            prop_assert_eq!(kv.read_tokens(&l.table).unwrap(), l.tokens.clone());
            prop_assert!(
                paged_rows(&mut kv, &l.table, dev) == basic_rows(&l.oracle),
                "K/V differ from the oracle"
            );
        }
        let holders = folio::kv::holders(live.iter().map(|l| &l.table), n_pages);
        if let Err(e) = kv.check(&holders) {
            prop_assert!(false, "{}", e);
        }
    }
    for l in live.drain(..) {
        kv.release(l.table).unwrap();
    }
    prop_assert_eq!(
        kv.count(PageState::Free) + kv.count(PageState::Cached),
        n_pages
    );
    Ok(())
}
