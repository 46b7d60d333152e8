//! The Context API: a program's own sequence in the engine's pool. Append text or
//! tokens (pending until computed), `flush()` them, `generate()` a continuation that
//! streams like any request, `fork()` in O(1) committed pages, `truncate(n)`, named
//! snapshots, counters, and the raw page operations. A context's work is scheduled
//! with everything else the engine runs, so it batches with other requests.

use super::sched::Core;
use super::seq::{CtxLink, Gen, Purpose, Seq};
use super::{Engine, EngineError, Request, Stream};
use crate::kv::{KvError, PageId, PageState, PageTable};
use crate::tokenizer::Message;
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

impl Core {
    /// The context's idle table (an error while a job of it runs).
    fn idle(&mut self, id: u64) -> Result<(&mut CtxState, &mut crate::kv::PagedKv), EngineError> {
        let c = self
            .contexts
            .get_mut(&id)
            .ok_or_else(|| EngineError::Invalid(format!("no context {id}")))?;
        if c.table.is_none() {
            return Err(EngineError::Busy);
        }
        Ok((c, &mut self.kv))
    }

    /// Puts a finished job's table (and its uncomputed tokens) back into its context.
    pub(crate) fn return_to_context(&mut self, s: &Seq, link: CtxLink, table: Option<PageTable>) {
        let tok = &self.model.tokenizer;
        let Some(c) = self.contexts.get_mut(&link.ctx) else {
            // The context was dropped meanwhile.
            if let Some(t) = table {
                let _ = self.kv.release(t);
            }
            return;
        };
        let table = table.unwrap_or_else(|| self.kv.new_table(c.salt.as_deref()));
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

    fn ctx_append(&mut self, id: u64, tokens: Vec<u32>) -> Result<(), EngineError> {
        let vocab = self.model.config.vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(crate::error::RunError::BadToken(bad).into());
        }
        let window = self.window;
        let (c, _) = self.idle(id)?;
        let len = c.table.as_ref().map_or(0, |t| t.len()) + c.pending.len() + tokens.len();
        if len >= window {
            return Err(EngineError::PromptTooLong { len, window });
        }
        c.pending.extend(tokens);
        Ok(())
    }

    fn ctx_is_empty(&mut self, id: u64) -> Result<bool, EngineError> {
        let (c, _) = self.idle(id)?;
        Ok(c.pending.is_empty() && c.table.as_ref().is_some_and(|t| t.is_empty()))
    }

    fn ctx_message(&mut self, id: u64, role: Role, text: String) -> Result<(), EngineError> {
        let model = self.model.clone();
        let tok = &model.tokenizer;
        let template = tok.chat_template()?;
        let empty = self.ctx_is_empty(id)?;
        let (c, _) = self.idle(id)?;
        let mut messages = c.messages.clone();
        messages.push(Message::new(role.as_str(), &text));
        let full = template.render(&messages, false)?;
        let delta = full.strip_prefix(c.rendered.as_str()).unwrap_or(&full);
        let toks = tok.encode(delta, empty);
        self.ctx_append(id, toks)?;
        let (c, _) = self.idle(id)?;
        c.messages = messages;
        c.rendered = full;
        Ok(())
    }

    /// Starts computing the context's pending tokens; the receiver answers when done.
    fn ctx_flush(&mut self, id: u64) -> Result<Receiver<Result<(), String>>, EngineError> {
        let (tx, rx) = channel();
        let (c, kv) = self.idle(id)?;
        if c.pending.is_empty() {
            let _ = tx.send(Ok(()));
            return Ok(rx);
        }
        let table = c.table.take().expect("idle");
        // Spare pages were reserved for this: hand them back so the flush gets them.
        for p in c.spare.drain(..) {
            let _ = kv.store.release(p);
        }
        let mut tokens = kv.store.read_tokens(&table)?;
        tokens.append(&mut c.pending);
        let salt = c.salt.clone();
        let link = CtxLink {
            ctx: id,
            flush_reply: Some(tx),
            chat_reply: false,
        };
        self.push_seq(0, tokens, salt, Purpose::Flush, Some((link, table)));
        Ok(rx)
    }

    fn ctx_generate(
        &mut self,
        id: u64,
        req: u64,
        r: Request,
        chat_reply: bool,
        tx: std::sync::mpsc::Sender<super::Event>,
    ) -> Result<(), EngineError> {
        self.check_request(&r)?;
        if r.n != 1 {
            return Err(EngineError::Invalid(
                "a context generates one sample (n = 1)".into(),
            ));
        }
        let extra = self.tokens_of(&r.prompt)?;
        if chat_reply {
            // The template's generation prompt (the assistant's header).
            let model = self.model.clone();
            let tok = &model.tokenizer;
            let template = tok.chat_template()?;
            let (c, _) = self.idle(id)?;
            let full = template.render(&c.messages, true)?;
            let delta = full
                .strip_prefix(c.rendered.as_str())
                .unwrap_or("")
                .to_string();
            let toks = tok.encode(&delta, false);
            c.rendered = full;
            c.pending.extend(toks);
        }
        let window = self.window;
        let (c, kv) = self.idle(id)?;
        let mut table = c.table.take().expect("idle");
        let mut tokens = kv.store.read_tokens(&table)?;
        tokens.append(&mut c.pending);
        tokens.extend(extra);
        if tokens.is_empty() {
            c.table = Some(table);
            return Err(crate::error::RunError::EmptyPrompt.into());
        }
        if tokens.len() >= window {
            c.table = Some(table);
            return Err(EngineError::PromptTooLong {
                len: tokens.len(),
                window,
            });
        }
        for p in c.spare.drain(..) {
            let _ = kv.store.release(p);
        }
        // The last token must be computed in this job: it gives the logits to sample.
        if table.len() == tokens.len() {
            let n = tokens.len() - 1;
            crate::model::KvCache::truncate(&mut kv.seq(&mut table), n);
        }
        let salt = c.salt.clone();
        let g = Gen::new(
            &r.sampling,
            &r.stop,
            r.max_tokens,
            r.ignore_eos,
            r.logprobs,
            tx,
        );
        let link = CtxLink {
            ctx: id,
            flush_reply: None,
            chat_reply,
        };
        self.push_seq(
            req,
            tokens,
            salt,
            Purpose::Generate(Box::new(g)),
            Some((link, table)),
        );
        Ok(())
    }

    fn ctx_fork(&mut self, id: u64) -> Result<u64, EngineError> {
        let (c, kv) = self.idle(id)?;
        let table = kv.fork(c.table.as_mut().expect("idle"))?;
        let mut copy = CtxState::new(table, c.salt.clone());
        copy.pending = c.pending.clone();
        copy.messages = c.messages.clone();
        copy.rendered = c.rendered.clone();
        let new = self.new_context(None);
        self.contexts.insert(new, copy);
        Ok(new)
    }

    fn ctx_truncate(&mut self, id: u64, n: usize) -> Result<(), EngineError> {
        let (c, kv) = self.idle(id)?;
        let from_pending = n.min(c.pending.len());
        c.pending.truncate(c.pending.len() - from_pending);
        let rest = n - from_pending;
        let t = c.table.as_mut().expect("idle");
        if rest > t.len() {
            return Err(EngineError::Invalid(format!(
                "cannot drop {n} tokens from a context of {}",
                t.len() + from_pending
            )));
        }
        kv.store.truncate(t, rest)?;
        kv.apply_copies();
        // The chat record no longer matches the tokens: the helpers start over.
        c.messages.clear();
        c.rendered.clear();
        Ok(())
    }

    fn ctx_info(&mut self, id: u64) -> Result<ContextInfo, EngineError> {
        let ps = self.kv.store.page_size();
        let (c, _) = self.idle(id)?;
        let t = c.table.as_ref().expect("idle");
        Ok(ContextInfo {
            seq_len: t.len() + c.pending.len(),
            page_size: ps,
            committed_pages: t.num_committed(),
            working_pages: t.num_pages() - t.num_committed(),
            pending_tokens: c.pending.len(),
            spare_pages: c.spare.len(),
        })
    }

    fn ctx_tokens(&mut self, id: u64) -> Result<Vec<u32>, EngineError> {
        let (c, kv) = self.idle(id)?;
        let mut t = kv.store.read_tokens(c.table.as_ref().expect("idle"))?;
        t.extend(&c.pending);
        Ok(t)
    }

    fn ctx_save(&mut self, id: u64, name: String) -> Result<(), EngineError> {
        let (c, kv) = self.idle(id)?;
        if !c.pending.is_empty() {
            return Err(EngineError::Invalid(
                "flush the context before saving it".into(),
            ));
        }
        kv.save(&name, c.table.as_mut().expect("idle"))?;
        Ok(())
    }

    fn ctx_load(&mut self, name: String) -> Result<u64, EngineError> {
        let table = self.kv.load(&name)?;
        let id = self.new_context(None);
        let old = self.contexts.get_mut(&id).expect("just made");
        let empty = old.table.replace(table).expect("fresh");
        let _ = self.kv.release(empty);
        Ok(id)
    }

    fn ctx_drop(&mut self, id: u64) {
        if let Some(mut c) = self.contexts.remove(&id) {
            for p in c.spare.drain(..) {
                let _ = self.kv.store.release(p);
            }
            if let Some(t) = c.table.take() {
                let _ = self.kv.release(t);
            }
            // A job still running for it finds the context gone and releases its pages.
        }
    }

    fn raw_reserve(&mut self, id: u64, n: usize) -> Result<(), EngineError> {
        let (c, kv) = self.idle(id)?;
        let pages = kv.store.reserve_n(n)?;
        c.spare.extend(pages);
        Ok(())
    }

    fn raw_commit(&mut self, id: u64, k: usize) -> Result<(), EngineError> {
        let (c, kv) = self.idle(id)?;
        let t = c.table.as_mut().expect("idle");
        let ps = kv.store.page_size();
        let full_working = t.len() / ps - t.num_committed();
        if k > full_working {
            let i = t.num_committed() + full_working;
            let fill = t.len() - i * ps;
            return Err(KvError::CommitPartial {
                id: if i < t.num_pages() {
                    t.page(i).0
                } else {
                    u32::MAX
                },
                fill,
                page_size: ps,
            }
            .into());
        }
        // Full working pages are committed as soon as they are computed, so there are
        // none left to commit by hand: k = 0 is all that can succeed.
        kv.store.commit_full(t)?;
        Ok(())
    }

    fn raw_release(&mut self, id: u64, n: usize) -> Result<(), EngineError> {
        let (c, kv) = self.idle(id)?;
        let t = c.table.as_mut().expect("idle");
        let working = t.num_pages() - t.num_committed();
        if n > c.spare.len() + working {
            return Err(EngineError::Invalid(format!(
                "cannot release {n} working pages: the context has {}",
                c.spare.len() + working
            )));
        }
        let from_spare = n.min(c.spare.len());
        for p in c.spare.drain(c.spare.len() - from_spare..) {
            kv.store.release(p)?;
        }
        let pages = n - from_spare;
        if pages > 0 {
            let ps = kv.store.page_size();
            let keep = (t.num_pages() - pages) * ps;
            let drop = t.len() - keep.min(t.len());
            kv.store.truncate(t, drop)?;
        }
        Ok(())
    }

    fn raw_truncate_working(&mut self, id: u64, n: usize) -> Result<(), EngineError> {
        let (c, kv) = self.idle(id)?;
        let t = c.table.as_mut().expect("idle");
        let ps = kv.store.page_size();
        let in_working = t.len() - t.num_committed() * ps;
        if n > in_working {
            return Err(KvError::TruncateTooFar {
                wanted: n,
                fill: in_working,
            }
            .into());
        }
        kv.store.truncate(t, n)?;
        Ok(())
    }

    /// Counts of pages in each state, for tests that check nothing leaked.
    pub(crate) fn page_counts(&self) -> (usize, usize) {
        let st = &self.kv.store;
        (st.count(PageState::Free), st.count(PageState::Cached))
    }
}

/// A program's sequence in the engine. Dropping it releases its pages (snapshots
/// keep theirs).
pub struct Context {
    engine: Engine,
    id: u64,
}

impl Context {
    pub(crate) fn new(engine: Engine, id: u64) -> Self {
        Self { engine, id }
    }

    /// Appends token ids (computed at the next flush or generate).
    pub fn append_tokens(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let (id, t) = (self.id, tokens.to_vec());
        self.engine.call(move |c| c.ctx_append(id, t))?
    }

    /// Appends text (special-token text becomes the special token; a BOS goes first
    /// when the context is empty and the model wants one).
    pub fn append_text(&self, text: &str) -> Result<(), EngineError> {
        let (id, text) = (self.id, text.to_string());
        self.engine.call(move |c| {
            let empty = c.ctx_is_empty(id)?;
            let toks = c.model.tokenizer.encode(&text, empty);
            c.ctx_append(id, toks)
        })?
    }

    /// Appends a chat message rendered with the model's template.
    pub fn message(&self, role: Role, text: &str) -> Result<(), EngineError> {
        let (id, text) = (self.id, text.to_string());
        self.engine.call(move |c| c.ctx_message(id, role, text))?
    }

    pub fn system(&self, text: &str) -> Result<(), EngineError> {
        self.message(Role::System, text)
    }

    pub fn user(&self, text: &str) -> Result<(), EngineError> {
        self.message(Role::User, text)
    }

    pub fn assistant(&self, text: &str) -> Result<(), EngineError> {
        self.message(Role::Assistant, text)
    }

    /// Computes every pending token (their full pages are committed and shareable).
    pub fn flush(&self) -> Result<(), EngineError> {
        let id = self.id;
        let rx = self.engine.call(move |c| c.ctx_flush(id))??;
        rx.recv()
            .map_err(|_| EngineError::Closed)?
            .map_err(EngineError::Invalid)
    }

    /// Generates a continuation of everything the context holds (plus `req.prompt`,
    /// appended first). The tokens stream like a request's, and end up in the context.
    pub fn generate(&self, req: Request) -> Result<Stream, EngineError> {
        self.start(req, false)
    }

    /// Like [`Context::generate`] for a chat: appends the template's generation prompt
    /// first, and records the reply as the assistant's message when it ends.
    pub fn reply(&self, req: Request) -> Result<Stream, EngineError> {
        self.start(req, true)
    }

    fn start(&self, req: Request, chat: bool) -> Result<Stream, EngineError> {
        let id = self.id;
        let rid = self
            .engine
            .shared
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = channel();
        self.engine
            .call(move |c| c.ctx_generate(id, rid, req, chat, tx))??;
        Ok(Stream {
            id: rid,
            rx,
            shared: self.engine.shared.clone(),
            done: false,
        })
    }

    /// A new context with the same tokens: committed pages shared, the partial page
    /// copied.
    pub fn fork(&self) -> Result<Context, EngineError> {
        let id = self.id;
        let new = self.engine.call(move |c| c.ctx_fork(id))??;
        Ok(Context::new(self.engine.clone(), new))
    }

    /// Drops the last `n` tokens (pending ones first). Crossing into a committed page
    /// copies its kept part; the shared page is never changed.
    pub fn truncate(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.ctx_truncate(id, n))?
    }

    /// Counters: seq_len, page_size, committed and working pages.
    pub fn info(&self) -> Result<ContextInfo, EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.ctx_info(id))?
    }

    /// The tokens held, computed then pending.
    pub fn tokens(&self) -> Result<Vec<u32>, EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.ctx_tokens(id))?
    }

    /// Pins the context's pages under `name` (persisted with a snapshot directory).
    pub fn save(&self, name: &str) -> Result<(), EngineError> {
        self.flush()?;
        let (id, name) = (self.id, name.to_string());
        self.engine.call(move |c| c.ctx_save(id, name))?
    }

    /// A new context sharing snapshot `name`'s pages.
    pub fn load(engine: &Engine, name: &str) -> Result<Context, EngineError> {
        let name = name.to_string();
        let id = engine.call(move |c| c.ctx_load(name))??;
        Ok(Context::new(engine.clone(), id))
    }

    /// Unpins snapshot `name` (and removes its file).
    pub fn delete(engine: &Engine, name: &str) -> Result<(), EngineError> {
        let name = name.to_string();
        engine.call(move |c| c.kv.delete(&name).map_err(EngineError::from))?
    }

    /// Raw page operations, for hand-written loops (see the seed's manual pages).
    /// Reserves `n` working pages ahead, so later input does not wait on allocation.
    pub fn reserve_working_pages(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.raw_reserve(id, n))?
    }

    /// Commits the first `k` full working pages (an error if the k-th is partial).
    pub fn commit_working_pages(&self, k: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.raw_commit(id, k))?
    }

    /// Releases `n` working pages from the tail (reserved spares first).
    pub fn release_working_pages(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.raw_release(id, n))?
    }

    /// Drops the last `n` tokens within the working pages (never a committed one).
    pub fn truncate_working_page_tokens(&self, n: usize) -> Result<(), EngineError> {
        let id = self.id;
        self.engine.call(move |c| c.raw_truncate_working(id, n))?
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let id = self.id;
        let _ = self
            .engine
            .shared
            .tx
            .send(super::Cmd::Call(Box::new(move |c| c.ctx_drop(id))));
    }
}

impl Engine {
    /// (free, cached) page counts: after a drain, every page is one or the other.
    pub fn idle_pages(&self) -> Result<(usize, usize), EngineError> {
        self.call(|c| c.page_counts())
    }
}
