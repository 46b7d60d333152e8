//! The disk tier: committed pages kept in files under the pool, content-addressed by
//! their chained hash, so a prefix the pool evicted (or a restarted server never
//! computed) is read back instead of recomputed.
//!
//! - Write-behind: every page that enters the prefix index is copied (on the engine
//!   thread: one memcpy of the page) into a bounded queue; a writer thread writes it
//!   whole to a temporary file and renames it into place, so a file under its final
//!   name is always complete. A full queue drops the write (counted): the tier is a
//!   cache and never slows the step down.
//! - Read-back: a prefix lookup that runs out of pages in memory continues here
//!   (`pool.rs`). While other sequences run, a prompt whose prefix continues on disk
//!   waits to be admitted until a thread of its own has read the run's files, so the
//!   reads overlap the steps; with nothing else running the files are read ahead in
//!   page order on a reader thread while the engine thread works through them. Each
//!   is checked before it is copied into a free page: the whole file's checksum, its
//!   pool, its hash chained from its parent and tokens, and the tokens against the
//!   prompt's. Anything else is skipped, logged with the reason, and its file removed.
//! - LRU by bytes on disk (`--kv-disk-size`); the index is rebuilt from the files at
//!   start (least recently used by modification time, which a hit refreshes), so a
//!   restarted server keeps its prefix cache. Leftover temporary files are removed.
//!
//! Files live in `DIR/<pool root>/`, one directory per model, page size and K/V type.
//! One pool at a time owns a directory (an advisory lock, taken at start, released
//! when the pool is dropped or the process ends).

mod file;
mod index;
mod pool;

use super::hash::PageHash;
use file::{Bad, Expect, PageFile, PageRead};
use index::DiskIndex;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

/// Pages the write-behind queue holds before it drops writes.
const QUEUE_PAGES: usize = 256;

/// Where the disk tier keeps pages, and how many bytes it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// The disk tier's figures (metrics and the page map).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiskStats {
    /// Pages and bytes on disk, and the limit.
    pub pages: usize,
    pub bytes: u64,
    pub max_bytes: u64,
    /// Pages read back into the pool.
    pub hits: u64,
    /// Prefix lookups that ran out of pages in memory and found none on disk either.
    pub misses: u64,
    /// Seconds spent reading and checking the pages read back.
    pub read_seconds: f64,
    /// Pages written, and pages waiting in the write-behind queue.
    pub writes: u64,
    pub queued: u64,
    /// Writes dropped (queue full), failed (I/O error, full disk), and files skipped as
    /// unusable (corrupt, cut short, another pool's).
    pub dropped: u64,
    pub write_errors: u64,
    pub skipped: u64,
    /// Pages read ahead while other sequences' steps ran (a prompt waiting for its
    /// prefix from disk is admitted once they are read).
    pub prefetched: u64,
}

/// Opening the disk tier's directory failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DiskError {
    #[error("the KV disk directory {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("the KV disk directory {0} is in use by another process")]
    Locked(PathBuf),
}

impl DiskError {
    /// An operator's setting, never a request's fault.
    pub fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::Internal
    }
}

/// What opening found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskOpened {
    pub dir: PathBuf,
    pub pages: usize,
    pub bytes: u64,
    /// Files skipped as unusable (each logged, and removed where it could be: a
    /// directory named as a page stays) and unfinished writes removed.
    pub skipped: usize,
    pub unfinished: usize,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    read_nanos: AtomicU64,
    writes: AtomicU64,
    queued: AtomicU64,
    dropped: AtomicU64,
    write_errors: AtomicU64,
    skipped: AtomicU64,
    prefetched: AtomicU64,
}

/// State the engine thread and the writer share.
struct Shared {
    dir: PathBuf,
    expect: Expect,
    index: Mutex<DiskIndex>,
    counters: Counters,
}

impl Shared {
    fn index(&self) -> MutexGuard<'_, DiskIndex> {
        // A writer that panicked mid-update leaves an index still worth reading.
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, h: PageHash) -> PathBuf {
        self.dir.join(format!("{:032x}.page", h.0))
    }

    /// Checks a file read back as page `h` after `parent` holding `tokens`: the page,
    /// or `None` (skipped, logged and removed).
    fn check(
        &self,
        h: PageHash,
        parent: PageHash,
        tokens: &[u32],
        data: Option<Vec<u8>>,
    ) -> Option<PageRead> {
        let path = self.path(h);
        let Some(data) = data else {
            // Evicted (and removed) by the writer after the lookup: a plain miss.
            self.index().remove(&h);
            return None;
        };
        let why: Box<dyn std::fmt::Display> = match file::decode(&self.expect, data) {
            Ok(p) if p.hash == h && p.parent == parent && p.tokens == tokens => return Some(p),
            Ok(_) => Box::new("its parent or tokens are not the prompt's"),
            Err(e) => Box::new(e),
        };
        self.index().remove(&h);
        self.skip(&path, &*why);
        None
    }

    /// The bytes of the page file at `path`, at most a page's and one (a longer file
    /// is no page, and its check says so), or `None` where it cannot be read. A file
    /// that is not a regular one (a FIFO, a directory, a link) is skipped here: the
    /// caller takes `None` for a file the writer evicted meanwhile, a plain miss.
    fn read(&self, path: &Path) -> Option<Vec<u8>> {
        let f = match open_page(path, false) {
            Ok(f) => f,
            Err(e) => {
                let irregular = e.kind() == std::io::ErrorKind::InvalidInput
                    || e.raw_os_error() == Some(libc::ELOOP);
                if irregular {
                    self.skip(path, &e);
                }
                return None;
            }
        };
        let most = self.expect.file_len();
        let mut data = Vec::with_capacity(usize::try_from(most).unwrap_or(0));
        f.take(most.saturating_add(1)).read_to_end(&mut data).ok()?;
        Some(data)
    }

    fn skip(&self, path: &Path, why: &dyn std::fmt::Display) {
        self.counters.skipped.fetch_add(1, Ordering::Relaxed);
        match fs::remove_file(path) {
            Ok(()) => tracing::warn!("kv disk: skipped {}: {why}; removed", path.display()),
            Err(e) => tracing::warn!(
                "kv disk: skipped {}: {why}; not removed: {e}",
                path.display()
            ),
        }
    }

    /// Writes one page whole under a temporary name, then renames it into place.
    fn write(&self, page: &PageFile, seq: u64) {
        let bytes = self.expect.file_len();
        if self.index().contains(&page.hash) || !self.index().fits(bytes) {
            return;
        }
        let data = file::encode(&self.expect, page);
        let tmp = self.dir.join(format!(
            ".{:032x}.{}.{seq}.tmp",
            page.hash.0,
            std::process::id()
        ));
        // A new file, never one already there (a link planted under the name would
        // have the page written through it, outside the directory; a FIFO would
        // block the writer); whatever sits under the name is removed below.
        let done = open_safely(&tmp, fs::OpenOptions::new().write(true).create_new(true))
            .and_then(|mut f| f.write_all(&data))
            .and_then(|()| fs::rename(&tmp, self.path(page.hash)));
        if let Err(e) = done {
            let _ = fs::remove_file(&tmp);
            let n = self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            // A full disk fails every write: say so once in a while, not per page.
            if n.is_power_of_two() || n == 0 {
                tracing::warn!(
                    "kv disk: writing a page failed ({e}); {} writes failed so far",
                    n + 1
                );
            }
            return;
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        let evicted = self.index().insert(page.hash, bytes);
        for h in evicted {
            let _ = fs::remove_file(self.path(h));
        }
    }
}

/// What the writer thread is asked to do, in order.
enum Job {
    Write(PageFile),
    /// Pages used again: refresh their files' modification times.
    Touch(Vec<PageHash>),
    /// Answer once every write queued before this one is done.
    Flush(SyncSender<()>),
}

/// The disk tier of one pool.
pub struct DiskTier {
    shared: Arc<Shared>,
    queue: Option<SyncSender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Runs of pages being read ahead for prompts waiting to be admitted.
    prefetches: Vec<Prefetch>,
    /// The directory's lock, released when the tier is dropped.
    _lock: fs::File,
}

/// Files of a run of pages read ahead on a thread of their own, while steps go on.
struct Prefetch {
    hashes: Vec<PageHash>,
    reader: std::thread::JoinHandle<Vec<Option<Vec<u8>>>>,
}

/// Read-aheads kept at most (a prompt that never came to be admitted leaves one).
const PREFETCHES: usize = 8;

impl DiskTier {
    /// Opens (creating) `cfg.dir/<root>/`, takes its lock, removes unfinished writes and
    /// unusable files, indexes the rest, and starts the writer.
    fn open(cfg: &DiskConfig, expect: Expect) -> Result<(Self, DiskOpened), DiskError> {
        let dir = cfg.dir.join(format!("{:032x}", expect.root.0));
        let io = |e: std::io::Error| DiskError::Io {
            path: dir.clone(),
            message: e.to_string(),
        };
        fs::create_dir_all(&dir).map_err(io)?;
        let lock = lock(&dir)?;
        let mut opened = DiskOpened {
            dir: dir.clone(),
            ..Default::default()
        };
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            expect,
            index: Mutex::new(DiskIndex::new(cfg.max_bytes)),
            counters: Counters::default(),
        });
        let mut found: Vec<(SystemTime, PageHash)> = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io)? {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                opened.unfinished += 1;
                continue;
            }
            if !name.ends_with(".page") {
                continue;
            }
            match read_header(&path, &expect) {
                Ok((h, mtime)) if path == shared.path(h) => found.push((mtime, h)),
                Ok(_) => {
                    shared.skip(&path, &"its name is not its page hash");
                    opened.skipped += 1;
                }
                Err(why) => {
                    shared.skip(&path, &why);
                    opened.skipped += 1;
                }
            }
        }
        found.sort();
        {
            let mut ix = shared.index();
            for (_, h) in found {
                for old in ix.insert(h, expect.file_len()) {
                    let _ = fs::remove_file(shared.path(old));
                }
            }
            opened.pages = ix.len();
            opened.bytes = ix.bytes();
        }
        let (tx, rx) = sync_channel::<Job>(QUEUE_PAGES);
        let w = shared.clone();
        let writer = std::thread::Builder::new()
            .name("folio-kv-disk".into())
            .spawn(move || {
                let mut seq = 0u64;
                while let Ok(job) = rx.recv() {
                    match job {
                        Job::Write(page) => {
                            w.write(&page, seq);
                            w.counters.queued.fetch_sub(1, Ordering::Relaxed);
                            seq += 1;
                        }
                        Job::Touch(hashes) => {
                            // The LRU order a restart rebuilds: files' modification times.
                            let now = SystemTime::now();
                            for h in hashes {
                                if let Ok(f) = open_page(&w.path(h), true) {
                                    let _ = f.set_modified(now);
                                }
                            }
                        }
                        Job::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .map_err(io)?;
        Ok((
            Self {
                shared,
                queue: Some(tx),
                writer: Some(writer),
                prefetches: Vec::new(),
                _lock: lock,
            },
            opened,
        ))
    }

    /// Whether the disk holds the page with hash `h`.
    fn has(&self, h: PageHash) -> bool {
        self.shared.index().contains(&h)
    }

    /// Queues a page for writing; a full queue drops it.
    fn submit(&self, page: PageFile) {
        let Some(q) = &self.queue else { return };
        self.shared.counters.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            q.try_send(Job::Write(page))
        {
            self.shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
            self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Marks pages used again (those the disk holds): most recently used now, and
    /// after a restart (their files' times are refreshed behind).
    fn touch(&self, mut hashes: Vec<PageHash>) {
        {
            let mut ix = self.shared.index();
            hashes.retain(|h| ix.contains(h));
            for h in &hashes {
                ix.touch(h);
            }
        }
        if let (Some(q), false) = (&self.queue, hashes.is_empty()) {
            let _ = q.try_send(Job::Touch(hashes));
        }
    }

    /// Whether the run of pages `hashes` is being read ahead: starts reading it (on a
    /// thread of its own) if nobody is, and answers `false` once it is read, when the
    /// prompt can be admitted and [`DiskTier::read_run`] takes the files.
    fn prefetching(&mut self, hashes: &[PageHash]) -> bool {
        if let Some(p) = self.prefetches.iter().find(|p| p.hashes[0] == hashes[0]) {
            return !p.reader.is_finished();
        }
        if self.prefetches.len() >= PREFETCHES {
            // The oldest read-ahead's prompt went away (or waits behind many others).
            self.prefetches.remove(0);
        }
        let paths: Vec<PathBuf> = hashes.iter().map(|&h| self.shared.path(h)).collect();
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("folio-kv-read".into())
            .spawn(move || paths.iter().map(|p| shared.read(p)).collect());
        match spawned {
            Ok(reader) => {
                self.shared
                    .counters
                    .prefetched
                    .fetch_add(hashes.len() as u64, Ordering::Relaxed);
                self.prefetches.push(Prefetch {
                    hashes: hashes.to_vec(),
                    reader,
                });
                true
            }
            Err(_) => false,
        }
    }

    /// Hands the files of `hashes` to `take` in order (a file that cannot be read comes
    /// as `None`) until it answers `false`: those read ahead for this run, the rest
    /// read on a reader thread as `take` works through them.
    fn read_run(&mut self, hashes: &[PageHash], mut take: impl FnMut(Option<Vec<u8>>) -> bool) {
        let mut ahead: Vec<Option<Vec<u8>>> = Vec::new();
        if let Some(i) = self
            .prefetches
            .iter()
            .position(|p| p.hashes[0] == hashes[0])
        {
            let p = self.prefetches.swap_remove(i);
            let n = p
                .hashes
                .iter()
                .zip(hashes)
                .take_while(|(a, b)| a == b)
                .count();
            ahead = p.reader.join().unwrap_or_default();
            ahead.truncate(n);
        }
        let done = ahead.len();
        for data in ahead {
            if !take(data) {
                return;
            }
        }
        let (tx, rx) = sync_channel::<Option<Vec<u8>>>(4);
        let paths: Vec<PathBuf> = hashes[done..]
            .iter()
            .map(|&h| self.shared.path(h))
            .collect();
        let shared = &*self.shared;
        std::thread::scope(|s| {
            s.spawn(move || {
                for p in paths {
                    if tx.send(shared.read(&p)).is_err() {
                        break;
                    }
                }
            });
            for data in rx.iter() {
                if !take(data) {
                    break;
                }
            }
            // Stopped early: the reader's next send fails and it ends (the scope waits
            // for it, so the receiver must go first).
            drop(rx);
        });
    }

    fn stats(&self) -> DiskStats {
        let c = &self.shared.counters;
        let ix = self.shared.index();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskStats {
            pages: ix.len(),
            bytes: ix.bytes(),
            max_bytes: ix.max_bytes(),
            hits: get(&c.hits),
            misses: get(&c.misses),
            read_seconds: get(&c.read_nanos) as f64 * 1e-9,
            writes: get(&c.writes),
            queued: get(&c.queued),
            dropped: get(&c.dropped),
            write_errors: get(&c.write_errors),
            skipped: get(&c.skipped),
            prefetched: get(&c.prefetched),
        }
    }

    fn count_read(&self, since: Instant, hits: u64) {
        let c = &self.shared.counters;
        c.read_nanos
            .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.hits.fetch_add(hits, Ordering::Relaxed);
    }

    fn count_miss(&self) {
        self.shared.counters.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until every page queued so far is written.
    fn flush(&self) {
        let Some(q) = &self.queue else { return };
        let (tx, rx) = sync_channel(1);
        if q.send(Job::Flush(tx)).is_ok() {
            let _ = rx.recv();
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // Finish the queued writes: a clean shutdown keeps every page.
        self.queue.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The page hash a file's header claims, and its modification time.
fn read_header(path: &Path, e: &Expect) -> Result<(PageHash, SystemTime), String> {
    let mut f = open_page(path, false).map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    let mut head = Vec::with_capacity(file::HEADER);
    (&mut f)
        .take(file::HEADER as u64)
        .read_to_end(&mut head)
        .map_err(|e| e.to_string())?;
    let h = file::check_header(e, &head, meta.len()).map_err(|b: Bad| b.to_string())?;
    Ok((h, meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
}

/// Opens `path` as a page file, for reading or (`write`) for its modification time
/// ([`open_safely`]).
fn open_page(path: &Path, write: bool) -> std::io::Result<fs::File> {
    open_safely(path, fs::OpenOptions::new().read(!write).write(write))
}

/// Opens `path` with `o` as the tier opens every file of its directory: only a
/// regular file, a symbolic link not followed (a link's target may lie outside the
/// directory), and a FIFO or a device opened without blocking (a FIFO's open waits
/// for the other end for ever; for writing, one without a reader is an error at
/// once) and then refused. (The snapshot directory's headers are read so too.)
pub(super) fn open_safely(path: &Path, o: &mut fs::OpenOptions) -> std::io::Result<fs::File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// Takes an advisory lock on `dir`, held while the returned file is open (the OS
/// releases it however the process ends).
fn lock(dir: &Path) -> Result<fs::File, DiskError> {
    let path = dir.join("lock");
    let f = open_safely(
        &path,
        fs::File::options().create(true).truncate(false).write(true),
    )
    .map_err(|e| DiskError::Io {
        path: path.clone(),
        message: e.to_string(),
    })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(fs::TryLockError::WouldBlock) => Err(DiskError::Locked(dir.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => Err(DiskError::Io {
            path,
            message: e.to_string(),
        }),
    }
}
