//! The batched forward step over many sequences: a sequence's logits are the same bits
//! alone or in any batch, prefilled whole or in chunks, cold or from the prefix cache,
//! at any page size and thread count, on every kernel path the CPU runs (AVX-VNNI's
//! through AVX2's, whose bits it gives: see `paths`); paged attention equals
//! dense-gather attention.

use crate::common;

use crate::common::{forward_tables, ModelExt};
use folio::gguf::GgmlType;
use folio::internals::{f16_to_f32, f32_to_f16, isa, runnable_isas, Cpu, Isa};
use folio::kv::{
    BasicCache, Batch, KvDtype, KvPair, KvRows, KvSeq, KvStorage, Logits, PageId, PageTable,
    PagedKv, SeqStep,
};
use folio::model::{
    attention, AttentionStep, Heads, Model, Scores, StepError, StepLogits, ROW_BLOCK, SPLIT_KEYS,
};
use folio::rng::SplitMix64;

fn tiny(threads: usize, isa: Isa) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    folio::tiny::write_model(&path, 5, GgmlType::Q4_1).unwrap();
    let m = Model::load(&path, threads).unwrap().with_isa(isa);
    (dir, m)
}

/// Every kernel path the CPU runs but AVX-VNNI's; those it lacks are named (skipped,
/// not silent). The AVX-VNNI path runs the AVX2 path's attention and layouts, and its
/// matmuls give the AVX2 path's bits for every format, a row alone or in a batch
/// (`kernels::tests_vnni`), as a whole forward pass does, prefill and decode, over f16
/// and 8-bit K/V (`model::tests_avxvnni`; both natively or under the SIGILL emulator):
/// what holds here on AVX2 holds on it bit for bit, so these model-sized runs leave it
/// out.
fn paths() -> Vec<Isa> {
    let run = runnable_isas();
    for missing in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
        .into_iter()
        .filter(|i| !run.contains(i))
    {
        eprintln!("skipped: this CPU does not run the {missing} kernels");
    }
    if run.contains(&Isa::AvxVnni) && run.contains(&Isa::Avx2) {
        eprintln!("left out: the avxvnni path, which gives the avx2 path's bits");
        return run.into_iter().filter(|&i| i != Isa::AvxVnni).collect();
    }
    run
}

/// The 8-bit K/V variants run on the scalar path and the machine's own one only: the
/// f16 tests above already cover every ISA's matmuls (AVX-VNNI's through AVX2's: see
/// [`paths`]), and the 8-bit attention kernels' SIMD forms are held to their scalar
/// twins on random data in `kernels::tests`.
fn q8_paths(scalar: bool) -> Vec<Isa> {
    let best = isa();
    let mut out = vec![best];
    if scalar && best != Isa::Scalar {
        out.insert(0, Isa::Scalar);
    }
    out
}

/// `n` token lists; some share long prefixes with earlier ones.
fn workload(rng: &mut SplitMix64, vocab: usize, n: usize, max_len: usize) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    for _ in 0..n {
        let len = 2 + rng.below(max_len as u64 - 2) as usize;
        let mut t: Vec<u32> = match out.last() {
            Some(prev) if rng.below(2) == 0 => prev[..prev.len().min(len) * 3 / 4].to_vec(),
            _ => Vec::new(),
        };
        while t.len() < len {
            t.push(rng.below(vocab as u64) as u32);
        }
        out.push(t);
    }
    out
}

/// Every position's logits of each sequence, run alone in one pass on a contiguous cache
/// of `dtype`.
fn alone(m: &Model, seqs: &[Vec<u32>], dtype: KvDtype) -> Vec<Vec<f32>> {
    seqs.iter()
        .map(|t| {
            let mut c = m.new_cache_as(dtype, t.len());
            m.run(&mut c, t, Logits::All).unwrap()
        })
        .collect()
}

/// Runs all sequences through random batched steps (random subsets, random chunk
/// lengths, decode-sized and prefill-sized mixed) on one paged pool and checks every
/// returned row against `want`. With `warm`, each sequence first attaches whatever
/// prefix the pool has indexed. The pool stores `dtype`.
fn batched(
    m: &Model,
    (seqs, want): (&[Vec<u32>], &[Vec<f32>]),
    dtype: KvDtype,
    page_size: usize,
    warm: bool,
    rng: &mut SplitMix64,
) -> usize {
    let v = m.config.vocab;
    let mut kv = m.new_paged_as(dtype, 4096, page_size, 4096);
    let mut tables: Vec<PageTable> = seqs.iter().map(|_| kv.new_table(None)).collect();
    let mut hits = 0;
    let mut started = vec![false; seqs.len()];
    loop {
        let mut chosen = Vec::new();
        for (i, (t, s)) in tables.iter_mut().zip(seqs).enumerate() {
            if s.len() > t.len() && rng.below(3) > 0 {
                if warm && !started[i] {
                    // Attach what the pool indexed from the sequences run so far.
                    hits += kv.seq(t).reuse_prefix(s);
                }
                started[i] = true;
                let left = s.len() - t.len();
                let n = if rng.below(2) == 0 {
                    1
                } else {
                    1 + rng.below(left as u64) as usize
                };
                chosen.push((i, t.len(), n.min(left)));
            }
        }
        if chosen.is_empty() {
            if tables.iter().zip(seqs).all(|(t, s)| t.len() == s.len()) {
                break;
            }
            continue;
        }
        let steps: Vec<(&[u32], Logits)> = chosen
            .iter()
            .map(|&(i, at, n)| (&seqs[i][at..at + n], Logits::All))
            .collect();
        let mut picked: Vec<&mut PageTable> = tables
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| chosen.iter().any(|c| c.0 == *i))
            .map(|(_, t)| t)
            .collect();
        let out = forward_tables(m, &mut kv, &mut picked, &steps).unwrap();
        for (&(i, at, n), got) in chosen.iter().zip(&out) {
            assert!(
                got[..] == want[i][at * v..(at + n) * v],
                "{} {dtype}: sequence {i}, positions {at}..{}, page size {page_size}, warm {warm}",
                m.isa(),
                at + n
            );
        }
    }
    hits
}

#[test]
fn batched_logits_equal_single_sequence_runs_bit_for_bit() {
    for isa in paths() {
        batched_equals_alone_on(isa, KvDtype::F16);
    }
}

/// The same over 8-bit K/V (`--kv-dtype q8_0`).
#[test]
fn batched_logits_equal_single_sequence_runs_bit_for_bit_over_q8_kv() {
    for isa in q8_paths(true) {
        batched_equals_alone_on(isa, KvDtype::Q8);
    }
}

fn batched_equals_alone_on(isa: Isa, dtype: KvDtype) {
    let (_d1, one) = tiny(1, isa);
    let (_d2, two) = tiny(2, isa);
    let mut rng = SplitMix64(77);
    let mut warm_hits = 0;
    for case in 0..6 {
        let seqs = workload(&mut rng, one.config.vocab, 7, 120);
        // The oracle: alone, contiguous cache, one thread.
        let want = alone(&one, &seqs, dtype);
        for &ps in &[1usize, 3, 16] {
            let cold = batched(&two, (&seqs, &want), dtype, ps, false, &mut rng);
            assert_eq!(cold, 0);
            warm_hits += batched(&two, (&seqs, &want), dtype, ps, true, &mut rng);
        }
        // Warm: the second pass over the same pool finds the first pass's pages.
        let mut kv = two.new_paged_as(dtype, 4096, 16, 4096);
        let mut first = kv.new_table(None);
        two.run(&mut kv.seq(&mut first), &seqs[0], Logits::All)
            .unwrap();
        let mut t = kv.new_table(None);
        let hit = kv.seq(&mut t).reuse_prefix(&seqs[0]);
        assert!(
            hit >= (seqs[0].len() - 1) / 16 * 16,
            "case {case}: hit {hit}"
        );
        let rest = &seqs[0][hit..];
        let got = two.run(&mut kv.seq(&mut t), rest, Logits::All).unwrap();
        assert!(
            got[..] == want[0][hit * two.config.vocab..],
            "{isa} {dtype}, case {case}: warm"
        );
    }
    assert!(warm_hits > 0, "the warm runs found no prefix");
}

#[test]
fn the_default_model_batched_equals_alone_including_split_k() {
    // The scalar path is covered on the tiny model above (the default one is slow there).
    for isa in paths().into_iter().filter(|&i| i != Isa::Scalar) {
        default_model_batched_equals_alone_on(isa, KvDtype::F16);
    }
}

/// The same over 8-bit K/V (`--kv-dtype q8_0`).
#[test]
fn the_default_model_batched_equals_alone_including_split_k_over_q8_kv() {
    for isa in q8_paths(false) {
        default_model_batched_equals_alone_on(isa, KvDtype::Q8);
    }
}

fn default_model_batched_equals_alone_on(isa: Isa, dtype: KvDtype) {
    let m = Model::load(&common::model_path(), 2).unwrap().with_isa(isa);
    let mut rng = SplitMix64(3);
    let v = m.config.vocab;
    // One sequence long enough for split-K attention (more than SPLIT_KEYS keys).
    let mut seqs = workload(&mut rng, v, 4, 60);
    seqs.push(
        (0..SPLIT_KEYS + 40)
            .map(|i| (i * 7919 % v) as u32)
            .collect(),
    );
    let mut kv = m.new_paged_as(dtype, 2048, 16, 4096);
    let mut tables: Vec<PageTable> = seqs.iter().map(|_| kv.new_table(None)).collect();
    // Prefill everything but the last token in one batch, then decode the last tokens
    // together, and compare the last rows with each sequence alone.
    let steps: Vec<(&[u32], Logits)> = seqs
        .iter()
        .map(|s| (&s[..s.len() - 1], Logits::Last))
        .collect();
    let mut refs: Vec<&mut PageTable> = tables.iter_mut().collect();
    forward_tables(&m, &mut kv, &mut refs, &steps).unwrap();
    let steps: Vec<(&[u32], Logits)> = seqs
        .iter()
        .map(|s| (&s[s.len() - 1..], Logits::Last))
        .collect();
    let got = forward_tables(&m, &mut kv, &mut refs, &steps).unwrap();
    for (i, s) in seqs.iter().enumerate() {
        let mut c = m.new_cache_as(dtype, s.len());
        let want = m.run(&mut c, s, Logits::Last).unwrap();
        assert!(
            got[i] == want,
            "{isa} {dtype}: sequence {i} ({} tokens)",
            s.len()
        );
    }
}

#[test]
fn a_long_prompt_gives_the_same_bits_whole_chunked_or_block_by_block() {
    // The scalar path is covered on the tiny model (the default one is slow there).
    for isa in paths().into_iter().filter(|&i| i != Isa::Scalar) {
        long_prompt_invariance_on(isa, KvDtype::F16);
    }
}

/// The same over 8-bit K/V (`--kv-dtype q8_0`).
#[test]
fn a_long_prompt_gives_the_same_bits_whole_chunked_or_block_by_block_over_q8_kv() {
    for isa in q8_paths(false) {
        long_prompt_invariance_on(isa, KvDtype::Q8);
    }
}

/// A prompt over two split-K boundaries, prefilled whole (contiguous cache), in chunks
/// of odd sizes beside another sequence (pages of 16), and one row block at a time
/// (pages of 7, chunks of ROW_BLOCK rows that start mid-block): the last token's logits
/// must be the same bits (each depends on every row's attention through the K/V).
fn long_prompt_invariance_on(isa: Isa, dtype: KvDtype) {
    let m = Model::load(&common::model_path(), 2).unwrap().with_isa(isa);
    let v = m.config.vocab;
    let n = 2 * SPLIT_KEYS + 60;
    let prompt: Vec<u32> = (0..n).map(|i| (i * 7919 % v) as u32).collect();
    let mut c = m.new_cache_as(dtype, n);
    let want = m.run(&mut c, &prompt, Logits::Last).unwrap();
    // Chunks of odd sizes, batched with a short sequence that decodes beside them.
    let mut kv = m.new_paged_as(dtype, 2 * n.div_ceil(16) + 16, 16, 4096);
    let (mut a, mut b) = (kv.new_table(None), kv.new_table(None));
    let other: Vec<u32> = (0..n).map(|i| (i * 31 % v) as u32).collect();
    let mut at = 0;
    let mut got = Vec::new();
    for (i, size) in [700, 13, 1, 350, 16, 17].into_iter().cycle().enumerate() {
        let end = (at + size).min(n);
        let want_logits = if end == n { Logits::Last } else { Logits::None };
        let steps: Vec<(&[u32], Logits)> = vec![
            (&prompt[at..end], want_logits),
            (&other[i..i + 1], Logits::Last),
        ];
        let out = forward_tables(&m, &mut kv, &mut [&mut a, &mut b], &steps).unwrap();
        at = end;
        if at == n {
            got = out[0].clone();
            break;
        }
    }
    assert!(
        got == want,
        "{isa} {dtype}: {n} tokens in chunks of odd sizes"
    );
    // One row block per step, the blocks offset from the step's start.
    let mut kv = m.new_paged_as(dtype, n.div_ceil(7) + 4, 7, 4096);
    let mut t = kv.new_table(None);
    let mut at = 0;
    while at < n {
        let end = (at + if at == 0 { 5 } else { ROW_BLOCK }).min(n);
        let want_logits = if end == n { Logits::Last } else { Logits::None };
        let out = forward_tables(
            &m,
            &mut kv,
            &mut [&mut t],
            &[(&prompt[at..end], want_logits)],
        )
        .unwrap();
        if end == n {
            assert!(
                out[0] == want,
                "{isa} {dtype}: {n} tokens one row block at a time"
            );
        }
        at = end;
    }
}

/// A pool with `seqs` sequences of random K/V written into deliberately scattered pages.
fn scattered(
    lens: &[usize],
    kv_dim: usize,
    ps: usize,
    rng: &mut SplitMix64,
) -> (PagedKv, Vec<PageTable>) {
    let pages: usize = lens.iter().map(|l| l.div_ceil(ps)).sum::<usize>() * 2 + 4;
    let mut kv = PagedKv::new(pages, ps, 1, kv_dim, 1 << 20, b"test");
    // Interleave the sequences token by token so their pages alternate in the pool.
    let mut tables: Vec<PageTable> = lens.iter().map(|_| kv.new_table(None)).collect();
    let max = *lens.iter().max().unwrap();
    for p in 0..max {
        for (t, &len) in tables.iter_mut().zip(lens) {
            if p < len {
                let step = kv.plan(t, &[rng.below(1000) as u32], Logits::None).unwrap();
                let k: Vec<f32> = (0..kv_dim).map(|_| rng.signed_f32() * 2.0).collect();
                let v: Vec<f32> = (0..kv_dim).map(|_| rng.signed_f32() * 3.0).collect();
                let (page, slot) = step.slot(p);
                kv.storage().write(page.0, 0, slot, &k, &v);
                kv.commit(t).unwrap();
            }
        }
    }
    (kv, tables)
}

#[test]
fn paged_attention_equals_dense_gather_attention() {
    let heads = Heads {
        n_heads: 6,
        n_kv_heads: 2,
        head_dim: 64,
    };
    let (d, kvd) = (6 * 64, 2 * 64);
    let mut rng = SplitMix64(9);
    let lens = [1, 37, 300, SPLIT_KEYS + 1, 2 * SPLIT_KEYS + 77];
    for ps in [1, 16, 64] {
        let (mut kv, mut tables) = scattered(&lens, kvd, ps, &mut rng);
        // Gather: each sequence copied into a contiguous cache.
        let mut dense = Dense(Vec::new());
        for t in tables.iter_mut() {
            let len = t.len();
            let mut c = BasicCache::new(1, kvd, len);
            let toks = kv.read_tokens(t).unwrap();
            let plan = c.reserve(&toks, Logits::None).unwrap();
            let view = view_of(t, ps);
            for p in 0..len {
                let (page, slot) = view.slot(p);
                let (k, v) = kv.storage().run(page.0, 0, slot);
                let (k, v) = (halves(k, kvd), halves(v, kvd));
                c.write(0, 0, plan.seqs[0].slot(p).1, &k, &v);
            }
            c.commit().unwrap();
            dense.0.push(c);
        }
        // Queries: for each sequence its last position and a few earlier ones.
        let mut rows = Vec::new();
        for (s, &len) in lens.iter().enumerate() {
            for pos in [len - 1, len / 2, 0] {
                rows.push((s, pos));
            }
        }
        let q: Vec<f32> = (0..rows.len() * d)
            .map(|_| rng.signed_f32() * 3.0)
            .collect();
        let mut out = Vec::new();
        // 7: more threads than this 2-core machine has (tasks claimed by fewer threads).
        // Over pages, one thread runs a decode row's KV heads together in each unit,
        // seven one head per unit (fewer chunks than threads), as the dense cache always
        // does: the same bits.
        for threads in [1, 2, 7] {
            let cpu = Cpu::new(threads).unwrap();
            let batch = Batch {
                seqs: tables.iter().map(|t| view_of(t, ps)).collect(),
            };
            let at = |kv: &'_ dyn KvStorage, batch: &'_ Batch| -> Vec<f32> {
                let step = AttentionStep {
                    heads,
                    scores: Scores::plain(heads.head_dim),
                    kv,
                    batch,
                    layer: 0,
                    rows: &rows,
                };
                let mut out = vec![0f32; q.len()];
                attention(&cpu, &step, &q, &mut out);
                out
            };
            let paged = at(kv.storage(), &batch);
            let gathered = at(&dense, &dense.batch());
            assert!(paged == gathered, "page size {ps}, {threads} threads");
            out.push(paged);
        }
        assert!(
            out[1..].iter().all(|o| *o == out[0]),
            "thread count changed the bits"
        );
        // And it is attention: close to an f64 softmax (split-K included).
        for (r, &(s, pos)) in rows.iter().enumerate() {
            for h in 0..6 {
                let g = h / 3;
                let qh: Vec<f64> = q[r * d + h * 64..r * d + (h + 1) * 64]
                    .iter()
                    .map(|&x| f16_to_f32(f32_to_f16(x)) as f64)
                    .collect();
                let c = &dense.0[s];
                let f = |x: &[u16]| -> Vec<f64> {
                    x[g * 64..(g + 1) * 64]
                        .iter()
                        .map(|&h| f16_to_f32(h) as f64)
                        .collect()
                };
                let sc: Vec<f64> = (0..=pos)
                    .map(|p| {
                        f(c.k_row(0, p))
                            .iter()
                            .zip(&qh)
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / 8.0
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = w.iter().sum();
                for dd in 0..64 {
                    let want: f64 = (0..=pos).map(|p| w[p] / z * f(c.v_row(0, p))[dd]).sum();
                    let got = out[0][r * d + h * 64 + dd] as f64;
                    assert!(
                        (got - want).abs() < 0.03,
                        "row {r} head {h}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// Several contiguous caches as one storage: page `i` is cache `i`.
struct Dense(Vec<BasicCache>);

impl Dense {
    /// A batch reading every cache whole.
    fn batch(&self) -> Batch {
        let seqs = (0..self.0.len())
            .map(|i| SeqStep {
                tokens: Vec::new(),
                start: self.0[i].len(),
                pages: vec![PageId(i as u32)],
                page_size: self.0[i].capacity(),
                logits: Logits::None,
            })
            .collect();
        Batch { seqs }
    }
}

impl KvStorage for Dense {
    fn num_pages(&self) -> usize {
        self.0.len()
    }
    fn page_slots(&self, page: u32) -> usize {
        self.0[page as usize].capacity()
    }
    fn write(&mut self, page: u32, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        self.0[page as usize].write(0, layer, slot, k, v)
    }
    /// Each page is its own cache: one page's rows whatever `count` asks.
    fn run_pages(&self, page: u32, _: usize, layer: usize, slot: usize) -> KvPair<'_> {
        self.0[page as usize].run(0, layer, slot)
    }
}

/// A step that reads `t`'s pages (for calling attention directly).
fn view_of(t: &PageTable, ps: usize) -> SeqStep {
    SeqStep {
        tokens: Vec::new(),
        start: t.len(),
        pages: t.pages(),
        page_size: ps,
        logits: Logits::None,
    }
}

/// The first row of `rows` (f16 units) as f32.
fn halves(rows: KvRows<'_>, kvd: usize) -> Vec<f32> {
    rows.raw()[..kvd].iter().map(|&h| f16_to_f32(h)).collect()
}

/// The engine keeps one logits buffer from step to step: a step into a buffer that
/// held a bigger step's rows gives the bits a fresh buffer gets.
#[test]
fn a_reused_logits_buffer_gives_the_bits_of_a_fresh_one() {
    let (_d, m) = tiny(2, isa());
    let (mut fresh, mut kept) = (m.new_paged(16, 4, 64), m.new_paged(16, 4, 64));
    let mut buf = StepLogits::new();
    let steps: [&[(&[u32], Logits)]; 3] = [
        &[(&[1, 2, 3, 4, 5], Logits::All), (&[6, 7], Logits::Last)],
        &[(&[8], Logits::Last), (&[9], Logits::None)],
        &[(&[10, 11], Logits::All), (&[12], Logits::Last)],
    ];
    let mut ta: Vec<PageTable> = (0..2).map(|_| fresh.new_table(None)).collect();
    let mut tb: Vec<PageTable> = (0..2).map(|_| kept.new_table(None)).collect();
    for step in steps {
        let (mut a, mut b) = (Batch::default(), Batch::default());
        for (i, &(toks, logits)) in step.iter().enumerate() {
            a.seqs.push(fresh.plan(&mut ta[i], toks, logits).unwrap());
            b.seqs.push(kept.plan(&mut tb[i], toks, logits).unwrap());
        }
        let want = m.forward(&a, fresh.storage()).unwrap();
        m.forward_into(&b, kept.storage(), &mut buf).unwrap();
        assert_eq!(buf.len(), want.len());
        for (i, w) in want.iter().enumerate() {
            let got: Vec<u32> = buf[i].iter().map(|x| x.to_bits()).collect();
            let w: Vec<u32> = w.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, w, "sequence {i}");
        }
        for t in ta.iter_mut() {
            fresh.commit(t).unwrap();
        }
        for t in tb.iter_mut() {
            kept.commit(t).unwrap();
        }
    }
    // A buffer bigger than the bound is freed; one within it is kept.
    let before = buf.len();
    buf.trim(usize::MAX);
    assert_eq!(buf.len(), before);
    buf.trim(m.config.vocab);
    assert!(buf.is_empty());
}

#[test]
fn a_batch_whose_pages_do_not_hold_its_positions_is_refused_and_writes_nothing() {
    let (_d, m) = tiny(1, isa());
    let mut kv = m.new_paged(8, 4, 64);
    let mut t = kv.new_table(None);
    let before = m
        .run(&mut kv.seq(&mut t), &[1, 2, 3], Logits::Last)
        .unwrap();
    let mut short = kv.plan(&mut t, &[4, 5], Logits::Last).unwrap();
    short.pages.pop(); // position 4 lives on the second page
    let err = m
        .forward(&Batch::one(short.clone()), kv.storage())
        .unwrap_err();
    assert!(matches!(err, StepError::BadBatch { seq: 0, .. }), "{err}");
    let mut foreign = short.clone();
    foreign.pages.push(PageId(999));
    let err = m.forward(&Batch::one(foreign), kv.storage()).unwrap_err();
    assert!(matches!(err, StepError::BadBatch { .. }), "{err}");
    let mut bad_token = short;
    bad_token.tokens[0] = 1 << 30;
    let err = m.forward(&Batch::one(bad_token), kv.storage()).unwrap_err();
    assert_eq!(err, StepError::BadToken(1 << 30));
    kv.abort(&mut t, 2);
    // Nothing was written: the sequence computes the same logits again.
    kv.truncate(&mut t, 1).unwrap();
    assert_eq!(
        m.run(&mut kv.seq(&mut t), &[3], Logits::Last).unwrap(),
        before
    );
}

#[test]
fn f32_kv_on_the_default_model_batches_bit_for_bit_and_stays_close_to_f16() {
    let m = Model::load(&common::model_path(), 2).unwrap();
    let toks = m.tokenizer.encode(
        "The history of the printing press begins long before Gutenberg.",
        true,
    );
    let mut c32 = m.new_cache_as(KvDtype::F32, 64);
    let want = m.run(&mut c32, &toks, Logits::All).unwrap();
    // Paged, in a batch with another sequence, chunked: the same bits.
    let mut kv = m.new_paged_as(KvDtype::F32, 64, 16, 512);
    let (mut a, mut b) = (kv.new_table(None), kv.new_table(None));
    let other: Vec<u32> = toks.iter().rev().copied().collect();
    let h = toks.len() / 2;
    let steps: [(&[u32], Logits); 2] = [(&toks[..h], Logits::All), (&other, Logits::Last)];
    let first = forward_tables(&m, &mut kv, &mut [&mut a, &mut b], &steps).unwrap();
    let second = m.run(&mut kv.seq(&mut a), &toks[h..], Logits::All).unwrap();
    assert!(first[0] == want[..first[0].len()] && second == want[first[0].len()..]);
    // f32 storage moves log-probabilities by about as much as llama.cpp's own noise.
    let mut c16 = m.new_cache(64);
    let half = m.run(&mut c16, &toks, Logits::All).unwrap();
    let v = m.config.vocab;
    let mut worst = 0f64;
    for (x, y) in want.chunks(v).zip(half.chunks(v)) {
        let (lx, ly) = (
            folio::model::sampler::log_softmax(x),
            folio::model::sampler::log_softmax(y),
        );
        let top = folio::model::sampler::argmax(x) as usize;
        worst = worst.max((lx[top] - ly[top]).abs());
    }
    assert!(worst < 0.25, "top-token log-prob moved by {worst}");
}
