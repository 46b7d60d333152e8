//! The Context API on a tiny random model (fast) and the default model's chat
//! template: append and flush, generate into the context, O(1) fork, truncate across a
//! committed page, snapshots (also across an engine restart), raw page operations.

use crate::common;

use crate::common::ModelExt;
use folio::engine::{Context, Engine, EngineConfig, EngineError, Prompt, Request};
use folio::gguf::GgmlType;
use folio::kv::KvError;
use folio::kv::Logits;
use folio::model::{Model, SamplingParams};
use folio::tokenizer::Message;

fn tiny_engine(dir: &tempfile::TempDir, snapshots: Option<std::path::PathBuf>) -> Engine {
    let path = dir.path().join("tiny.gguf");
    if !path.exists() {
        folio::tiny::write_model(&path, 3, GgmlType::Q4_1).unwrap();
    }
    let m = Model::load(&path, 1).unwrap();
    let cfg = EngineConfig {
        kv_pages: 64,
        page_size: 4,
        max_batch_tokens: 32,
        snapshot_dir: snapshots,
        ..Default::default()
    };
    Engine::new(m, cfg).unwrap()
}

fn greedy(max_tokens: usize) -> Request {
    let mut r = Request::new(Prompt::Tokens(vec![]));
    r.max_tokens = max_tokens;
    r.sampling = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    r.ignore_eos = true;
    r
}

#[test]
fn append_flush_generate_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let e = tiny_engine(&dir, None);
    let ctx = e.context(None).unwrap();
    let toks: Vec<u32> = (0..10).map(|i| 40 + i).collect();
    ctx.append_tokens(&toks).unwrap();
    let info = ctx.info().unwrap();
    assert_eq!(
        (info.seq_len, info.pending_tokens, info.committed_pages),
        (10, 10, 0)
    );
    ctx.flush().unwrap();
    let info = ctx.info().unwrap();
    assert_eq!(info.seq_len, 10);
    assert_eq!(info.pending_tokens, 0);
    assert_eq!(info.page_size, 4);
    assert_eq!((info.committed_pages, info.working_pages), (2, 1));
    // Generate 6 tokens: they stream and end up in the context.
    let out = ctx.generate(greedy(6)).unwrap().collect_all().unwrap();
    assert_eq!(out[0].ids.len(), 6);
    let all = ctx.tokens().unwrap();
    assert_eq!(all[..10], toks[..]);
    assert_eq!(all[10..], out[0].ids[..]);
    // The same as the model alone on a contiguous cache.
    let path = dir.path().join("tiny.gguf");
    let m = Model::load(&path, 1).unwrap();
    let mut c = m.new_cache(64);
    let mut seq = toks.clone();
    for _ in 0..6 {
        let at = c_len(&c);
        let l = m.run(&mut c, &seq[at..], Logits::Last).unwrap();
        seq.push(folio::model::sampler::argmax(&l));
    }
    assert_eq!(seq, all);
    // A second generation continues from there.
    let more = ctx.generate(greedy(3)).unwrap().collect_all().unwrap();
    assert_eq!(ctx.tokens().unwrap().len(), 19);
    assert_eq!(ctx.tokens().unwrap()[16..], more[0].ids[..]);
}

fn c_len(c: &folio::kv::BasicCache) -> usize {
    folio::kv::KvSeq::len(c)
}

#[test]
fn fork_shares_pages_and_truncate_never_touches_the_shared_ones() {
    let dir = tempfile::tempdir().unwrap();
    let e = tiny_engine(&dir, None);
    let a = e.context(None).unwrap();
    a.append_tokens(&(0..14).map(|i| 50 + i).collect::<Vec<u32>>())
        .unwrap();
    a.flush().unwrap();
    let shared_before = e.stats().unwrap().pages_shared;
    let b = a.fork().unwrap();
    assert_eq!(b.tokens().unwrap(), a.tokens().unwrap());
    assert_eq!(b.info().unwrap().committed_pages, 3);
    assert_eq!(e.stats().unwrap().pages_shared, shared_before + 3);
    // b rolls back across a committed boundary and diverges; a is unchanged.
    b.truncate(5).unwrap();
    assert_eq!(b.tokens().unwrap().len(), 9);
    // The page store's invariants hold with the shared pages, the copied one and a
    // context's pages reserved ahead.
    b.reserve_working_pages(2).unwrap();
    e.check_invariants().unwrap();
    b.release_working_pages(2).unwrap();
    let gb = b.generate(greedy(4)).unwrap().collect_all().unwrap();
    assert_eq!(gb[0].ids.len(), 4);
    assert_eq!(
        a.tokens().unwrap(),
        (0..14).map(|i| 50 + i).collect::<Vec<u32>>()
    );
    let ga = a.generate(greedy(4)).unwrap().collect_all().unwrap();
    // a's continuation equals a fresh context with a's tokens.
    let c = e.context(None).unwrap();
    c.append_tokens(&(0..14).map(|i| 50 + i).collect::<Vec<u32>>())
        .unwrap();
    let gc = c.generate(greedy(4)).unwrap().collect_all().unwrap();
    assert_eq!(ga[0].ids, gc[0].ids);
    e.check_invariants().unwrap();
    drop((a, b, c));
    let st = e.stats().unwrap();
    let (free, cached) = e.idle_pages().unwrap();
    assert_eq!(free + cached, 64, "{st:?}");
    e.check_invariants().unwrap();
}

#[test]
fn snapshots_outlive_contexts_and_engines() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    let toks: Vec<u32> = (0..11).map(|i| 60 + i).collect();
    {
        let e = tiny_engine(&dir, Some(snaps.clone()));
        let ctx = e.context(None).unwrap();
        ctx.append_tokens(&toks).unwrap();
        ctx.save("base").unwrap();
        drop(ctx);
        let loaded = Context::load(&e, "base").unwrap();
        assert_eq!(loaded.tokens().unwrap(), toks);
        assert!(matches!(
            Context::load(&e, "nope"),
            Err(EngineError::Snapshot(_))
        ));
        assert!(matches!(
            ctx_save_bad_name(&e),
            Err(EngineError::Snapshot(_))
        ));
        e.shutdown();
    }
    // A new engine restores it from disk, and a corrupt file is skipped, not loaded.
    std::fs::write(snaps.join("junk.snap"), b"not a snapshot").unwrap();
    let e = tiny_engine(&dir, Some(snaps.clone()));
    assert_eq!(e.snapshots().unwrap(), vec!["base".to_string()]);
    let ctx = Context::load(&e, "base").unwrap();
    assert_eq!(ctx.tokens().unwrap(), toks);
    let out = ctx.generate(greedy(2)).unwrap().collect_all().unwrap();
    assert_eq!(out[0].ids.len(), 2);
    Context::delete(&e, "base").unwrap();
    assert!(Context::load(&e, "base").is_err());
    assert!(e.snapshots().unwrap().is_empty());
}

/// A save whose deadline has passed by the time its flush would end is refused with
/// `TimedOut`: the flush is stopped, nothing is saved (the earlier snapshot of that
/// name stays, in memory and on disk, byte for byte), the context keeps every token
/// and can be flushed and saved afterwards. A bad name is refused before any flush.
#[test]
fn a_save_past_its_deadline_is_cancelled_and_keeps_the_old_snapshot() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    let e = tiny_engine(&dir, Some(snaps.clone()));
    let old: Vec<u32> = (0..5).map(|i| 70 + i).collect();
    let first = e.context(None).unwrap();
    first.append_tokens(&old).unwrap();
    first.save("notes").unwrap();
    let file = std::fs::read(snaps.join("notes.snap")).unwrap();
    let limit = Duration::from_secs(3);
    let ctx = e.context(None).unwrap();
    let toks: Vec<u32> = (0..60).map(|i| 40 + i).collect();
    ctx.append_tokens(&toks).unwrap();
    let past = Some((Instant::now(), limit));
    assert!(matches!(
        ctx.save_by("notes", past),
        Err(EngineError::TimedOut { limit: l }) if l == limit
    ));
    assert_eq!(ctx.tokens().unwrap(), toks);
    assert_eq!(ctx.info().unwrap().seq_len, 60);
    assert_eq!(e.snapshot_list().unwrap(), vec![("notes".to_string(), 5)]);
    assert_eq!(std::fs::read(snaps.join("notes.snap")).unwrap(), file);
    let st = e.stats().unwrap();
    assert_eq!((st.running, st.waiting), (0, 0), "{st:?}");
    e.check_invariants().unwrap();
    // A bad name: refused before the flush (what is pending stays pending).
    let pending = ctx.info().unwrap().pending_tokens;
    assert!(matches!(
        ctx.save_by("../escape", None),
        Err(EngineError::Snapshot(_))
    ));
    assert_eq!(ctx.info().unwrap().pending_tokens, pending);
    // In time, the same context flushes and saves.
    ctx.save_by(
        "notes",
        Some((Instant::now() + Duration::from_secs(600), limit)),
    )
    .unwrap();
    assert_eq!(e.snapshot_list().unwrap(), vec![("notes".to_string(), 60)]);
    assert_eq!(Context::load(&e, "notes").unwrap().tokens().unwrap(), toks);
    e.check_invariants().unwrap();
}

/// Text appended to a context is tokenized as the tokenizer does it: with the BOS
/// rules of a first piece while the context is empty, without after.
#[test]
fn append_text_tokenizes_as_the_tokenizer_with_bos_only_first() {
    let dir = tempfile::tempdir().unwrap();
    let e = tiny_engine(&dir, None);
    let tok = &e.model().tokenizer;
    let ctx = e.context(None).unwrap();
    ctx.append_text("hello world").unwrap();
    ctx.append_text(" and more").unwrap();
    let mut want = tok.encode("hello world", true);
    want.extend(tok.encode(" and more", false));
    assert_eq!(ctx.tokens().unwrap(), want);
}

fn ctx_save_bad_name(e: &Engine) -> Result<(), EngineError> {
    let c = e.context(None)?;
    c.append_tokens(&[1, 2, 3])?;
    c.save("../escape")
}

#[test]
fn raw_page_operations_and_their_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = tiny_engine(&dir, None);
    let ctx = e.context(None).unwrap();
    ctx.reserve_working_pages(3).unwrap();
    assert_eq!(ctx.info().unwrap().spare_pages, 3);
    assert!(matches!(
        ctx.reserve_working_pages(1000),
        Err(EngineError::Kv(KvError::OutOfPages { .. }))
    ));
    ctx.release_working_pages(1).unwrap();
    assert_eq!(ctx.info().unwrap().spare_pages, 2);
    ctx.append_tokens(&[70, 71, 72, 73, 74, 75]).unwrap();
    ctx.flush().unwrap();
    let info = ctx.info().unwrap();
    assert_eq!(
        (info.committed_pages, info.working_pages, info.spare_pages),
        (1, 1, 0)
    );
    // The working page holds 2 of 4 tokens: it cannot be committed.
    assert!(matches!(
        ctx.commit_working_pages(1),
        Err(EngineError::Kv(KvError::CommitPartial { fill: 2, .. }))
    ));
    ctx.commit_working_pages(0).unwrap();
    // Only working tokens can be dropped this way.
    assert!(matches!(
        ctx.truncate_working_page_tokens(3),
        Err(EngineError::Kv(KvError::TruncateTooFar { .. }))
    ));
    ctx.truncate_working_page_tokens(1).unwrap();
    assert_eq!(ctx.tokens().unwrap(), vec![70, 71, 72, 73, 74]);
    ctx.release_working_pages(1).unwrap();
    assert_eq!(ctx.tokens().unwrap(), vec![70, 71, 72, 73]);
    assert!(ctx.release_working_pages(1).is_err());
}

#[test]
fn chat_helpers_render_the_models_template() {
    let e = Engine::new(
        Model::load(&common::model_path(), 2).unwrap(),
        EngineConfig::default(),
    )
    .unwrap();
    let tok = &e.model().tokenizer;
    let template = tok.chat_template().unwrap();
    let ctx = e.context(None).unwrap();
    ctx.system("You are terse.").unwrap();
    ctx.user("Name a colour.").unwrap();
    let mut msgs = vec![
        Message::new("system", "You are terse."),
        Message::new("user", "Name a colour."),
    ];
    let want = tok.encode(&template.render(&msgs, false).unwrap(), true);
    assert_eq!(ctx.tokens().unwrap(), want);
    let mut r = Request::new(Prompt::Tokens(vec![]));
    r.max_tokens = 12;
    let reply = ctx.reply(r).unwrap().collect_all().unwrap();
    // After the reply the context holds exactly the template's rendering of the chat.
    msgs.push(Message::new("assistant", reply[0].text.trim()));
    ctx.user("Another one.").unwrap();
    msgs.push(Message::new("user", "Another one."));
    let rendered = template.render(&msgs, false).unwrap();
    let held = tok.decode_special(&ctx.tokens().unwrap());
    assert_eq!(held, rendered, "finish {:?}", reply[0].finish);
}

/// A context scores its request's own prompt tokens: the figures are a plain
/// request's prompt log-probabilities of the same tokens, bit for bit, whether the
/// context's last token was computed already (flushed: its row is recomputed),
/// pending, or its tokens sit in the prefix cache; and the earlier tokens get none.
#[test]
fn a_context_scores_its_own_prompt_tokens_as_a_request_does() {
    let dir = tempfile::tempdir().unwrap();
    let e = tiny_engine(&dir, None);
    let all: Vec<u32> = (1..40).map(|i| (i * 7 % 60) as u32 + 3).collect();
    let (head, tail) = all.split_at(23);
    let mut req = greedy(1);
    req.prompt = Prompt::Tokens(all.clone());
    req.prompt_logprobs = Some(3);
    let want =
        e.submit(req).unwrap().collect_all().unwrap()[0].prompt_logprobs[head.len() - 1..].to_vec();
    assert_eq!(want.len(), tail.len());
    for flushed in [true, false] {
        let ctx = e.context(None).unwrap();
        ctx.append_tokens(head).unwrap();
        if flushed {
            ctx.flush().unwrap();
        }
        let mut r = greedy(1);
        r.prompt = Prompt::Tokens(tail.to_vec());
        r.prompt_logprobs = Some(3);
        let mut got = Vec::new();
        for ev in ctx.generate(r).unwrap() {
            if let folio::engine::Event::PromptLogprobs(lp) = ev {
                got = lp;
            }
        }
        let bits = |v: &[folio::engine::TokenLogprob]| {
            v.iter()
                .map(|l| {
                    let top: Vec<(u32, u32)> =
                        l.top.iter().map(|&(t, p)| (t, p.to_bits())).collect();
                    (l.logprob.to_bits(), top)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got), bits(&want), "flushed {flushed}");
        assert_eq!(ctx.info().unwrap().seq_len, all.len() + 1);
    }
    // Nothing to score is refused.
    let ctx = e.context(None).unwrap();
    ctx.append_tokens(head).unwrap();
    let mut r = greedy(1);
    r.prompt_logprobs = Some(1);
    match ctx.generate(r) {
        Err(err) => assert!(err.to_string().contains("prompt_logprobs"), "{err}"),
        Ok(_) => panic!("scoring nothing was accepted"),
    }
}
