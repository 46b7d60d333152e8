//! [`Host`]: the wasmtime engine every inferlet runs on (component model, WASI 0.2
//! with nothing granted, epoch interruption ticked by a background thread), the
//! linker with folio's interface, and the count of runs at once. [`Host::compile`]
//! compiles and links a component once (an upload); [`Host::run`] only
//! instantiates it in a fresh store bounded by [`Limits`] and calls its `run`.

use crate::bindings::InferletPre;
use crate::compiled::FunctionCache;
use crate::error::InferletError;
use crate::limits::{Limits, TICK};
use crate::run::{Chunk, RunState, Stop};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, InstanceAllocationStrategy, PoolingAllocationConfig, Store, StoreLimitsBuilder,
    UpdateDeadline,
};
use wasmtime_wasi::WasiCtxBuilder;

/// A compiled, linked program: a run only instantiates it.
#[derive(Clone)]
pub struct Program {
    pre: InferletPre<RunState>,
    /// Size of the component's bytes.
    pub size: usize,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("size", &self.size).finish()
    }
}

/// What a finished run reports besides its chunks.
#[derive(Debug, Clone, Copy)]
pub struct RunReport {
    /// Host calls the guest made.
    pub host_calls: u64,
    /// The run's wall time, instantiation included.
    pub elapsed: Duration,
    /// Of which instantiation.
    pub instantiate: Duration,
    /// The token counts of the run's generations, summed: prompt tokens (those read
    /// from the prefix cache or a fork among them) and tokens generated. Scoring
    /// calls (`score`, `next-logprobs`) are not generations and are not counted.
    pub usage: folio::Usage,
}

/// Shared by the host and its ticker thread.
struct Shared {
    stop: AtomicBool,
    running: AtomicUsize,
}

/// The inferlet host over one folio engine.
pub struct Host {
    wasm: wasmtime::Engine,
    linker: Linker<RunState>,
    engine: folio::Engine,
    /// Compiled functions, shared with every program compiled before.
    cache: Arc<FunctionCache>,
    limits: Limits,
    shared: Arc<Shared>,
    ticker: Option<JoinHandle<()>>,
}

/// A slot among the runs allowed at once; dropping it frees the slot.
pub struct Permit {
    shared: Arc<Shared>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A handle that stops a run (checked at every epoch tick and host call).
#[derive(Clone, Default, Debug)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Host {
    /// A host over `engine` with `limits`; starts the epoch ticker. Functions any
    /// program of the process compiled before are taken as compiled
    /// ([`FunctionCache::shared`]): an upload compiles only its own code.
    pub fn new(engine: folio::Engine, limits: Limits) -> Result<Self, InferletError> {
        Self::with_cache(engine, limits, FunctionCache::shared())
    }

    /// [`Host::new`] with its own cache of compiled functions.
    pub fn with_cache(
        engine: folio::Engine,
        limits: Limits,
        cache: Arc<FunctionCache>,
    ) -> Result<Self, InferletError> {
        let mut cfg = Config::new();
        cfg.wasm_component_model(true);
        cfg.epoch_interruption(true);
        cfg.enable_incremental_compilation(cache.clone())
            .map_err(|e| InferletError::Host(e.to_string()))?;
        if limits.pooled {
            cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool(&limits)));
        }
        let wasm = match wasmtime::Engine::new(&cfg) {
            Ok(w) => w,
            Err(e) => {
                // The pool reserves address space up front; where that is refused
                // (a tight `ulimit -v`), instances are allocated one by one instead.
                tracing::warn!(
                    "inferlets: no instance pool ({e:#}); instances are allocated per run"
                );
                cfg.allocation_strategy(InstanceAllocationStrategy::OnDemand);
                wasmtime::Engine::new(&cfg).map_err(|e| InferletError::Host(e.to_string()))?
            }
        };
        let mut linker = Linker::new(&wasm);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| InferletError::Host(e.to_string()))?;
        crate::bindings::Inferlet::add_to_linker::<RunState, HasSelf<RunState>>(&mut linker, |s| s)
            .map_err(|e| InferletError::Host(e.to_string()))?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            running: AtomicUsize::new(0),
        });
        let ticker = {
            let (wasm, shared) = (wasm.clone(), shared.clone());
            std::thread::Builder::new()
                .name("folio-inferlet-epoch".into())
                .spawn(move || {
                    while !shared.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        wasm.increment_epoch();
                    }
                })
                .map_err(|e| InferletError::Host(format!("cannot start the epoch ticker: {e}")))?
        };
        Ok(Self {
            wasm,
            linker,
            engine,
            cache,
            limits,
            shared,
            ticker: Some(ticker),
        })
    }

    /// The cache of compiled functions this host's compiles read and fill.
    pub fn function_cache(&self) -> &FunctionCache {
        &self.cache
    }

    /// The limits runs are held to.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The folio engine the programs drive.
    pub fn engine(&self) -> &folio::Engine {
        &self.engine
    }

    /// Runs going on now.
    pub fn running(&self) -> usize {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Compiles `bytes` (a component of the `folio:inferlet` world) and links it;
    /// a module, a component of another world or one that imports what the host
    /// does not give (sockets, say) is [`InferletError::Invalid`].
    pub fn compile(&self, bytes: &[u8]) -> Result<Program, InferletError> {
        if bytes.len() > self.limits.program_bytes {
            return Err(InferletError::TooLarge {
                size: bytes.len(),
                limit: self.limits.program_bytes,
            });
        }
        let t = Instant::now();
        let component = Component::new(&self.wasm, bytes)
            .map_err(|e| InferletError::Invalid(format!("{e:#}")))?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| InferletError::Invalid(format!("{e:#}")))?;
        let pre = InferletPre::new(pre).map_err(|e| InferletError::Invalid(format!("{e:#}")))?;
        let (hits, misses) = self.cache.hits_misses();
        tracing::info!(
            "inferlet compiled: {} bytes in {:.2} s (functions found compiled so far: {hits}, compiled: {misses})",
            bytes.len(),
            t.elapsed().as_secs_f64()
        );
        Ok(Program {
            pre,
            size: bytes.len(),
        })
    }

    /// A slot for one run, or [`InferletError::TooManyRuns`].
    pub fn permit(&self) -> Result<Permit, InferletError> {
        let max = self.limits.concurrent_runs;
        let mut now = self.shared.running.load(Ordering::Acquire);
        loop {
            if now >= max {
                return Err(InferletError::TooManyRuns(max));
            }
            match self.shared.running.compare_exchange(
                now,
                now + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Permit {
                        shared: self.shared.clone(),
                    })
                }
                Err(v) => now = v,
            }
        }
    }

    /// Runs `program` with `input` (JSON text), sending its chunks to `sink` (which
    /// answers false when the caller is gone: the run is then cancelled). The run
    /// may take `time_limit` when given and shorter than the host's limit. Blocks
    /// until the run ends; call it off an async runtime's threads. Whatever the
    /// outcome, the run's contexts are dropped before it returns.
    pub fn run(
        &self,
        _permit: Permit,
        program: &Program,
        input: &str,
        time_limit: Option<Duration>,
        cancel: &Cancel,
        sink: impl FnMut(Chunk) -> bool + Send + 'static,
    ) -> Result<RunReport, InferletError> {
        let started = Instant::now();
        let mut quota = self.limits.clone();
        quota.run_time = time_limit.map_or(quota.run_time, |t| t.min(quota.run_time));
        let run_time = quota.run_time;
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_bytes)
            .trap_on_grow_failure(false)
            .build();
        // WASI with nothing granted: no files, no sockets, no environment, no
        // arguments; stdout and stderr go nowhere.
        let wasi = WasiCtxBuilder::new()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = RunState {
            wasi,
            table: Default::default(),
            limits,
            engine: self.engine.clone(),
            sink: Box::new(sink),
            cancel: cancel.0.clone(),
            started,
            deadline: started + run_time,
            quota,
            live: Vec::new(),
            emitted_bytes: 0,
            host_calls: 0,
            usage: folio::Usage::default(),
            stop: None,
        };
        let mut store = Store::new(&self.wasm, state);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut cx| {
            let s = cx.data_mut();
            if s.cancel.load(Ordering::Relaxed) {
                return Err(s.halt(Stop::Cancelled));
            }
            if Instant::now() >= s.deadline {
                return Err(s.halt(Stop::TimedOut));
            }
            Ok(UpdateDeadline::Continue(1))
        });
        let result = program
            .pre
            .instantiate(&mut store)
            .map(|inst| (inst, started.elapsed()))
            .and_then(|(inst, took)| inst.call_run(&mut store, input).map(|r| (r, took)));
        let (host_calls, usage) = (store.data().host_calls, store.data().usage);
        let stop = store.data_mut().stop.take();
        // Dropping the store drops the resource table: every context still held.
        drop(store);
        let elapsed = started.elapsed();
        match (result, stop) {
            (Ok((Ok(()), instantiate)), _) => Ok(RunReport {
                host_calls,
                elapsed,
                instantiate,
                usage,
            }),
            (Ok((Err(msg), _)), _) => Err(InferletError::Program(msg)),
            (Err(_), Some(Stop::TimedOut)) => Err(InferletError::TimedOut(run_time)),
            (Err(_), Some(Stop::Cancelled)) => Err(InferletError::Cancelled),
            (Err(_), Some(Stop::Quota(m))) => Err(InferletError::Quota(m)),
            (Err(e), None) => {
                // The root cause ("unknown handle index 7777", "wasm `unreachable`
                // instruction executed"), not the guest's backtrace.
                let msg = e.root_cause().to_string();
                tracing::info!("an inferlet trapped: {e:#}");
                Err(InferletError::Trap(msg))
            }
        }
    }
}

/// The instance pool: a slot per run allowed at once (and one spare), each sized for
/// the largest guest we build (a Python component: a dozen core instances, tables of
/// some 20 000 functions), its memories bounded by the run's memory limit. A slot
/// keeps its mappings between runs, and a memory is reset copy-on-write from the
/// module's image, so a run's instantiation is a few page-table updates.
fn pool(limits: &Limits) -> PoolingAllocationConfig {
    const CORE_PER_COMPONENT: u32 = 32;
    const MEMORIES_PER_COMPONENT: u32 = 8;
    const TABLES_PER_COMPONENT: u32 = 32;
    let slots = u32::try_from(limits.concurrent_runs)
        .unwrap_or(u32::MAX)
        .saturating_add(1);
    let mut p = PoolingAllocationConfig::new();
    p.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(CORE_PER_COMPONENT))
        .total_memories(slots.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(slots.saturating_mul(TABLES_PER_COMPONENT))
        .total_stacks(slots)
        .max_core_instances_per_component(CORE_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_tables_per_module(4)
        .max_memories_per_module(1)
        .table_elements(100_000)
        .max_core_instance_size(4 << 20)
        .max_component_instance_size(4 << 20)
        .max_memory_size(limits.memory_bytes)
        .max_unused_warm_slots(slots);
    p
}

impl Drop for Host {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}
