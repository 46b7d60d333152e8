//! The one place folio maps a file into memory, and the check that what it maps is a
//! regular file.
//!
//! A model path is looked at before it is opened: a directory, a FIFO, a device or a
//! socket is refused with [`GgufError::NotAFile`] naming what it is. Opening a FIFO for
//! reading blocks until a writer appears (forever, usually), `/dev/zero` maps as endless
//! zeros, and mapping a directory fails with a baffling "No such device". Symlinks are
//! followed: a link to a regular file is fine. The open itself is non-blocking and the
//! opened file is checked again, so a path swapped for a FIFO between the look and the
//! open cannot block either.

use crate::error::{FileKind, GgufError};
use std::fs::{File, FileType, OpenOptions};
use std::path::Path;

/// A read-only memory map of a whole file.
pub struct MappedFile {
    map: memmap2::Mmap,
}

/// `Err(NotAFile)` unless `ty` is a regular file.
fn regular(path: &Path, ty: FileType) -> Result<(), GgufError> {
    if ty.is_file() {
        return Ok(());
    }
    let kind = if ty.is_dir() {
        FileKind::Directory
    } else {
        special_kind(ty)
    };
    Err(GgufError::NotAFile {
        path: path.display().to_string(),
        kind,
    })
}

#[cfg(unix)]
fn special_kind(ty: FileType) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    if ty.is_fifo() {
        FileKind::Fifo
    } else if ty.is_char_device() || ty.is_block_device() {
        FileKind::Device
    } else if ty.is_socket() {
        FileKind::Socket
    } else {
        FileKind::Other
    }
}

#[cfg(not(unix))]
fn special_kind(_: FileType) -> FileKind {
    FileKind::Other
}

/// Opens `path` for reading without waiting for a FIFO's writer.
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    o.open(path)
}

impl MappedFile {
    /// Maps `path` read-only; it must be a regular file (or a symlink to one).
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |error| GgufError::Io {
            path: path.display().to_string(),
            error,
        };
        regular(path, std::fs::metadata(path).map_err(io)?.file_type())?;
        let file = open_nonblocking(path).map_err(io)?;
        regular(path, file.metadata().map_err(io)?.file_type())?;
        // SAFETY: the map is read-only and private to this process. The usual hazard of
        // a mapped file is another process truncating or rewriting it while it is mapped;
        // folio copies every tensor it computes with out of the map while the model loads
        // and drops the map afterwards, so the window is the load itself, and every read
        // is bounds-checked against the length taken at map time.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(Self { map })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Lets the system drop `range`'s pages from this process's memory: once a tensor
    /// is copied out, its file pages need not stay resident beside the copy (they stay
    /// in the page cache, and a later read of them faults them back in, the same
    /// bytes). Advice only: where it fails or is not offered, nothing changes.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.map.len());
        if range.start >= end {
            return;
        }
        #[cfg(unix)]
        // SAFETY: the range lies inside the map. MADV_DONTNEED on a read-only file
        // mapping that is never written only drops page-table entries: the next read
        // of those bytes faults the file's page back in, with the same contents (the
        // map's one hazard, another process rewriting the file, is the one `open`
        // already accepts for the length of the load). No reference into the map
        // sees anything but the file's bytes before and after.
        #[allow(unsafe_code)]
        unsafe {
            let _ = self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                range.start,
                end - range.start,
            );
        }
    }
}
