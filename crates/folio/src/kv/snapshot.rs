//! Named snapshots: `save` pins a sequence's pages under a name (they outlive the
//! sequence and are never evicted), `load` gives a new sequence sharing them, `delete`
//! unpins. With a snapshot directory each snapshot is also a file, written atomically
//! (temp file, fsync, rename), checksummed and tagged with the model fingerprint; files
//! are restored at start, and a corrupt or foreign one is reported and skipped.
//!
//! File format (little-endian): magic `FOLIOSNP`, version u32, fingerprint [u8; 16],
//! page_size u32, slot_halves u32, n_tokens u64, tokens [u32], then for every token
//! its K/V halves [u16; slot_halves], then xxh3-128 of everything before it.

use super::error::KvError;
pub use super::error::SnapshotError;
use super::paged::PagedKv;
use super::table::PageTable;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"FOLIOSNP";
const VERSION: u32 = 1;

/// Whether `name` can name a snapshot (letters, digits, '-', '_' and '.', 1 to 128 of
/// them, not starting with '.'): callers check before doing work that ends in a save.
pub fn check_name(name: &str) -> Result<(), SnapshotError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(SnapshotError::BadName(name.into()))
    }
}

impl PagedKv {
    /// Pins `table`'s pages under `name` (replacing an earlier snapshot of that name)
    /// and, with a snapshot directory, writes it to disk.
    pub fn save(&mut self, name: &str, table: &mut PageTable) -> Result<(), SnapshotError> {
        check_name(name)?;
        if table.held_from() > 0 {
            return Err(KvError::Forgotten {
                pages: table.held_from(),
                needed: "a snapshot",
            }
            .into());
        }
        let pinned = self.fork(table)?;
        if let Some(dir) = self.snapshot_dir.clone() {
            if let Err(e) = self.write_file(&dir, name, &pinned) {
                self.release(pinned)?;
                return Err(e);
            }
        }
        if let Some(old) = self.snapshots.insert(name.to_string(), pinned) {
            self.release(old)?;
        }
        Ok(())
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
        let t = self
            .snapshots
            .remove(name)
            .ok_or_else(|| SnapshotError::NotFound(name.into()))?;
        self.release(t)?;
        if let Some(dir) = &self.snapshot_dir {
            let path = dir.join(format!("{name}.snap"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(SnapshotError::Io {
                        path,
                        error: source.into(),
                    })
                }
            }
        }
        Ok(())
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

    /// Each snapshot's name and table.
    pub fn pinned(&self) -> impl Iterator<Item = (&str, &PageTable)> {
        self.snapshots.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The tables the snapshots pin (for counting shared pages).
    pub fn pinned_tables(&self) -> impl Iterator<Item = &PageTable> {
        self.snapshots.values()
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
        // Fail now, not after a whole generation, if snapshots could not be written.
        let probe = dir.join(".folio-write-test");
        std::fs::write(&probe, b"").map_err(io)?;
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
                Ok((name, table)) => {
                    if let Some(old) = self.snapshots.insert(name.clone(), table) {
                        self.release(old)?;
                    }
                    names.push(name);
                }
                Err(e) => skipped.push(e),
            }
        }
        Ok((names, skipped))
    }

    fn write_file(&self, dir: &Path, name: &str, t: &PageTable) -> Result<(), SnapshotError> {
        let tokens = self.store.read_tokens(t)?;
        let ps = self.store.page_size();
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.fingerprint);
        b.extend_from_slice(&(ps as u32).to_le_bytes());
        b.extend_from_slice(&(self.arena.slot_halves() as u32).to_le_bytes());
        b.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
        for tok in &tokens {
            b.extend_from_slice(&tok.to_le_bytes());
        }
        let mut slot = Vec::new();
        for pos in 0..tokens.len() {
            slot.clear();
            self.arena
                .read_slot(t.page(pos / ps).0, pos % ps, &mut slot);
            for h in &slot {
                b.extend_from_slice(&h.to_le_bytes());
            }
        }
        b.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(&b).to_le_bytes());
        let path = dir.join(format!("{name}.snap"));
        let tmp = temp_path(dir, name);
        // NOTE: the old file is never opened: the new one is written whole and synced
        // under a temporary name, then renamed over it (atomic). A process killed at
        // any moment leaves the old file or the new one, plus at most a temporary file
        // that the next start removes. A failed write removes its temporary file.
        let written = write_synced(&tmp, &b).and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_error(&path, e));
        }
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn read_file(&mut self, path: &Path) -> Result<(String, PageTable), SnapshotError> {
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
        let head = 8 + 4 + 16 + 4 + 4 + 8;
        // Only a regular file, and no larger than a snapshot of the longest sequence this
        // pool holds can be: the bound is known before a byte is read.
        let meta = std::fs::metadata(path).map_err(|source| SnapshotError::Io {
            path: path.to_path_buf(),
            error: source.into(),
        })?;
        if !meta.is_file() {
            return Err(corrupt("not a regular file"));
        }
        let limit = (self.max_tokens() as u64)
            .saturating_mul(4 + 2 * self.arena.slot_halves() as u64)
            .saturating_add(head as u64 + 16);
        if meta.len() > limit {
            return Err(corrupt(&format!(
                "{} bytes, more than a snapshot of this pool can hold ({limit})",
                meta.len()
            )));
        }
        let b = read_at_most(path, limit).map_err(|source| SnapshotError::Io {
            path: path.to_path_buf(),
            error: source.into(),
        })?;
        if b.len() as u64 > limit {
            return Err(corrupt("the file grew while it was read"));
        }
        if b.len() < head + 16 {
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
        if u32_at(8) != VERSION {
            return Err(corrupt("unknown snapshot version"));
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
        if u32_at(32) as usize != self.arena.slot_halves() {
            let dtype = match self.arena.dtype() {
                super::KvDtype::F16 => "f16",
                super::KvDtype::F32 => "f32",
            };
            return Err(corrupt(&format!(
                "made with another K/V element type ({} bytes per token; this pool stores {dtype}, {} bytes per token)",
                2 * u64::from(u32_at(32)),
                2 * self.arena.slot_halves()
            )));
        }
        let n = u64::from_le_bytes(body[36..44].try_into().expect("8 bytes")) as usize;
        let halves = self.arena.slot_halves();
        let want = n
            .checked_mul(4 + 2 * halves)
            .and_then(|x| x.checked_add(head))
            .ok_or_else(|| corrupt("size overflows"))?;
        if body.len() != want {
            return Err(corrupt("length does not match its token count"));
        }
        let tokens: Vec<u32> = body[head..head + 4 * n]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let mut t = self.new_table(None);
        let kv_at = head + 4 * n;
        let mut slot = vec![0u16; halves];
        for (pos, &tok) in tokens.iter().enumerate() {
            if let Err(e) = self.store.push(&mut t, tok) {
                self.release(t)?;
                return Err(e.into());
            }
            for (i, h) in slot.iter_mut().enumerate() {
                let at = kv_at + (pos * halves + i) * 2;
                *h = u16::from_le_bytes([body[at], body[at + 1]]);
            }
            self.arena.write_slot(t.page(pos / ps).0, pos % ps, &slot);
        }
        self.store.commit_full(&mut t)?;
        Ok((name, t))
    }
}

/// The temporary name a save of `name` is written under (hidden, and not `.snap`, so
/// it is never restored).
fn temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.snap.tmp"))
}

/// Creates `path` afresh, writes `bytes` and syncs them to the disk.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
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

/// Removes the temporary files of saves that never completed (the process was killed
/// while writing); each is reported.
fn remove_interrupted(dir: &Path) -> Vec<SnapshotError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let file = e.file_name();
        let Some(name) = file
            .to_str()
            .and_then(|f| f.strip_prefix('.'))
            .and_then(|f| f.strip_suffix(".snap.tmp"))
        else {
            continue;
        };
        if check_name(name).is_err() {
            continue;
        }
        let path = e.path();
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

/// Reads `path` whole but never more than `limit` + 1 bytes (a file that grows, or a
/// device behind a name, cannot make the read unbounded).
fn read_at_most(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut b = Vec::new();
    std::fs::File::open(path)?
        .take(limit.saturating_add(1))
        .read_to_end(&mut b)?;
    Ok(b)
}
