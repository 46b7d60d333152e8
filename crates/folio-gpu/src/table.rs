//! [`StepTable`]: a batch as the kernels read it, built on the host each step (pure
//! data, unit-tested here). The page tables go to the device as one CSR buffer:
//!
//! - per row: its position and its sequence (`2 × rows` words);
//! - per sequence: the index of its first page id in this buffer, its page count and
//!   its fill (positions held after the step) (`3 × seqs` words, from word `seqs_at`);
//! - then every sequence's page ids, in order.
//!
//! Beside it: each new row's slot in the pool (`page × page_size + slot`), the rows
//! whose logits (or hidden states) are asked for, and the pages (with how many of their slots) whose
//! stored K/V the step reads from before its own rows.

use folio::kv::Logits;
use folio::Batch;
use std::collections::BTreeMap;

/// One step's rows and tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepTable {
    /// `(sequence, position)` of every new row, in batch order.
    pub rows: Vec<(usize, usize)>,
    /// The CSR page tables (see the module doc).
    pub tab: Vec<u32>,
    /// Where the per-sequence entries start in `tab`.
    pub seqs_at: u32,
    /// Each new row's slot index in the pool.
    pub slots: Vec<u32>,
    /// The rows whose logits are returned, in the order [`folio::model::StepLogits`]
    /// lays them out.
    pub picked: Vec<u32>,
    /// The rows whose hidden states (after the final norm) are returned instead.
    pub hidden: Vec<u32>,
    /// Page → slots `0..n` of it the step reads but does not write.
    pub reads: BTreeMap<u32, usize>,
    /// Page → the slots `a..b` the step writes in it (from its first to past its last
    /// new row there).
    pub writes: BTreeMap<u32, (usize, usize)>,
    pub page_size: usize,
}

/// Why a batch cannot be laid out for the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TableError {
    /// Sequences of one step with different page sizes (one pool has one).
    MixedPageSizes,
}

impl StepTable {
    /// `batch` laid out; `first_key(start)`: the first position a row at `start` or
    /// after reads, if any layer's window leaves the earlier ones out for every layer
    /// (`Config::kv_needed_from`): pages wholly before it are not read (a sequence
    /// that slides may have given them up, and they may be another's now).
    pub fn new(
        batch: &Batch,
        first_key: impl Fn(usize) -> Option<usize>,
    ) -> Result<Self, TableError> {
        let page_size = batch.seqs.first().map_or(1, |s| s.page_size);
        if batch.seqs.iter().any(|s| s.page_size != page_size) {
            return Err(TableError::MixedPageSizes);
        }
        let mut rows = Vec::new();
        let mut slots = Vec::new();
        let mut picked = Vec::new();
        let mut hidden = Vec::new();
        let mut reads = BTreeMap::new();
        let mut writes = BTreeMap::new();
        for (s, st) in batch.seqs.iter().enumerate() {
            let first = rows.len() as u32;
            for pos in st.start..st.end() {
                let (page, slot) = st.slot(pos);
                rows.push((s, pos));
                slots.push((page.0 as usize * page_size + slot) as u32);
                let w = writes.entry(page.0).or_insert((slot, slot + 1));
                *w = (w.0.min(slot), w.1.max(slot + 1));
            }
            match st.logits {
                Logits::Last => picked.push(rows.len() as u32 - 1),
                Logits::All => picked.extend(first..rows.len() as u32),
                Logits::Hidden => hidden.extend(first..rows.len() as u32),
                Logits::None => {}
            }
            let first = first_key(st.start).unwrap_or(0);
            for (i, page) in st.pages.iter().enumerate() {
                let held = st.start.saturating_sub(i * page_size).min(page_size);
                if held > 0 && (i + 1) * page_size > first {
                    let n = reads.entry(page.0).or_insert(0);
                    *n = held.max(*n);
                }
            }
        }
        let seqs_at = 2 * rows.len() as u32;
        let mut tab: Vec<u32> = rows
            .iter()
            .flat_map(|&(s, p)| [p as u32, s as u32])
            .collect();
        let mut entry = seqs_at + 3 * batch.seqs.len() as u32;
        for st in &batch.seqs {
            tab.extend([entry, st.pages.len() as u32, st.end() as u32]);
            entry += st.pages.len() as u32;
        }
        for st in &batch.seqs {
            tab.extend(st.pages.iter().map(|p| p.0));
        }
        Ok(StepTable {
            rows,
            tab,
            seqs_at,
            slots,
            picked,
            hidden,
            reads,
            writes,
            page_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use folio::kv::PageId;
    use folio::SeqStep;

    fn step(tokens: usize, start: usize, pages: &[u32], logits: Logits) -> SeqStep {
        SeqStep {
            tokens: vec![1; tokens],
            start,
            pages: pages.iter().map(|&p| PageId(p)).collect(),
            page_size: 4,
            logits,
        }
    }

    #[test]
    fn a_ragged_batch_lays_out_rows_csr_tables_slots_and_reads() {
        // A prefill chunk of 3 after 5 stored tokens (pages 7, 2), and a decode row at
        // position 9 whose first two pages it shares with the first (a fork).
        let batch = Batch {
            seqs: vec![
                step(3, 5, &[7, 2], Logits::All),
                step(1, 9, &[7, 2, 4], Logits::Last),
            ],
        };
        let t = StepTable::new(&batch, |_| None).unwrap();
        assert_eq!(t.rows, [(0, 5), (0, 6), (0, 7), (1, 9)]);
        assert_eq!(t.slots, [2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 4 * 4 + 1]);
        assert_eq!(t.picked, [0, 1, 2, 3]);
        assert_eq!(t.seqs_at, 8);
        let seqs = &t.tab[8..14];
        assert_eq!(seqs, [14, 2, 8, 16, 3, 10]);
        assert_eq!(&t.tab[14..], [7, 2, 7, 2, 4]);
        // Page 7 is read whole, page 2 up to slot 1 by the first and whole by the
        // second, page 4 up to slot 1.
        let reads: Vec<_> = t.reads.into_iter().collect();
        assert_eq!(reads, [(2, 4), (4, 1), (7, 4)]);
        // The first writes slots 1..4 of page 2, the second slot 1 of page 4.
        let writes: Vec<_> = t.writes.into_iter().collect();
        assert_eq!(writes, [(2, (1, 4)), (4, (1, 2))]);
    }

    /// A sequence whose layers all slide reads no page wholly before its first key
    /// (it may have given such pages up).
    #[test]
    fn pages_before_the_window_are_not_read() {
        let batch = Batch::one(step(1, 9, &[7, 2, 4], Logits::Last));
        let t = StepTable::new(&batch, |start| Some(start + 1 - 5)).unwrap();
        let reads: Vec<_> = t.reads.into_iter().collect();
        assert_eq!(
            reads,
            [(2, 4), (4, 1)],
            "page 7 holds positions 0..4, all before 5"
        );
    }

    #[test]
    fn hidden_rows_are_listed_and_mixed_page_sizes_refused() {
        let hidden = Batch::one(step(2, 0, &[0], Logits::Hidden));
        let t = StepTable::new(&hidden, |_| None).unwrap();
        assert_eq!((t.picked.len(), t.hidden), (0, vec![0, 1]));
        let mut other = step(1, 0, &[1], Logits::Last);
        other.page_size = 8;
        let mixed = Batch {
            seqs: vec![step(1, 0, &[0], Logits::Last), other],
        };
        assert_eq!(
            StepTable::new(&mixed, |_| None),
            Err(TableError::MixedPageSizes)
        );
    }
}
