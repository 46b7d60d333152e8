//! [`FunctionCache`]: Cranelift's incremental compilation cache, held in memory for
//! the whole process. Every Python inferlet embeds the same CPython (and every
//! JavaScript one the same engine), so most of an upload's functions were compiled
//! before, for another program: Cranelift looks each function up by a hash of its
//! IR and of every compile setting, and only compiles what it has not met. An upload
//! of the second Python program compiles only its own code.
//!
//! The cache is shared by every [`Host`](crate::Host) of the process (the keys cover
//! the settings, so hosts configured differently never take each other's code) and
//! holds at most [`FunctionCache::BUDGET`] bytes: past that, the oldest entries go
//! first. A miss only costs the compile it would have cost anyway.
//!
//! What sharing reveals: an upload's compile time tells its uploader whether some of
//! its functions were compiled before, for any program of the process. It cannot
//! change another program's code (a key is a SHA-256 of the function's IR and
//! settings, and an entry is only ever the compile of that key). Uploads are an
//! operator's act (the API key), so the process shares one cache; a host that must not
//! reveal even that takes a cache of its own ([`Host::with_cache`](crate::Host::with_cache)).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use wasmtime::CacheStore;

/// Compiled functions by key, oldest first in `order`.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Vec<u8>, Arc<[u8]>>,
    order: VecDeque<Vec<u8>>,
    bytes: usize,
}

/// The process's compiled functions (module doc).
#[derive(Debug)]
pub struct FunctionCache {
    budget: usize,
    entries: Mutex<Entries>,
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

impl FunctionCache {
    /// Bytes of compiled functions (and their keys) kept: a Python and a JavaScript
    /// runtime's worth with room to spare.
    pub const BUDGET: usize = 256 << 20;

    /// An empty cache of `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            entries: Mutex::default(),
            hits: 0.into(),
            misses: 0.into(),
        }
    }

    /// The one cache of the process.
    pub fn shared() -> Arc<FunctionCache> {
        static SHARED: OnceLock<Arc<FunctionCache>> = OnceLock::new();
        SHARED
            .get_or_init(|| Arc::new(FunctionCache::new(FunctionCache::BUDGET)))
            .clone()
    }

    /// Lookups that found a function, and lookups that did not.
    pub fn hits_misses(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while holding the lock leaves whole entries only: keep using them.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        use std::sync::atomic::Ordering::Relaxed;
        let found = self.lock().map.get(key).cloned();
        match found {
            Some(v) => {
                self.hits.fetch_add(1, Relaxed);
                Some(Cow::Owned(v.to_vec()))
            }
            None => {
                self.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let size = key.len() + value.len();
        if size > self.budget {
            return false;
        }
        let mut e = self.lock();
        if e.map.contains_key(key) {
            return true;
        }
        while e.bytes + size > self.budget {
            let Some(old) = e.order.pop_front() else {
                break;
            };
            if let Some(v) = e.map.remove(&old) {
                e.bytes -= old.len() + v.len();
            }
        }
        e.bytes += size;
        e.order.push_back(key.to_vec());
        e.map.insert(key.to_vec(), value.into());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_back_and_the_oldest_go_past_the_budget() {
        let c = FunctionCache::new(100);
        assert!(c.insert(b"a", vec![1; 39]));
        assert!(c.insert(b"b", vec![2; 39]));
        assert_eq!(c.get(b"a").as_deref(), Some(&[1u8; 39][..]));
        assert_eq!(c.bytes(), 80);
        // A third entry does not fit beside both: the oldest goes.
        assert!(c.insert(b"c", vec![3; 39]));
        assert_eq!(c.get(b"a"), None);
        assert_eq!(c.get(b"b").as_deref(), Some(&[2u8; 39][..]));
        assert_eq!(c.bytes(), 80);
        // An entry larger than the whole budget is refused and evicts nothing.
        assert!(!c.insert(b"d", vec![4; 100]));
        assert_eq!(c.bytes(), 80);
        assert_eq!(c.hits_misses(), (2, 1));
    }
}
