//! Context state and its operations, run on the engine thread: a program's own
//! sequence in the engine's pool. Append text or tokens (pending until computed),
//! flush them, generate a continuation that streams like any request, fork in O(1)
//! committed pages, truncate, named snapshots, counters, and the raw page operations.
//! Work that needs the model (flush, generate) becomes a [`Job`] the core hands the
//! scheduler, so a context batches with everything else; when it ends, its table comes
//! back through [`Contexts::give_back`]. A generation that does not finish (refused,
//! failed, cancelled, timed out) leaves the context as it was (`CtxLink::before`),
//! and a chat reply keeps room for the template's end-of-turn tokens, so a context
//! never passes its window. The public handle is `handle::Context`.

use super::error::EngineError;
use super::request::Request;
use super::scheduler::check_fits;
use super::seq::{Before, CtxLink, Gen, PromptScores, Purpose, Seq, Sink};
use crate::kv::{PageId, PageTable, PagedKv, SaveTicket};
use crate::model::Model;
use crate::tokenizer::Message;
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver};

/// Chat roles for the template helpers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// A context's state on the engine thread.
pub(crate) struct CtxState {
    /// None while a flush or generation of this context runs.
    table: Option<PageTable>,
    /// Appended tokens not computed yet.
    pending: Vec<u32>,
    salt: Option<Vec<u8>>,
    /// The chat so far, and the text the template made of it (what the context holds).
    messages: Vec<Message>,
    rendered: String,
    /// Pages reserved ahead by `reserve_working_pages`.
    spare: Vec<PageId>,
}

impl CtxState {
    /// The context's table while it is idle.
    pub(crate) fn table(&self) -> Option<&PageTable> {
        self.table.as_ref()
    }

    pub(crate) fn new(table: PageTable, salt: Option<Vec<u8>>) -> Self {
        Self {
            table: Some(table),
            pending: Vec::new(),
            salt,
            messages: Vec::new(),
            rendered: String::new(),
            spare: Vec::new(),
        }
    }
}

/// Page counters of a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextInfo {
    /// Tokens held, computed or pending.
    pub seq_len: usize,
    pub page_size: usize,
    pub committed_pages: usize,
    pub working_pages: usize,
    /// Appended tokens not computed yet.
    pub pending_tokens: usize,
    /// Pages reserved ahead and not yet used.
    pub spare_pages: usize,
}

/// Work a context hands the scheduler: compute `tokens` (the context's, then new ones)
/// starting from `table`.
pub(crate) struct Job {
    pub req: u64,
    pub tokens: Vec<u32>,
    pub salt: Option<Vec<u8>>,
    pub purpose: Purpose,
    pub link: CtxLink,
    pub table: PageTable,
}

/// Answered when a flush is done.
pub(crate) type FlushReply = Receiver<Result<(), EngineError>>;

/// Every context of one engine.
#[derive(Default)]
pub(crate) struct Contexts {
    map: HashMap<u64, CtxState>,
    next: u64,
    /// Forks made (a counter for the stats).
    pub forks: u64,
    /// The most pages contexts and snapshots hold together (see `quota.rs`).
    pub page_limit: usize,
}

impl Contexts {
    pub fn with_page_limit(page_limit: usize) -> Self {
        Self {
            page_limit,
            ..Self::default()
        }
    }

    /// Free slots in the last page context `id`'s tokens (computed and pending) take.
    pub fn slack(&self, kv: &PagedKv, id: u64) -> usize {
        self.map.get(&id).map_or(0, |c| {
            kv.free_slots_after(c.table().map_or(0, |t| t.len()) + c.pending.len())
        })
    }

    /// Pages the contexts' pending tokens will take beyond the pages they hold, plus
    /// those `grow` more tokens of context `id` would.
    pub fn pages_to_come(&self, kv: &PagedKv, id: u64, grow: usize) -> usize {
        self.map
            .iter()
            .map(|(&k, c)| {
                let len = c.table().map_or(0, |t| t.len());
                let more = if k == id { grow } else { 0 };
                kv.extra_pages_for(c.table(), len + c.pending.len() + more)
            })
            .sum()
    }

    pub fn new_context(&mut self, kv: &PagedKv, salt: Option<Vec<u8>>) -> u64 {
        self.next += 1;
        let table = kv.new_table(salt.as_deref());
        self.map.insert(self.next, CtxState::new(table, salt));
        self.next
    }

    /// The idle tables of every context (for counting shared pages).
    pub fn tables(&self) -> impl Iterator<Item = &PageTable> {
        self.map.values().filter_map(|c| c.table())
    }

    /// Pages reserved ahead by every context (working pages, one holder each).
    pub fn spare_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.map.values().flat_map(|c| c.spare.iter().copied())
    }

    /// The idle contexts' ids and tables.
    pub fn tables_by_id(&self) -> impl Iterator<Item = (u64, &PageTable)> {
        self.map
            .iter()
            .filter_map(|(&id, c)| c.table().map(|t| (id, t)))
    }

    /// The context's state while it is idle (an error while a job of it runs).
    fn idle(&mut self, id: u64) -> Result<&mut CtxState, EngineError> {
        let c = self.map.get_mut(&id).ok_or(EngineError::NoContext(id))?;
        if c.table.is_none() {
            return Err(EngineError::Busy);
        }
        Ok(c)
    }

    /// Puts a finished job's table (and its uncomputed tokens) back into its context.
    pub fn give_back(&mut self, kv: &mut PagedKv, model: &Model, mut s: Seq) {
        let tok = &model.tokenizer;
        let table = s.table.take();
        let Some(link) = s.ctx.take() else { return };
        let Some(c) = self.map.get_mut(&link.ctx) else {
            // The context was dropped meanwhile.
            if let Some(t) = table {
                let _ = kv.release(t);
            }
            return;
        };
        let mut table = table.unwrap_or_else(|| kv.new_table(c.salt.as_deref()));
        if let Some(before) = link.before.filter(|_| !link.finished) {
            // Cancelled, failed or timed out: the context is left as it was (what was
            // computed of its own tokens stays computed).
            kv.truncate_to(&mut table, before.len);
            c.pending = s.tokens[table.len()..before.len].to_vec();
            c.messages = before.messages;
            c.rendered = before.rendered;
            c.table = Some(table);
            return;
        }
        let mut pending = s.tokens[table.len()..].to_vec();
        // A chat reply: record it as the assistant's message, and append whatever the
        // template puts after a reply (so the context holds exactly the template's text).
        if link.chat_reply {
            let ids = &s.tokens[s.prompt_len..];
            let shown: Vec<u32> = ids.iter().copied().filter(|&t| !tok.is_eog(t)).collect();
            let actual = format!("{}{}", c.rendered, tok.decode_special(ids));
            c.messages
                .push(Message::new("assistant", tok.decode(&shown).trim()));
            match tok
                .chat_template()
                .and_then(|t| t.render(&c.messages, false))
            {
                Ok(expected) if expected.starts_with(&actual) => {
                    pending.extend(tok.encode(&expected[actual.len()..], false));
                    c.rendered = expected;
                }
                _ => c.rendered = actual,
            }
        }
        c.pending = pending;
        c.table = Some(table);
    }

    pub fn append(
        &mut self,
        model: &Model,
        window: usize,
        id: u64,
        tokens: Vec<u32>,
    ) -> Result<(), EngineError> {
        let vocab = model.config.vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(crate::error::TokenizerError::UnknownId(bad).into());
        }
        self.check_window(id, tokens.len(), window)?;
        self.idle(id)?.pending.extend(tokens);
        Ok(())
    }

    /// Whether `grow` more tokens fit context `id`'s window (checked before the
    /// contexts' share: a request too long for the window is that, whatever the pool).
    pub fn check_window(&mut self, id: u64, grow: usize, window: usize) -> Result<(), EngineError> {
        let c = self.idle(id)?;
        let len = c.table.as_ref().map_or(0, |t| t.len()) + c.pending.len() + grow;
        if len >= window {
            return Err(EngineError::PromptTooLong { len, window });
        }
        Ok(())
    }

    pub fn is_empty(&mut self, id: u64) -> Result<bool, EngineError> {
        let c = self.idle(id)?;
        Ok(c.pending.is_empty() && c.table.as_ref().is_some_and(|t| t.is_empty()))
    }

    /// The chat so far, for rendering a new message off the engine thread.
    pub fn chat(&mut self, id: u64) -> Result<ChatState, EngineError> {
        let empty = self.is_empty(id)?;
        let c = self.idle(id)?;
        Ok(ChatState {
            messages: c.messages.clone(),
            rendered: c.rendered.clone(),
            empty,
        })
    }

    /// Appends a message rendered and tokenized from `was` (see [`ChatState::add`]);
    /// false (nothing done) when the context changed since `was` was read.
    pub fn add_message(
        &mut self,
        model: &Model,
        window: usize,
        id: u64,
        was: &ChatState,
        added: Added,
    ) -> Result<bool, EngineError> {
        let empty = self.is_empty(id)?;
        let c = self.idle(id)?;
        if empty != was.empty
            || c.messages.len() != was.messages.len()
            || c.rendered != was.rendered
        {
            return Ok(false);
        }
        self.append(model, window, id, added.tokens)?;
        let c = self.idle(id)?;
        c.messages = added.messages;
        c.rendered = added.rendered;
        Ok(true)
    }

    /// A job computing the context's pending tokens (none if there are none), as
    /// request `req` (which cancels it); the receiver answers when it is done.
    pub fn flush(
        &mut self,
        kv: &mut PagedKv,
        id: u64,
        req: u64,
    ) -> Result<(FlushReply, Option<Job>), EngineError> {
        let (tx, rx) = channel();
        let c = self.idle(id)?;
        if c.pending.is_empty() {
            let _ = tx.send(Ok(()));
            return Ok((rx, None));
        }
        let table = c.table.take().expect("idle");
        // Spare pages were reserved for this: hand them back so the flush gets them.
        for p in c.spare.drain(..) {
            let _ = kv.release_page(p);
        }
        let mut tokens = kv.read_tokens(&table)?;
        tokens.append(&mut c.pending);
        let job = Job {
            req,
            tokens,
            salt: c.salt.clone(),
            purpose: Purpose::Flush,
            link: CtxLink {
                ctx: id,
                flush_reply: Some(tx),
                chat_reply: false,
                before: None,
                finished: false,
            },
            table,
        };
        Ok((rx, Some(job)))
    }

    /// A job generating a continuation of the context (plus `r.prompt`, appended
    /// first; with `chat_reply`, the template's generation prompt before it).
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        kv: &mut PagedKv,
        model: &Model,
        window: usize,
        id: u64,
        req: u64,
        r: Request,
        chat_reply: bool,
        tx: Sink,
    ) -> Result<Job, EngineError> {
        r.validate()?;
        r.validate_ids(model.config.vocab)?;
        if r.n != 1 {
            return Err(EngineError::param(
                "n",
                "a context generates one sample (n = 1)",
            ));
        }
        let extra = r.prompt.tokens(model)?;
        if r.prompt_logprobs.is_some() && extra.is_empty() {
            return Err(EngineError::param(
                "prompt_logprobs",
                "a context scores the request's own prompt tokens: give some",
            ));
        }
        // The template's generation prompt (the assistant's header), and how many
        // tokens it puts after a reply (room kept for them, so the reply recorded in
        // the context never takes it past the window).
        let (header, rendered, after) = if chat_reply {
            let c = self.idle(id)?;
            chat_header(model, &c.messages, &c.rendered)?
        } else {
            (Vec::new(), None, 0)
        };
        let c = self.idle(id)?;
        // Checked before anything moves, so a refused request leaves the context as it was.
        let held = c.table.as_ref().map_or(0, |t| t.len());
        let before = held + c.pending.len();
        let len = before + header.len() + extra.len();
        if len == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if len + after >= window {
            return Err(EngineError::PromptTooLong {
                len: len + after,
                window,
            });
        }
        let max_tokens = r.max_tokens.min(window - len - after);
        // A context's job keeps all its pages (it reads its tokens back).
        check_fits(kv, window, len, max_tokens, None)?;
        let before = Before {
            len: before,
            messages: c.messages.clone(),
            rendered: c.rendered.clone(),
        };
        if let Some(full) = rendered {
            c.rendered = full;
        }
        c.pending.extend(header);
        let mut table = c.table.take().expect("idle");
        let mut tokens = match kv.read_tokens(&table) {
            Ok(t) => t,
            Err(e) => {
                c.pending.truncate(before.len - table.len());
                c.rendered = before.rendered;
                c.table = Some(table);
                return Err(e.into());
            }
        };
        tokens.append(&mut c.pending);
        let extra_len = extra.len();
        tokens.extend(extra);
        for p in c.spare.drain(..) {
            let _ = kv.release_page(p);
        }
        // The last token must be computed in this job: it gives the logits to sample.
        if table.len() == tokens.len() {
            kv.truncate_to(&mut table, tokens.len() - 1);
        }
        let mut g = Gen::new(
            &r.sampling,
            &r.stop,
            max_tokens,
            r.ignore_eos,
            r.logprobs,
            tx,
        );
        g.grammar = r.grammar;
        // Scored: the request's own tokens, which come last (the context's earlier
        // rows are computed already and give nothing).
        g.prompt_logprobs = r
            .prompt_logprobs
            .map(|k| PromptScores::new(k, tokens.len() - extra_len));
        if let Some(p) = &g.prompt_logprobs {
            // The row before the first scored token gives its figure: it is
            // computed in this job even when the context had computed it.
            if table.len() >= p.from {
                kv.truncate_to(&mut table, p.from - 1);
            }
        }
        if r.speculative {
            g.spec = Some(Box::new(super::spec::SpecState::new(r.prediction)));
        }
        Ok(Job {
            req,
            tokens,
            salt: c.salt.clone(),
            purpose: Purpose::Generate(Box::new(g)),
            link: CtxLink {
                ctx: id,
                flush_reply: None,
                chat_reply,
                before: Some(before),
                finished: false,
            },
            table,
        })
    }

    pub fn fork(&mut self, kv: &mut PagedKv, id: u64) -> Result<u64, EngineError> {
        let c = self.idle(id)?;
        let table = kv.fork(c.table.as_mut().expect("idle"))?;
        let mut copy = CtxState::new(table, c.salt.clone());
        copy.pending = c.pending.clone();
        copy.messages = c.messages.clone();
        copy.rendered = c.rendered.clone();
        self.next += 1;
        self.forks += 1;
        self.map.insert(self.next, copy);
        Ok(self.next)
    }

    pub fn truncate(&mut self, kv: &mut PagedKv, id: u64, n: usize) -> Result<(), EngineError> {
        let c = self.idle(id)?;
        let from_pending = n.min(c.pending.len());
        let t = c.table.as_mut().expect("idle");
        let rest = n - from_pending;
        if rest > t.len() {
            return Err(EngineError::TruncateTooFar {
                wanted: n,
                len: t.len() + c.pending.len(),
            });
        }
        kv.truncate(t, rest)?;
        c.pending.truncate(c.pending.len() - from_pending);
        // The chat record no longer matches the tokens: the helpers start over.
        c.messages.clear();
        c.rendered.clear();
        Ok(())
    }

    pub fn info(&mut self, kv: &PagedKv, id: u64) -> Result<ContextInfo, EngineError> {
        let ps = kv.page_size();
        let c = self.idle(id)?;
        let t = c.table.as_ref().expect("idle");
        Ok(ContextInfo {
            seq_len: t.len() + c.pending.len(),
            page_size: ps,
            committed_pages: t.num_committed(),
            working_pages: t.num_working(),
            pending_tokens: c.pending.len(),
            spare_pages: c.spare.len(),
        })
    }

    /// The context's tenant salt, if it has one.
    pub fn salt(&self, id: u64) -> Result<Option<Vec<u8>>, EngineError> {
        let c = self.map.get(&id).ok_or(EngineError::NoContext(id))?;
        Ok(c.salt.clone())
    }

    /// The ids of the pool pages the context holds: its table's (a sliding window's
    /// forgotten pages left out), then the spare pages it reserved.
    pub fn page_ids(&mut self, id: u64) -> Result<Vec<u32>, EngineError> {
        let c = self.idle(id)?;
        let t = c.table.as_ref().expect("idle");
        let mut ids: Vec<u32> = t
            .pages()
            .into_iter()
            .enumerate()
            .filter(|&(i, _)| t.holds(i))
            .map(|(_, p)| p.0)
            .collect();
        ids.extend(c.spare.iter().map(|p| p.0));
        Ok(ids)
    }

    pub fn tokens(&mut self, kv: &PagedKv, id: u64) -> Result<Vec<u32>, EngineError> {
        let c = self.idle(id)?;
        let mut t = kv.read_tokens(c.table.as_ref().expect("idle"))?;
        t.extend(&c.pending);
        Ok(t)
    }

    /// Pins the context's pages as snapshot `name` (see `PagedKv::begin_save`): with a
    /// snapshot directory, returns the ticket the caller writes the file with, off
    /// the engine thread.
    pub fn save(
        &mut self,
        kv: &mut PagedKv,
        id: u64,
        name: &str,
    ) -> Result<Option<SaveTicket>, EngineError> {
        let c = self.idle(id)?;
        if !c.pending.is_empty() {
            return Err(EngineError::NotFlushed(c.pending.len()));
        }
        Ok(kv.begin_save(name, c.table.as_mut().expect("idle"))?)
    }

    /// A new context sharing snapshot `name`'s pages, in its tenant's chain (the salt
    /// the snapshot was saved with).
    pub fn load(&mut self, kv: &mut PagedKv, name: &str) -> Result<u64, EngineError> {
        let table = kv.load(name)?;
        let id = self.new_context(kv, table.salt().map(<[u8]>::to_vec));
        let old = self.map.get_mut(&id).expect("just made");
        let empty = old.table.replace(table).expect("fresh");
        let _ = kv.release(empty);
        Ok(id)
    }

    pub fn drop_context(&mut self, kv: &mut PagedKv, id: u64) {
        if let Some(mut c) = self.map.remove(&id) {
            for p in c.spare.drain(..) {
                let _ = kv.release_page(p);
            }
            if let Some(t) = c.table.take() {
                let _ = kv.release(t);
            }
            // A job still running for it finds the context gone and releases its pages.
        }
    }

    pub fn raw_reserve(&mut self, kv: &mut PagedKv, id: u64, n: usize) -> Result<(), EngineError> {
        let c = self.idle(id)?;
        let pages = kv.reserve_pages(n)?;
        c.spare.extend(pages);
        Ok(())
    }

    pub fn raw_commit(&mut self, kv: &mut PagedKv, id: u64, k: usize) -> Result<(), EngineError> {
        let c = self.idle(id)?;
        let t = c.table.as_mut().expect("idle");
        // Full working pages are committed as soon as they are computed, so there are
        // none left to commit by hand: k = 0 is all that can succeed.
        kv.commit_working_pages(t, k)?;
        Ok(())
    }

    pub fn raw_release(&mut self, kv: &mut PagedKv, id: u64, n: usize) -> Result<(), EngineError> {
        let c = self.idle(id)?;
        let t = c.table.as_mut().expect("idle");
        let working = t.num_working();
        if n > c.spare.len() + working {
            return Err(EngineError::ReleaseTooMany {
                wanted: n,
                have: c.spare.len() + working,
            });
        }
        let from_spare = n.min(c.spare.len());
        for p in c.spare.drain(c.spare.len() - from_spare..) {
            kv.release_page(p)?;
        }
        kv.release_working_pages(t, n - from_spare)?;
        Ok(())
    }

    pub fn raw_truncate_working(
        &mut self,
        kv: &mut PagedKv,
        id: u64,
        n: usize,
    ) -> Result<(), EngineError> {
        let c = self.idle(id)?;
        let t = c.table.as_mut().expect("idle");
        kv.truncate_working_tokens(t, n)?;
        Ok(())
    }
}

/// A context's chat as read for adding a message (see [`Contexts::chat`]).
pub(crate) struct ChatState {
    messages: Vec<Message>,
    rendered: String,
    empty: bool,
}

/// A message rendered and tokenized, ready to append.
pub(crate) struct Added {
    tokens: Vec<u32>,
    messages: Vec<Message>,
    rendered: String,
}

impl Added {
    /// Tokens the message adds.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
}

impl ChatState {
    /// Renders the chat with one more message and tokenizes what it adds. The
    /// expensive part of a message (a long text's template and tokenizer work), done
    /// by the caller, never on the engine thread.
    pub fn add(&self, model: &Model, role: Role, text: &str) -> Result<Added, EngineError> {
        let tok = &model.tokenizer;
        let template = tok.chat_template()?;
        let mut messages = self.messages.clone();
        messages.push(Message::new(role.as_str(), text));
        let full = template.render(&messages, false)?;
        let delta = full.strip_prefix(self.rendered.as_str()).unwrap_or(&full);
        let tokens = tok.try_encode(delta, self.empty)?;
        Ok(Added {
            tokens,
            messages,
            rendered: full,
        })
    }
}

/// A chat reply's header: the tokens of the template's generation prompt after what
/// the context holds, the rendered text with it (`None` when it adds nothing), and
/// how many tokens the template puts after a reply (an empty one stands in).
fn chat_header(
    model: &Model,
    messages: &[Message],
    rendered: &str,
) -> Result<(Vec<u32>, Option<String>, usize), EngineError> {
    let tok = &model.tokenizer;
    let template = tok.chat_template()?;
    let full = template.render(messages, true)?;
    let delta = full.strip_prefix(rendered).unwrap_or("");
    let header = tok.encode(delta, false);
    let mut replied = messages.to_vec();
    replied.push(Message::new("assistant", ""));
    let closed = template.render(&replied, false)?;
    let after = closed
        .strip_prefix(full.as_str())
        .map_or(0, |rest| tok.encode(rest, false).len());
    Ok((header, Some(full), after))
}
