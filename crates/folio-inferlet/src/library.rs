//! [`Library`]: programs kept by name, compiled once when stored (an upload, or a
//! file found in the directory at start), persisted as `NAME.wasm` in a directory
//! when one is given (written to a temporary file, then renamed: a crash never leaves
//! half a program).

use crate::error::InferletError;
use crate::host::{Host, Program};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// A stored program and its figures.
#[derive(Debug, Clone)]
pub struct Stored {
    pub program: Program,
    /// Unix time it was stored.
    pub created: u64,
}

/// Programs by name.
#[derive(Debug, Default)]
pub struct Library {
    dir: Option<PathBuf>,
    programs: Mutex<BTreeMap<String, Stored>>,
}

/// Whether `name` can name a program: 1 to 64 letters, digits, '-', '_' and '.',
/// not starting with '.'.
pub fn check_name(name: &str) -> Result<(), InferletError> {
    if folio::is_plain_name(name, 64) {
        Ok(())
    } else {
        Err(InferletError::BadName(name.chars().take(80).collect()))
    }
}

fn io(what: &str, p: &Path, e: std::io::Error) -> InferletError {
    InferletError::Io(format!("{what} {}: {e}", p.display()))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The bytes of the program file at `path`, up to `limit` and one more (so that one
/// too large is refused by its size, as an upload is): only a regular file (a link is
/// followed to one), opened without waiting on a FIFO and never read past the bound.
/// The 2026-12-08 probe planted a link to `/dev/zero` (read until the machine ran out
/// of memory) and a FIFO (the start hung).
fn read_program(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let not_a_file = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_a_file());
    }
    let mut o = std::fs::File::options();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_a_file());
    }
    let mut bytes = Vec::new();
    f.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

impl Library {
    /// A library kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A library persisted in `dir` (made if missing); every `NAME.wasm` there is
    /// compiled now. A file that does not compile is logged and left out.
    pub fn open(host: &Host, dir: &Path) -> Result<Self, InferletError> {
        std::fs::create_dir_all(dir).map_err(|e| io("cannot make", dir, e))?;
        let mut programs = BTreeMap::new();
        let entries = std::fs::read_dir(dir).map_err(|e| io("cannot read", dir, e))?;
        for e in entries.flatten() {
            let p = e.path();
            let Some(name) = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".wasm"))
            else {
                continue;
            };
            if check_name(name).is_err() {
                continue;
            }
            let loaded = read_program(&p, host.limits().program_bytes)
                .map_err(|e| io("cannot read", &p, e))
                .and_then(|b| host.compile(&b));
            match loaded {
                Ok(program) => {
                    let created = e
                        .metadata()
                        .ok()
                        .and_then(|m| m.modified().ok())
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .map(|d| d.as_secs())
                        .unwrap_or(0);
                    programs.insert(name.to_string(), Stored { program, created });
                }
                Err(e) => tracing::warn!("inferlet {} left out: {e}", p.display()),
            }
        }
        tracing::info!(
            "inferlets: {} loaded from {}",
            programs.len(),
            dir.display()
        );
        Ok(Self {
            dir: Some(dir.to_path_buf()),
            programs: Mutex::new(programs),
        })
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Stored>> {
        self.programs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Compiles `bytes` and stores it under `name` (replacing a program of that
    /// name); persisted first when the library has a directory.
    pub fn put(&self, host: &Host, name: &str, bytes: &[u8]) -> Result<Stored, InferletError> {
        check_name(name)?;
        {
            let m = self.map();
            if !m.contains_key(name) && m.len() >= host.limits().programs {
                return Err(InferletError::TooManyPrograms(host.limits().programs));
            }
        }
        let program = host.compile(bytes)?;
        if let Some(dir) = &self.dir {
            let tmp = dir.join(format!(".{name}.wasm.tmp"));
            let fin = dir.join(format!("{name}.wasm"));
            std::fs::write(&tmp, bytes).map_err(|e| io("cannot write", &tmp, e))?;
            std::fs::rename(&tmp, &fin).map_err(|e| io("cannot rename", &tmp, e))?;
        }
        let stored = Stored {
            program,
            created: now(),
        };
        self.map().insert(name.to_string(), stored.clone());
        Ok(stored)
    }

    /// The program stored under `name`.
    pub fn get(&self, name: &str) -> Result<Stored, InferletError> {
        self.map()
            .get(name)
            .cloned()
            .ok_or_else(|| InferletError::NotFound(name.chars().take(80).collect()))
    }

    /// Every program's name and figures, by name.
    pub fn list(&self) -> Vec<(String, Stored)> {
        self.map()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Removes `name` (and its file).
    pub fn remove(&self, name: &str) -> Result<(), InferletError> {
        check_name(name)?;
        if self.map().remove(name).is_none() {
            return Err(InferletError::NotFound(name.to_string()));
        }
        if let Some(dir) = &self.dir {
            let p = dir.join(format!("{name}.wasm"));
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("cannot remove", &p, e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{check_name, read_program};

    /// A program file is read only up to its bound and one more byte, and only from a
    /// regular file: a link to `/dev/zero` (read without end before) and a FIFO (its
    /// open waited for ever before) are errors at once; a link to a program is read.
    #[cfg(unix)]
    #[test]
    fn program_files_are_read_within_their_bound_and_only_from_regular_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let big = dir.join("big.wasm");
        std::fs::write(&big, vec![7u8; 10_000]).unwrap();
        assert_eq!(read_program(&big, 100).unwrap().len(), 101);
        assert_eq!(read_program(&big, 20_000).unwrap().len(), 10_000);
        let link = dir.join("link.wasm");
        std::os::unix::fs::symlink(&big, &link).unwrap();
        assert_eq!(read_program(&link, 20_000).unwrap().len(), 10_000);
        let zero = dir.join("zero.wasm");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let fifo = dir.join("fifo.wasm");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let t = std::time::Instant::now();
        for bad in [&zero, &fifo] {
            let e = read_program(bad, 1 << 20).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn names_are_plain_file_names() {
        for ok in ["a", "best_of_n", "agent-2", "v1.2", &"x".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "../etc", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
