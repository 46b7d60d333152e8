//! [`Limits`]: the sandbox's bounds on one run and on the host as a whole.

use std::time::Duration;

/// What one run may use, and how many may run at once.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock time one run may take, host calls (generation) included; past it
    /// the guest is stopped at its next epoch check (within [`TICK`]) or its next
    /// host call, and its contexts are dropped.
    pub run_time: Duration,
    /// Bytes of linear memory one instance may hold (all its memories together).
    pub memory_bytes: usize,
    /// Contexts one run may hold at once (created and forked, not yet dropped).
    pub contexts: usize,
    /// Pool pages one run's contexts may hold together, each page counted once (a
    /// page forks share counts once). A generation is cut to the room left; a flush
    /// or pass that takes the run past it stops the run (its pages return).
    pub pages: usize,
    /// Runs at once; one more is refused ([`crate::InferletError::TooManyRuns`]).
    pub concurrent_runs: usize,
    /// Bytes one run may emit to its caller.
    pub output_bytes: usize,
    /// Tokens one `generate` may ask for (a larger `max-tokens` is cut to it).
    pub max_tokens: u32,
    /// Size of one uploaded component.
    pub program_bytes: usize,
    /// Programs kept in a store.
    pub programs: usize,
    /// Instances from the pooling allocator (slots reserved at start, reused warm);
    /// off: each run's instance is allocated afresh.
    pub pooled: bool,
}

/// How often the epoch ticks: the granularity of the time limit and of cancellation
/// while the guest computes.
pub const TICK: Duration = Duration::from_millis(10);

impl Default for Limits {
    fn default() -> Self {
        Self {
            run_time: Duration::from_secs(120),
            memory_bytes: 256 << 20,
            contexts: 64,
            pages: 4096,
            concurrent_runs: 4,
            output_bytes: 8 << 20,
            max_tokens: 4096,
            program_bytes: 64 << 20,
            programs: 64,
            pooled: true,
        }
    }
}
