//! The plan of one forward step, as plain data: the one thing that crosses from
//! whoever allocates pages (the engine's scheduler, or a single sequence's owner) to
//! the model. Every slot a step writes is already reserved when the batch is made, so
//! running the batch never allocates and cannot run out of pages.

use super::store::PageId;

/// Which positions of a step need logits (or, for embeddings, hidden states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (teacher forcing, scoring).
    All,
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// No logits: every new token's hidden state after the final norm (the head's
    /// input: what HF calls `last_hidden_state`), for embeddings. The head is skipped.
    Hidden,
}

/// One sequence's part of a step: its new tokens at positions `start..`, and the pages
/// that hold its positions `0..start + tokens.len()` (token `t` lives in page
/// `pages[t / page_size]`, slot `t % page_size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqStep {
    /// New tokens: a prefill chunk or one decode token.
    pub tokens: Vec<u32>,
    /// Position of the first new token (tokens already stored before it).
    pub start: usize,
    /// Pages holding the sequence, in order, up to and including its last new token.
    pub pages: Vec<PageId>,
    /// Token slots per page.
    pub page_size: usize,
    pub logits: Logits,
}

impl SeqStep {
    /// Position after the last new token.
    pub fn end(&self) -> usize {
        self.start + self.tokens.len()
    }

    /// Page and slot of position `pos`.
    pub fn slot(&self, pos: usize) -> (PageId, usize) {
        (self.pages[pos / self.page_size], pos % self.page_size)
    }

    /// Rows of logits this step returns.
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            Logits::Last => 1,
            Logits::All => self.tokens.len(),
            Logits::None | Logits::Hidden => 0,
        }
    }

    /// Rows of hidden states this step returns (every new token's, or none).
    pub fn state_rows(&self) -> usize {
        match self.logits {
            Logits::Hidden => self.tokens.len(),
            Logits::Last | Logits::All | Logits::None => 0,
        }
    }
}

/// A ragged batch: several sequences' steps, run as one forward pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    pub seqs: Vec<SeqStep>,
}

impl Batch {
    /// A batch of one sequence.
    pub fn one(step: SeqStep) -> Self {
        Self { seqs: vec![step] }
    }

    /// New tokens over all sequences.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}
