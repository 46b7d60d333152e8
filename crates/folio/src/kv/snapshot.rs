//! Named snapshots: `save` pins a sequence's pages under a name (they outlive the
//! sequence and are never evicted), `load` gives a new sequence sharing them, `delete`
//! unpins. With a snapshot directory each snapshot is also a file, written atomically
//! (a temporary file under an unpredictable name, created exclusively and never through
//! a symbolic link; fsync; rename; fsync of the directory), checksummed and tagged with
//! the model fingerprint; files are restored at start, and a corrupt, foreign or
//! invalid one (a token outside the vocabulary, non-finite K/V) is reported and skipped.
//!
//! A save with a directory runs in three parts, so the pool's owner (the engine thread)
//! only does page bookkeeping: [`PagedKv::begin_save`] pins the pages (a fork of the
//! table) and reserves the file's size against the quota ([`SnapshotLimits`]); the
//! caller serializes, hashes, writes and syncs the file on its own thread
//! ([`SaveTicket::write`]), fetching the K/V of the pinned pages in bounded chunks
//! ([`PagedKv::save_chunk`]: pinned pages are never written, so any chunk reads the
//! same bytes whenever it is fetched); [`Written::publish`] renames the file into place
//! and records the snapshot ([`PagedKv::finish_save`]) under one lock, or
//! [`PagedKv::abort_save`] releases the pin. A failed save leaves an older snapshot of
//! that name as it was, in memory and on disk. Two saves of one name may run at once:
//! the one that publishes last is the snapshot, on disk and in memory alike (rename
//! and record happen under the directory's lock, and so does a delete).
//!
//! Several processes (replicas) may share one directory. Each save's temporary file
//! has its own unpredictable name and is locked (`flock`) from creation to rename, so
//! concurrent saves of one name never write one file and the last rename wins whole;
//! a process starting removes only the temporary files no live save holds. Files
//! other processes save later are listed ([`list_snapshot_files`]) and restored when a
//! load asks for them ([`read_snapshot_file`] off the pool's thread, then
//! [`PagedKv::restore_snapshot`] with every check of a restore at start). A file that
//! fails its checks is remembered as it was and left out until it changes.
//!
//! Each snapshot held remembers the identity of its file ([`SnapFileId`]: device,
//! inode, size, modification time) as it restored or wrote it. Every save publishes a
//! new file (a new inode renamed over the name), so when another replica saves a newer
//! version of a name this one holds, the name's file is no longer the one remembered:
//! a load sees that ([`PagedKv::held_snapshot_file`]) and re-reads the file
//! ([`read_snapshot_file_id`], then [`PagedKv::reload_snapshot`]) before it forks
//! the snapshot. Contexts already loaded from the older version keep its pages.
//!
//! File format (little-endian): magic `FOLIOSNP`, version u32 (3), fingerprint
//! [u8; 16], page_size u32, slot_halves u32, dtype u32 (0 f16, 1 f32, 2 q8_0), n_tokens
//! u64, salt_len u32 (u32::MAX: no salt) and the tenant salt [u8; salt_len], tokens
//! [u32], then for every token its K/V bytes [u8; 2 · slot_halves] (every layer's K
//! then V row as the pool stores it: f16 or f32 elements, or the 8-bit values then
//! their scales), then xxh3-128 of everything before it. The salt is the one the
//! saved table's chain was made with ([`PageTable::salt`]): a restored snapshot is in
//! that tenant's chain again, never in another's. Version 2 had no salt (its files are
//! restored unsalted), version 1 no dtype either (f16 or f32, told apart by
//! slot_halves); both are still read. A file of another dtype than the pool's is
//! [`SnapshotError::WrongDtype`], never restored.

use super::error::KvError;
pub use super::error::SnapshotError;
use super::paged::PagedKv;
use super::table::PageTable;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const MAGIC: &[u8; 8] = b"FOLIOSNP";
const VERSION: u32 = 3;
/// Bytes up to the token count's end: magic, version, fingerprint, page size, slot
/// halves, dtype, count (versions 2 and 3; the salt follows in 3).
const HEAD: usize = 8 + 4 + 16 + 4 + 4 + 4 + 8;
/// The same in version 1 (no dtype).
const HEAD_V1: usize = HEAD - 4;
/// The longest tenant salt a file may hold (the server takes 1024 bytes).
const MAX_SALT: usize = 4096;
/// A salt length that says there is no salt.
const NO_SALT: u32 = u32::MAX;

/// About how many bytes of K/V one [`PagedKv::save_chunk`] copies (at least a token's).
pub const SAVE_CHUNK_BYTES: usize = 2 << 20;

/// Whether `name` is 1 to `max` letters, digits, '-', '_' and '.', not starting with
/// '.': a name that is a plain file name on every system (snapshots, and the server's
/// stored programs).
pub fn is_plain_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Whether `name` can name a snapshot (letters, digits, '-', '_' and '.', 1 to 128 of
/// them, not starting with '.'): callers check before doing work that ends in a save.
pub fn check_name(name: &str) -> Result<(), SnapshotError> {
    if is_plain_name(name, 128) {
        Ok(())
    } else {
        Err(SnapshotError::BadName(name.into()))
    }
}

/// How much the snapshots of one pool may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// Total bytes of snapshot files (saves in flight count in full until they end).
    pub max_bytes: u64,
    /// Snapshots kept (in memory, and so on disk).
    pub max_count: usize,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        Self {
            max_bytes: 4 << 30,
            max_count: 256,
        }
    }
}

/// The lock under which a snapshot file is renamed into place and recorded, or removed
/// and forgotten: a save and a delete of one name never interleave.
pub type SnapshotLock = Arc<Mutex<()>>;

/// A save between [`PagedKv::begin_save`] and its end.
struct PendingSave {
    name: String,
    table: PageTable,
    bytes: u64,
}

/// The snapshot bookkeeping beside the pinned tables.
#[derive(Default)]
pub(super) struct SnapState {
    /// Bytes of each snapshot's file (none without a directory).
    sizes: HashMap<String, u64>,
    /// Saves in flight, by id.
    pending: HashMap<u64, PendingSave>,
    next_save: u64,
    limits: SnapshotLimits,
    /// Token ids at or past this are outside the model's vocabulary (restore checks).
    vocab: Option<usize>,
    lock: SnapshotLock,
    /// Files that failed their checks (at start, or when a load looked for them), as
    /// they were then: left out of listings and loads until they change.
    rejected: HashMap<String, FileStamp>,
    /// The file each snapshot held was restored from or written to, as it was then.
    files: HashMap<String, SnapFileId>,
}

/// Which file a snapshot came from: another save of the name (by any process
/// sharing the directory) renames a new file over it, with another inode, size or
/// modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapFileId {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl SnapFileId {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let (dev, ino) = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        #[cfg(not(unix))]
        let (dev, ino) = (0, 0);
        Self {
            dev,
            ino,
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

/// A file's size and modification time: whether it changed since it was looked at.
pub type FileStamp = (u64, Option<std::time::SystemTime>);

fn stamp(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()))
}

impl SnapState {
    fn bytes_used(&self) -> u64 {
        self.sizes.values().sum::<u64>() + self.pending.values().map(|p| p.bytes).sum::<u64>()
    }
}

/// A save whose pages are pinned: the caller writes its file (see the module doc).
pub struct SaveTicket {
    id: u64,
    name: String,
    dir: PathBuf,
    /// The file's start: the header and the tokens.
    head: Vec<u8>,
    n_tokens: usize,
    slot_bytes: usize,
    lock: SnapshotLock,
}

impl SaveTicket {
    /// The save's id, for [`PagedKv::save_chunk`], `finish_save` and `abort_save`.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The snapshot's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tokens one chunk holds: about [`SAVE_CHUNK_BYTES`] of K/V.
    pub fn chunk_tokens(&self) -> usize {
        (SAVE_CHUNK_BYTES / self.slot_bytes.max(1)).max(1)
    }

    /// Writes the file under a temporary name and syncs it. `fetch(from, n, out)`
    /// must append the K/V bytes of tokens `from..from + n` to `out` (a
    /// [`PagedKv::save_chunk`] of this save, wherever the pool lives). On error nothing
    /// of this write is left on disk.
    pub fn write<E: From<SnapshotError>>(
        &self,
        mut fetch: impl FnMut(usize, usize, &mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Written, E> {
        let path = self.dir.join(format!("{}.snap", self.name));
        check_not_anothers(&self.name, &path, &self.head)?;
        let (tmp, mut f) = create_temp(&self.dir, &self.name).map_err(|e| io_error(&path, e))?;
        // From here on a failure removes the temporary file (`Written`'s drop).
        let mut written = Written {
            file: None,
            tmp,
            path,
            name: self.name.clone(),
            ours: self.head[..HEAD].to_vec(),
            dir: self.dir.clone(),
            lock: self.lock.clone(),
            published: false,
        };
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        let io = |e| io_error(&written.path, e);
        hash.update(&self.head);
        f.write_all(&self.head).map_err(io)?;
        let step = self.chunk_tokens();
        let mut buf = Vec::with_capacity(step * self.slot_bytes);
        let mut from = 0;
        while from < self.n_tokens {
            let n = step.min(self.n_tokens - from);
            buf.clear();
            fetch(from, n, &mut buf)?;
            if buf.len() != n * self.slot_bytes {
                return Err(SnapshotError::SaveGone(self.id).into());
            }
            hash.update(&buf);
            f.write_all(&buf).map_err(io)?;
            from += n;
        }
        f.write_all(&hash.digest128().to_le_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        written.file = Some(f);
        Ok(written)
    }
}

/// A snapshot file written and synced under its temporary name. Dropped unpublished,
/// the temporary file is removed.
pub struct Written {
    /// The file written (to check that the temporary name still names it).
    file: Option<File>,
    tmp: PathBuf,
    path: PathBuf,
    name: String,
    /// This pool's header (for [`check_not_anothers`]).
    ours: Vec<u8>,
    dir: PathBuf,
    lock: SnapshotLock,
    published: bool,
}

impl Written {
    /// The identity the file will have under the snapshot's name once published.
    pub fn file_id(&self) -> Option<SnapFileId> {
        let meta = self.file.as_ref()?.metadata().ok()?;
        Some(SnapFileId::of(&meta))
    }

    /// Renames the file into place and runs `record` (which makes it the snapshot in
    /// memory: [`PagedKv::finish_save`]) under the directory's lock, then syncs the
    /// directory. A failed rename removes the temporary file and `record` never runs.
    pub fn publish<E: From<SnapshotError>>(
        mut self,
        record: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        {
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.check_still_ours()?;
            // Checked again under the lock: another pool may have saved the name since.
            check_not_anothers(&self.name, &self.path, &self.ours)?;
            // NOTE: rename replaces whatever is at `path` (a link included) and never
            // follows it: the snapshot's name now names the file just written.
            std::fs::rename(&self.tmp, &self.path).map_err(|e| io_error(&self.path, e))?;
            self.published = true;
            record()?;
        }
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Written {
    /// Whether the temporary name still names the file this save wrote: someone who
    /// can write the directory could have put something else (a link) there since.
    fn check_still_ours(&self) -> Result<(), SnapshotError> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let ours = self.file.as_ref().map(File::metadata);
            let there = std::fs::symlink_metadata(&self.tmp);
            match (ours, there) {
                (Some(Ok(a)), Ok(b))
                    if b.file_type().is_file() && a.dev() == b.dev() && a.ino() == b.ino() => {}
                _ => {
                    return Err(SnapshotError::Io {
                        path: self.tmp.clone(),
                        error: Arc::new(std::io::Error::other(
                            "the temporary file was replaced while it was written (something else writes the snapshot directory): nothing was saved",
                        )),
                    })
                }
            }
        }
        Ok(())
    }
}

/// Refuses to replace `path` where it holds a snapshot another pool made (another
/// model, K/V type or page size sharing the directory: this pool neither lists nor
/// loads it, so a save would destroy it unseen). `ours`: this pool's header. Anything
/// else there (nothing, this pool's snapshot, a file that is no snapshot) may go.
fn check_not_anothers(name: &str, path: &Path, ours: &[u8]) -> Result<(), SnapshotError> {
    match Header::read(path) {
        Some(h) if !h.same_pool(ours) => Err(SnapshotError::TakenByAnother {
            name: name.into(),
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl PagedKv {
    /// Pins `table`'s pages under `name` (replacing an earlier snapshot of that name)
    /// and, with a snapshot directory, writes it to disk, all on this thread (see
    /// [`PagedKv::begin_save`] for a save whose write runs elsewhere).
    pub fn save(&mut self, name: &str, table: &mut PageTable) -> Result<(), SnapshotError> {
        let Some(ticket) = self.begin_save(name, table)? else {
            return Ok(());
        };
        let id = ticket.id();
        let written = ticket.write(|from, n, out| self.save_chunk(id, from, n, out));
        match written.and_then(|w| {
            let file = w.file_id();
            w.publish(|| self.finish_save(id, file))
        }) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.abort_save(id);
                Err(e)
            }
        }
    }

    /// The first part of a save (see the module doc): checks the name and the quota,
    /// then pins `table`'s pages. Without a snapshot directory that is the whole save
    /// (the snapshot is recorded now; returns `None`). With one, returns the ticket the
    /// caller writes the file with; the pin holds until [`PagedKv::finish_save`] or
    /// [`PagedKv::abort_save`].
    pub fn begin_save(
        &mut self,
        name: &str,
        table: &mut PageTable,
    ) -> Result<Option<SaveTicket>, SnapshotError> {
        check_name(name)?;
        if table.held_from() > 0 {
            return Err(KvError::Forgotten {
                pages: table.held_from(),
                needed: "a snapshot",
            }
            .into());
        }
        let limits = self.snap.limits;
        let known =
            self.snapshots.contains_key(name) || self.snap.pending.values().any(|p| p.name == name);
        if !known {
            let mut names: Vec<&str> = self.snapshots.keys().map(String::as_str).collect();
            names.extend(self.snap.pending.values().map(|p| p.name.as_str()));
            names.sort_unstable();
            names.dedup();
            if names.len() >= limits.max_count {
                return Err(SnapshotError::TooMany {
                    name: name.into(),
                    limit: limits.max_count,
                });
            }
        }
        let slot_bytes = self.arena.slot_bytes();
        let salt = table.salt.clone();
        let salt_len = salt.as_ref().map_or(0, |s| s.len());
        let salt_bytes = 4 + salt_len;
        let bytes = (table.len() * (4 + slot_bytes) + HEAD + salt_bytes + 16) as u64;
        if let Some(dir) = self.snapshot_dir.clone() {
            // A file keeps a salt of at most MAX_SALT bytes (a restore refuses more).
            if salt_len > MAX_SALT {
                return Err(SnapshotError::SaltTooLong {
                    bytes: salt_len,
                    limit: MAX_SALT,
                });
            }
            // Replacing a snapshot frees its file: only the difference counts.
            let old = self.snap.sizes.get(name).copied().unwrap_or(0);
            let used = self.snap.bytes_used();
            if used.saturating_sub(old).saturating_add(bytes) > limits.max_bytes {
                return Err(SnapshotError::OverBytes {
                    name: name.into(),
                    bytes,
                    used,
                    limit: limits.max_bytes,
                });
            }
            let pinned = self.fork(table)?;
            // The file is written from the host's bytes: K/V held on the device comes
            // back now (the pinned pages are never written again).
            let ps = self.store.page_size();
            let need: Vec<(u32, usize)> = (pinned.pages().iter().enumerate())
                .map(|(i, p)| (p.0, pinned.len().saturating_sub(i * ps).min(ps)))
                .collect();
            let read = self.store.read_tokens(&pinned).and_then(|t| {
                self.arena.sync_needing(&need)?;
                Ok(t)
            });
            let tokens = match read {
                Ok(t) => t,
                Err(e) => {
                    self.release(pinned)?;
                    return Err(e.into());
                }
            };
            let mut head = Vec::with_capacity(HEAD + salt_bytes + 4 * tokens.len());
            head.extend_from_slice(MAGIC);
            head.extend_from_slice(&VERSION.to_le_bytes());
            head.extend_from_slice(&self.fingerprint);
            head.extend_from_slice(&(self.store.page_size() as u32).to_le_bytes());
            head.extend_from_slice(&(self.arena.slot_halves() as u32).to_le_bytes());
            head.extend_from_slice(&self.arena.dtype().code().to_le_bytes());
            head.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
            match &salt {
                Some(s) => {
                    head.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    head.extend_from_slice(s);
                }
                None => head.extend_from_slice(&NO_SALT.to_le_bytes()),
            }
            for tok in &tokens {
                head.extend_from_slice(&tok.to_le_bytes());
            }
            self.snap.next_save += 1;
            let id = self.snap.next_save;
            self.snap.pending.insert(
                id,
                PendingSave {
                    name: name.into(),
                    table: pinned,
                    bytes,
                },
            );
            return Ok(Some(SaveTicket {
                id,
                name: name.into(),
                dir,
                head,
                n_tokens: tokens.len(),
                slot_bytes,
                lock: self.snap.lock.clone(),
            }));
        }
        let pinned = self.fork(table)?;
        if let Some(old) = self.snapshots.insert(name.to_string(), pinned) {
            self.release(old)?;
        }
        Ok(None)
    }

    /// Appends the K/V bytes (little-endian, every layer's K then V per token, as
    /// [`super::KvArena::read_slot`] gives them) of tokens `from..from + n` of save
    /// `id`'s pinned pages to `out`.
    pub fn save_chunk(
        &self,
        id: u64,
        from: usize,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), SnapshotError> {
        let p = self
            .snap
            .pending
            .get(&id)
            .ok_or(SnapshotError::SaveGone(id))?;
        let t = &p.table;
        let ps = self.store.page_size();
        let end = (from + n).min(t.len());
        out.reserve((end.saturating_sub(from)) * self.arena.slot_bytes());
        for pos in from..end {
            self.arena.read_slot(t.page(pos / ps).0, pos % ps, out);
        }
        Ok(())
    }

    /// Ends save `id` whose file is in place (`file`: its identity,
    /// [`Written::file_id`]): it becomes snapshot `name` (an older one of that name is
    /// released).
    pub fn finish_save(&mut self, id: u64, file: Option<SnapFileId>) -> Result<(), SnapshotError> {
        let p = self
            .snap
            .pending
            .remove(&id)
            .ok_or(SnapshotError::SaveGone(id))?;
        self.snap.sizes.insert(p.name.clone(), p.bytes);
        match file {
            Some(f) => self.snap.files.insert(p.name.clone(), f),
            None => self.snap.files.remove(&p.name),
        };
        if let Some(old) = self.snapshots.insert(p.name, p.table) {
            self.release(old)?;
        }
        Ok(())
    }

    /// Ends save `id` without a snapshot: its pin is released (a save already ended
    /// is left alone).
    pub fn abort_save(&mut self, id: u64) {
        if let Some(p) = self.snap.pending.remove(&id) {
            if let Err(e) = self.release(p.table) {
                tracing::error!("releasing an abandoned save's pages: {e}");
            }
        }
    }

    /// The lock that orders file renames and removals with the snapshot map.
    pub fn snapshot_lock(&self) -> SnapshotLock {
        self.snap.lock.clone()
    }

    /// Sets the quota of snapshot files and count.
    pub fn set_snapshot_limits(&mut self, limits: SnapshotLimits) {
        self.snap.limits = limits;
    }

    /// Restored token ids must be below `vocab` (the model's vocabulary size); a
    /// snapshot holding another is skipped as corrupt.
    pub fn set_vocab(&mut self, vocab: usize) {
        self.snap.vocab = Some(vocab);
    }

    /// Bytes of snapshot files, saves in flight included.
    pub fn snapshot_bytes(&self) -> u64 {
        self.snap.bytes_used()
    }

    /// A new sequence sharing the snapshot's pages.
    pub fn load(&mut self, name: &str) -> Result<PageTable, SnapshotError> {
        let t = self
            .snapshots
            .get_mut(name)
            .ok_or_else(|| SnapshotError::NotFound(name.into()))?;
        let f = self.store.fork(t)?;
        self.apply_copies();
        Ok(f)
    }

    /// Unpins a snapshot and removes its file.
    pub fn delete(&mut self, name: &str) -> Result<(), SnapshotError> {
        if let Some(path) = self.unpin(name)? {
            remove_snapshot_file(&path)?;
        }
        Ok(())
    }

    /// Unpins a snapshot and returns the file the caller must remove (with a
    /// directory), under [`PagedKv::snapshot_lock`] if saves run elsewhere.
    pub fn unpin(&mut self, name: &str) -> Result<Option<PathBuf>, SnapshotError> {
        let t = self
            .snapshots
            .remove(name)
            .ok_or_else(|| SnapshotError::NotFound(name.into()))?;
        self.snap.sizes.remove(name);
        self.snap.files.remove(name);
        self.release(t)?;
        Ok(self
            .snapshot_dir
            .as_ref()
            .map(|d| d.join(format!("{name}.snap"))))
    }

    /// The snapshot directory, if any.
    pub fn snapshot_dir_path(&self) -> Option<&Path> {
        self.snapshot_dir.as_deref()
    }

    /// Each snapshot's name and token count, sorted by name.
    pub fn snapshot_list(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = self
            .snapshots
            .iter()
            .map(|(n, t)| (n.clone(), t.len()))
            .collect();
        v.sort();
        v
    }

    /// Names of the snapshots held, sorted.
    pub fn snapshot_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.snapshots.keys().cloned().collect();
        v.sort();
        v
    }

    /// Each snapshot's name and table, then those of the saves in flight (their pins
    /// hold pages too).
    pub fn pinned(&self) -> impl Iterator<Item = (&str, &PageTable)> {
        self.snapshots.iter().map(|(n, t)| (n.as_str(), t)).chain(
            self.snap
                .pending
                .values()
                .map(|p| (p.name.as_str(), &p.table)),
        )
    }

    /// The tables the snapshots and the saves in flight pin (for counting shared
    /// pages and checking references).
    pub fn pinned_tables(&self) -> impl Iterator<Item = &PageTable> {
        self.snapshots
            .values()
            .chain(self.snap.pending.values().map(|p| &p.table))
    }

    /// Keeps snapshots in `dir` from now on, and restores the ones already there.
    /// Returns what was restored and, separately, each file that was skipped and why
    /// (a temporary file left by a save that never completed is removed and reported
    /// as [`SnapshotError::Interrupted`]).
    pub fn open_snapshot_dir(
        &mut self,
        dir: &Path,
    ) -> Result<(Vec<String>, Vec<SnapshotError>), SnapshotError> {
        let io = |source: std::io::Error| SnapshotError::Io {
            path: dir.to_path_buf(),
            error: source.into(),
        };
        if dir.exists() && !dir.is_dir() {
            return Err(SnapshotError::NotADirectory(dir.to_path_buf()));
        }
        std::fs::create_dir_all(dir).map_err(io)?;
        // Fail now, not after a whole generation, if snapshots could not be written
        // (created as a save's temporary file is: never through a planted link).
        let (probe, _) = create_temp(dir, "folio-write-test").map_err(io)?;
        let _ = std::fs::remove_file(&probe);
        self.snapshot_dir = Some(dir.to_path_buf());
        let mut names = Vec::new();
        let mut skipped = Vec::new();
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "snap"))
            .collect();
        entries.sort();
        skipped.extend(remove_interrupted(dir));
        for path in entries {
            match self.read_file(&path) {
                Ok((name, table, bytes, file)) => {
                    if let Some(old) = self.snapshots.insert(name.clone(), table) {
                        self.release(old)?;
                    }
                    self.snap.sizes.insert(name.clone(), bytes);
                    self.snap.files.insert(name.clone(), file);
                    names.push(name);
                }
                Err(e) => {
                    self.reject(&path);
                    skipped.push(e);
                }
            }
        }
        // Restored files count against the quota; over it, they stay (nothing is
        // deleted) and new saves are refused until snapshots are deleted.
        let (used, count, limits) = (
            self.snap.bytes_used(),
            self.snapshots.len(),
            self.snap.limits,
        );
        if used > limits.max_bytes || count > limits.max_count {
            tracing::warn!(
                "the restored snapshots ({count}, {used} bytes) exceed the quota ({} snapshots, {} bytes): new saves are refused until some are deleted",
                limits.max_count,
                limits.max_bytes
            );
        }
        Ok((names, skipped))
    }

    /// Reads and checks one file: its name, every header field, the checksum, every
    /// token id (below the vocabulary, when known) and every K/V element (finite).
    /// Returns the name, the restored table, the file's size and its identity.
    fn read_file(
        &mut self,
        path: &Path,
    ) -> Result<(String, PageTable, u64, SnapFileId), SnapshotError> {
        let (b, file) = read_snapshot_file_id(path, self.snapshot_file_limit())?;
        let (name, table, bytes) = self.restore_bytes(path, b)?;
        Ok((name, table, bytes, file))
    }

    /// The most bytes a snapshot file of this pool may have: one of the longest
    /// sequence it holds in any dtype (the widest, f32, so that a file of another dtype
    /// is read and named as such).
    fn snapshot_file_limit(&self) -> u64 {
        let widest = self
            .arena
            .slot_bytes()
            .max(self.arena.slot_bytes_as(super::KvDtype::F32));
        (self.max_tokens() as u64)
            .saturating_mul(4 + widest as u64)
            .saturating_add((HEAD + 4 + MAX_SALT + 16) as u64)
    }

    /// Where snapshot `name`'s file is (with a snapshot directory), and the most bytes
    /// it may have: what a caller needs to read it off the pool's thread
    /// ([`read_snapshot_file`]) for [`PagedKv::restore_snapshot`].
    /// A file that failed its checks and has not changed since is none.
    pub fn snapshot_file(&self, name: &str) -> Option<(PathBuf, u64)> {
        check_name(name).ok()?;
        let path = self.snapshot_dir.as_ref()?.join(format!("{name}.snap"));
        if self
            .snap
            .rejected
            .get(name)
            .is_some_and(|&s| stamp(&path) == Some(s))
        {
            return None;
        }
        Some((path, self.snapshot_file_limit()))
    }

    /// The files that failed their checks, by snapshot name, as they were then (a
    /// listing leaves them out while they are unchanged).
    pub fn snapshot_rejected(&self) -> HashMap<String, FileStamp> {
        self.snap.rejected.clone()
    }

    /// Remembers that the file at `path` failed its checks.
    fn reject(&mut self, path: &Path) {
        if let (Some(name), Some(s)) = (path.file_stem().and_then(|s| s.to_str()), stamp(path)) {
            self.snap.rejected.insert(name.to_string(), s);
        }
    }

    /// Restores the snapshot whose file `path` held `bytes` (read by
    /// [`read_snapshot_file`], on another thread): every check of a restore at start
    /// holds. A snapshot of that name held already is kept and this is a no-op
    /// (another caller restored it first). For a directory other processes share:
    /// a snapshot another replica saved after this one started.
    /// `file`: the identity of the file the bytes were read from
    /// ([`read_snapshot_file_id`]).
    pub fn restore_snapshot(
        &mut self,
        path: &Path,
        bytes: Vec<u8>,
        file: Option<SnapFileId>,
    ) -> Result<(), SnapshotError> {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if self.snapshots.contains_key(name) {
            return Ok(());
        }
        self.reload_snapshot(path, bytes, file)
    }

    /// Restores the snapshot whose file `path` held `bytes` (with every check of a
    /// restore at start) in place of the one of that name held, if any: another
    /// process sharing the directory saved a newer version. The older version's
    /// pages stay with the contexts that use them. A file that fails its checks is
    /// rejected (left out until it changes) and the snapshot held is kept.
    pub fn reload_snapshot(
        &mut self,
        path: &Path,
        bytes: Vec<u8>,
        file: Option<SnapFileId>,
    ) -> Result<(), SnapshotError> {
        let (name, table, size) = self.restore_bytes(path, bytes).inspect_err(|_| {
            self.reject(path);
        })?;
        if let Some(old) = self.snapshots.insert(name.clone(), table) {
            self.release(old)?;
        }
        self.snap.sizes.insert(name.clone(), size);
        match file {
            Some(f) => self.snap.files.insert(name, f),
            None => self.snap.files.remove(&name),
        };
        Ok(())
    }

    /// For a snapshot held whose file is in the snapshot directory: the file's path,
    /// the most bytes it may have, the identity it had when this pool restored or
    /// wrote it, and the stamp it had if it was rejected since. The caller looks at
    /// the file (off the pool's thread) and, when it is another now, re-reads it
    /// ([`PagedKv::reload_snapshot`]). None: not held, or no directory.
    #[allow(clippy::type_complexity)]
    pub fn held_snapshot_file(
        &self,
        name: &str,
    ) -> Option<(PathBuf, u64, Option<SnapFileId>, Option<FileStamp>)> {
        if !self.snapshots.contains_key(name) {
            return None;
        }
        check_name(name).ok()?;
        let path = self.snapshot_dir.as_ref()?.join(format!("{name}.snap"));
        Some((
            path,
            self.snapshot_file_limit(),
            self.snap.files.get(name).copied(),
            self.snap.rejected.get(name).copied(),
        ))
    }

    /// Checks a snapshot file's bytes and restores its pages: its name, the table, the
    /// file's size.
    fn restore_bytes(
        &mut self,
        path: &Path,
        b: Vec<u8>,
    ) -> Result<(String, PageTable, u64), SnapshotError> {
        let corrupt = |reason: &str| SnapshotError::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
        };
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| corrupt("the file name is not a snapshot name"))?
            .to_string();
        check_name(&name).map_err(|_| corrupt("the file name is not a snapshot name"))?;
        if b.len() as u64 > self.snapshot_file_limit() {
            return Err(corrupt("larger than a snapshot of this pool can be"));
        }
        if b.len() < HEAD_V1 + 16 {
            return Err(corrupt("truncated"));
        }
        let (body, sum) = b.split_at(b.len() - 16);
        if xxhash_rust::xxh3::xxh3_128(body).to_le_bytes() != sum {
            return Err(corrupt("checksum mismatch"));
        }
        if &body[..8] != MAGIC {
            return Err(corrupt("not a folio snapshot"));
        }
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        let version = u32_at(8);
        let fixed = match version {
            1 => HEAD_V1,
            2 | VERSION => HEAD,
            _ => return Err(corrupt("unknown snapshot version")),
        };
        if body.len() < fixed {
            return Err(corrupt("truncated"));
        }
        if body[12..28] != self.fingerprint {
            return Err(corrupt("made with another model"));
        }
        let ps = self.store.page_size();
        if u32_at(28) as usize != ps {
            return Err(corrupt(&format!(
                "made with page size {}; this pool's is {ps}",
                u32_at(28)
            )));
        }
        let pool = self.arena.dtype();
        let file = if version >= 2 {
            super::KvDtype::of_code(u32_at(36))
                .ok_or_else(|| corrupt("unknown K/V element type"))?
        } else {
            // Version 1: f16 or f32 (never 8-bit), whichever this pool's rows would make
            // that size; a size neither makes is a shape error below (the pool's type),
            // or, in an 8-bit pool, an f16 file.
            let halves = |d| self.arena.slot_bytes_as(d) / 2;
            let v1 = [super::KvDtype::F16, super::KvDtype::F32];
            v1.into_iter()
                .find(|&d| halves(d) == u32_at(32) as usize)
                .unwrap_or(if v1.contains(&pool) {
                    pool
                } else {
                    super::KvDtype::F16
                })
        };
        if file != pool {
            return Err(SnapshotError::WrongDtype {
                path: path.to_path_buf(),
                file,
                pool,
            });
        }
        if u32_at(32) as usize != self.arena.slot_halves() {
            return Err(corrupt(&format!(
                "made with another K/V shape ({} bytes per token; this pool stores {pool}, {} bytes per token)",
                2 * u64::from(u32_at(32)),
                self.arena.slot_bytes()
            )));
        }
        let n = u64::from_le_bytes(body[fixed - 8..fixed].try_into().expect("8 bytes")) as usize;
        // The tenant salt (version 3), then the tokens.
        let (salt, head) = match version {
            VERSION => {
                if body.len() < fixed + 4 {
                    return Err(corrupt("truncated"));
                }
                match u32_at(fixed) {
                    NO_SALT => (None, fixed + 4),
                    len if len as usize <= MAX_SALT && body.len() >= fixed + 4 + len as usize => {
                        let at = fixed + 4;
                        (Some(&body[at..at + len as usize]), at + len as usize)
                    }
                    _ => return Err(corrupt("a tenant salt longer than the file or the limit")),
                }
            }
            _ => (None, fixed),
        };
        let slot_bytes = self.arena.slot_bytes();
        let want = n
            .checked_mul(4 + slot_bytes)
            .and_then(|x| x.checked_add(head))
            .ok_or_else(|| corrupt("size overflows"))?;
        if body.len() != want {
            return Err(corrupt("length does not match its token count"));
        }
        if n > self.max_tokens() {
            return Err(corrupt(&format!(
                "{n} tokens, more than a sequence of this pool holds ({})",
                self.max_tokens()
            )));
        }
        let tokens: Vec<u32> = body[head..head + 4 * n]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        // The checksum is no signature: whoever can write the directory can make a
        // file that passes it. A token the model cannot embed would fail every step
        // that computes it; a non-finite K/V element (or 8-bit scale) would poison every
        // sequence that shares the page.
        if let Some(vocab) = self.snap.vocab {
            if let Some((pos, bad)) = tokens
                .iter()
                .enumerate()
                .find(|(_, &t)| t as usize >= vocab)
            {
                return Err(corrupt(&format!(
                    "token {bad} at position {pos} is outside the model's vocabulary of {vocab}"
                )));
            }
        }
        if let Some(i) = body[head + 4 * n..]
            .chunks_exact(slot_bytes.max(1))
            .position(|c| !self.arena.slot_finite(c))
        {
            return Err(corrupt(&format!(
                "a K/V element of token {i} is not a finite number"
            )));
        }
        let mut t = self.new_table(salt);
        let kv_at = head + 4 * n;
        for (pos, &tok) in tokens.iter().enumerate() {
            if let Err(e) = self.store.push(&mut t, tok) {
                self.release(t)?;
                return Err(e.into());
            }
            let at = kv_at + pos * slot_bytes;
            let slot = &body[at..at + slot_bytes];
            if pos % ps == 0 {
                // A page just reserved: what it held before is no sequence's.
                self.arena.fresh(t.page(pos / ps).0);
            }
            self.arena.write_slot(t.page(pos / ps).0, pos % ps, slot);
        }
        self.store.commit_full(&mut t)?;
        Ok((name, t, b.len() as u64))
    }
}

/// A fresh temporary file for a save of `name` in `dir`: a hidden name that is not
/// `.snap` (never restored) with 64 unpredictable bits in it, created exclusively
/// (`O_EXCL`: an existing file or link of that name is an error, never opened) and
/// without following a link (`O_NOFOLLOW`). A name taken already is tried again.
fn create_temp(dir: &Path, name: &str) -> std::io::Result<(PathBuf, File)> {
    let mut last = None;
    for _ in 0..8 {
        let path = dir.join(format!(".{name}.snap.{:016x}.tmp", unpredictable()));
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        }
        match o.open(&path) {
            Ok(f) => {
                // Held until the file is renamed or removed: another process sharing
                // the directory sees a save in flight, not an interrupted one. Best
                // effort: where the file system has no locks, the save goes on (and a
                // replica starting may take its file for an interrupted one's).
                let _ = f.try_lock();
                return Ok((path, f));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

/// 64 bits no other process can predict: std's randomly keyed SipHash (its keys come
/// from the OS's random source) over a counter, the time and the process id.
fn unpredictable() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNT.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    h.write_u32(std::process::id());
    h.finish()
}

/// The snapshot name a temporary file's name belongs to: `.NAME.snap.HEX16.tmp`, or
/// `.NAME.snap.tmp` as earlier versions named it.
fn temp_owner(file: &str) -> Option<&str> {
    let stem = file.strip_prefix('.')?.strip_suffix(".tmp")?;
    if let Some((name, tag)) = stem.rsplit_once(".snap.") {
        if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) && check_name(name).is_ok()
        {
            return Some(name);
        }
    }
    stem.strip_suffix(".snap").filter(|n| check_name(n).is_ok())
}

/// Removes a snapshot's file (absent already is fine).
pub fn remove_snapshot_file(path: &Path) -> Result<(), SnapshotError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SnapshotError::Io {
            path: path.to_path_buf(),
            error: source.into(),
        }),
    }
}

/// A write error on `path`: a full disk (ENOSPC, EDQUOT) or a file-size limit (EFBIG)
/// is [`SnapshotError::NoSpace`], anything else [`SnapshotError::Io`].
fn io_error(path: &Path, e: std::io::Error) -> SnapshotError {
    // Linux's numbers (ErrorKind::StorageFull and friends are newer than our MSRV).
    const EFBIG: i32 = 27;
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    let path = path.to_path_buf();
    let error = Arc::new(e);
    if matches!(error.raw_os_error(), Some(EFBIG | ENOSPC | EDQUOT)) {
        SnapshotError::NoSpace { path, error }
    } else {
        SnapshotError::Io { path, error }
    }
}

/// Whether a save holds the temporary file at `path` (its writer keeps it locked from
/// creation to rename): another process sharing the directory is writing it.
fn save_in_flight(path: &Path) -> bool {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK);
    }
    match o.open(path) {
        Ok(f) => matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// Removes the temporary files of saves that never completed (the process was killed
/// while writing); each is reported. A file a save still holds (another process
/// sharing the directory writes it) is left alone.
fn remove_interrupted(dir: &Path) -> Vec<SnapshotError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let file = e.file_name();
        let Some(name) = file.to_str().and_then(temp_owner) else {
            continue;
        };
        let path = e.path();
        if save_in_flight(&path) {
            continue;
        }
        // Not followed: a link's own size, and `remove_file` removes the link itself.
        let bytes = e.metadata().map_or(0, |m| m.len());
        if std::fs::remove_file(&path).is_ok() {
            out.push(SnapshotError::Interrupted {
                path,
                name: name.to_string(),
                bytes,
            });
        }
    }
    out.sort_by_key(|e| e.to_string());
    out
}

/// Reads a snapshot file for [`PagedKv::restore_snapshot`], on any thread: only a
/// regular file, and no larger than `limit` ([`PagedKv::snapshot_file`]): the bound is
/// known before a byte is read. No file is [`SnapshotError::NotFound`].
pub fn read_snapshot_file(path: &Path, limit: u64) -> Result<Vec<u8>, SnapshotError> {
    Ok(read_snapshot_file_id(path, limit)?.0)
}

/// [`read_snapshot_file`], with the identity of the file the bytes came from (the
/// file opened is the one looked at and read: a save renamed over the name meanwhile
/// does not mix two files).
pub fn read_snapshot_file_id(
    path: &Path,
    limit: u64,
) -> Result<(Vec<u8>, SnapFileId), SnapshotError> {
    use std::io::Read;
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let io = |source: std::io::Error| SnapshotError::Io {
        path: path.to_path_buf(),
        error: source.into(),
    };
    let not_found = || {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        SnapshotError::NotFound(name.to_string())
    };
    // Look at the name first: opening a FIFO or a device could block or read forever.
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(corrupt("not a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(io(e)),
    }
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
        Err(e) => return Err(io(e)),
    };
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(corrupt("not a regular file".into()));
    }
    if meta.len() > limit {
        return Err(corrupt(format!(
            "{} bytes, more than a snapshot of this pool can hold ({limit})",
            meta.len()
        )));
    }
    let mut b = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut b)
        .map_err(io)?;
    if b.len() as u64 > limit {
        return Err(corrupt("the file grew while it was read".into()));
    }
    Ok((b, SnapFileId::of(&meta)))
}

/// A snapshot file's header through its token count, as [`Header::read`] finds it.
struct Header {
    version: u32,
    bytes: [u8; HEAD],
    /// Where the token count ends ([`HEAD`], or [`HEAD_V1`] in version 1).
    end: usize,
}

impl Header {
    /// The header of the file at `path`; none where that is no regular file (a link is
    /// not followed, a FIFO not waited on) or its start is no snapshot's.
    fn read(path: &Path) -> Option<Self> {
        use std::io::Read;
        let mut f = super::disk::open_safely(path, File::options().read(true)).ok()?;
        let mut bytes = [0u8; HEAD];
        f.read_exact(&mut bytes[..HEAD_V1]).ok()?;
        if &bytes[..8] != MAGIC {
            return None;
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let end = match version {
            1 => HEAD_V1,
            2 | VERSION => {
                f.read_exact(&mut bytes[HEAD_V1..]).ok()?;
                HEAD
            }
            _ => return None,
        };
        Some(Self {
            version,
            bytes,
            end,
        })
    }

    /// Whether a pool whose files start with `ours` (a header of this version) made
    /// it: the same fingerprint, page size and row shape, and (from version 2) K/V
    /// type.
    fn same_pool(&self, ours: &[u8]) -> bool {
        let upto = if self.version == 1 { 36 } else { 40 };
        self.bytes[12..upto] == ours[12..upto]
    }
}

/// The snapshot files in `dir` (other processes' included), each one's token count as
/// its header says (not checked: the file is checked when it is restored) and its
/// stamp. Files whose header is not a snapshot's are left out.
pub fn list_snapshot_files(dir: &Path) -> Vec<(String, usize, FileStamp)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "snap") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if check_name(name).is_err() {
            continue;
        }
        let Some(h) = Header::read(&path) else {
            continue;
        };
        let n = u64::from_le_bytes(h.bytes[h.end - 8..h.end].try_into().expect("8 bytes"));
        let Some(s) = stamp(&path) else {
            continue;
        };
        out.push((name.to_string(), n as usize, s));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_file_a_save_holds_is_left_alone_and_one_nobody_holds_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        // Another process's save in flight: its file is open and locked.
        let (held, f) = create_temp(dir.path(), "s").unwrap();
        assert!(save_in_flight(&held));
        assert!(remove_interrupted(dir.path()).is_empty());
        assert!(held.exists(), "a save in flight keeps its file");
        // Its writer died: the lock went with it.
        drop(f);
        assert!(!save_in_flight(&held));
        let removed = remove_interrupted(dir.path());
        assert!(
            matches!(&removed[..], [SnapshotError::Interrupted { name, .. }] if name == "s"),
            "{removed:?}"
        );
        assert!(!held.exists());
    }

    #[test]
    fn files_another_process_saved_are_listed_by_their_header() {
        let dir = tempfile::tempdir().unwrap();
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&[0; 16 + 4 + 4 + 4]);
        head.extend_from_slice(&42u64.to_le_bytes());
        std::fs::write(dir.path().join("doc.snap"), &head).unwrap();
        std::fs::write(dir.path().join("junk.snap"), b"not a snapshot").unwrap();
        std::fs::write(dir.path().join(".doc.snap.0000000000000000.tmp"), &head).unwrap();
        let listed = list_snapshot_files(dir.path());
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].0.as_str(), listed[0].1), ("doc", 42));
    }

    #[test]
    fn a_newer_save_by_another_pool_on_the_directory_is_seen_and_reloaded() {
        use crate::kv::Logits;
        let dir = tempfile::tempdir().unwrap();
        let mut a = PagedKv::new(16, 4, 1, 2, 64, b"snap");
        let mut b = PagedKv::new(16, 4, 1, 2, 64, b"snap");
        a.open_snapshot_dir(dir.path()).unwrap();
        b.open_snapshot_dir(dir.path()).unwrap();
        let filled = |kv: &mut PagedKv, tokens: &[u32]| {
            let mut t = kv.new_table(None);
            kv.plan(&mut t, tokens, Logits::None).unwrap();
            kv.commit(&mut t).unwrap();
            t
        };
        let mut t = filled(&mut a, &[1, 2, 3, 4, 5, 6, 7, 8]);
        a.save("x", &mut t).unwrap();
        // B restores A's save and remembers its file.
        let (path, limit) = b.snapshot_file("x").unwrap();
        let (bytes, id) = read_snapshot_file_id(&path, limit).unwrap();
        b.restore_snapshot(&path, bytes, Some(id)).unwrap();
        let (_, _, held, _) = b.held_snapshot_file("x").unwrap();
        assert_eq!(held, Some(id));
        assert_eq!(a.held_snapshot_file("x").unwrap().2, Some(id), "A wrote it");
        // A saves a newer version: the name's file is another one, and B re-reads it.
        let mut t2 = filled(&mut a, &[9, 10, 11, 12]);
        a.save("x", &mut t2).unwrap();
        let now = SnapFileId::of(&std::fs::metadata(&path).unwrap());
        assert_ne!(Some(now), held);
        assert_eq!(a.held_snapshot_file("x").unwrap().2, Some(now));
        let (bytes, id2) = read_snapshot_file_id(&path, limit).unwrap();
        assert_eq!(id2, now);
        b.reload_snapshot(&path, bytes, Some(id2)).unwrap();
        assert_eq!(b.snapshot_list(), vec![("x".to_string(), 4)]);
        assert_eq!(b.held_snapshot_file("x").unwrap().2, Some(now));
        // A restore of a name held keeps it (a load that raced another is a no-op).
        let (bytes, _) = read_snapshot_file_id(&path, limit).unwrap();
        b.restore_snapshot(&path, bytes, None).unwrap();
        assert_eq!(b.held_snapshot_file("x").unwrap().2, Some(now));
    }
}
