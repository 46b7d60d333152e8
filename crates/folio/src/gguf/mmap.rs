//! The one place folio maps a file into memory.

use crate::error::GgufError;
use std::fs::File;
use std::path::Path;

/// A read-only memory map of a whole file.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
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
}
