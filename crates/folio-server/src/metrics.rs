//! `/metrics`: Prometheus text with vLLM's metric names under a `folio:` prefix (a
//! dashboard built for vLLM works by changing the prefix), plus folio's own: pages by
//! state, shared pages, forks, cancellations; and the figures routers score replicas
//! by under `vllm:` itself (`render_vllm`), so a router built for vLLM works unchanged. Request figures are counted here as
//! requests end; pool and scheduler figures come from the engine's counters at scrape
//! time.

use folio::engine::STEP_TOKEN_BOUNDS;
use folio::{EngineStats, FinishReason};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A histogram of seconds with fixed bucket bounds.
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.partition_point(|&b| b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let les = self.bounds.iter().map(|b| b.to_string());
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        histogram(out, name, help, labels, les, &counts, sum);
    }
}

/// Writes a Prometheus histogram from per-bucket (not cumulative) counts; the last
/// count is the `+Inf` bucket's own.
fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    labels: &str,
    les: impl Iterator<Item = String>,
    counts: &[u64],
    sum: f64,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut acc = 0;
    for (le, c) in les.chain(std::iter::once("+Inf".to_string())).zip(counts) {
        acc += c;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {acc}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {acc}");
}

const LATENCY: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const PER_TOKEN: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];

/// The request figures the server counts itself.
pub struct Metrics {
    pub prompt_tokens: AtomicU64,
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    /// Samples ended by each reason: stop, length.
    finished: [AtomicU64; 2],
    /// Requests whose client went away (or that were cut off at shutdown).
    pub cancelled: AtomicU64,
    /// Requests that failed (an error answer or an error event).
    pub failed: AtomicU64,
    /// Requests stopped by `--request-timeout` (counted in `failed` too).
    pub timed_out: AtomicU64,
    /// Streams stopped because their client did not read them (counted in
    /// `cancelled` too once the connection goes).
    pub unread: AtomicU64,
    pub ttft: Histogram,
    pub per_token: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            prompt_tokens: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            finished: [AtomicU64::new(0), AtomicU64::new(0)],
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            unread: AtomicU64::new(0),
            ttft: Histogram::new(LATENCY),
            per_token: Histogram::new(PER_TOKEN),
            e2e: Histogram::new(LATENCY),
            queue: Histogram::new(LATENCY),
        }
    }
}

impl Metrics {
    pub fn finished(&self, why: FinishReason) {
        let i = usize::from(why == FinishReason::Length);
        self.finished[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The whole page: the server's counters and the engine's `stats`.
    pub fn render(&self, model: &str, stats: Option<&EngineStats>) -> String {
        let l = format!("model_name=\"{}\"", model.replace(['"', '\\', '\n'], "_"));
        let mut out = String::new();
        self.render_requests(&mut out, &l);
        if let Some(s) = stats {
            render_engine(&mut out, &l, s);
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
            render_vllm(
                &mut out,
                &l,
                s,
                (get(&self.prefix_queries), get(&self.prefix_hits)),
            );
        }
        out
    }

    /// The server's own figures: request counters and latency histograms.
    fn render_requests(&self, out: &mut String, l: &str) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            out,
            l,
            "prompt_tokens_total",
            "Prompt tokens of finished requests.",
            get(&self.prompt_tokens),
        );
        counter(
            out,
            l,
            "prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            get(&self.prefix_queries),
        );
        counter(
            out,
            l,
            "prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache (not computed).",
            get(&self.prefix_hits),
        );
        let _ = writeln!(
            out,
            "# HELP folio:request_success_total Samples finished, by reason.\n# TYPE folio:request_success_total counter"
        );
        for (reason, c) in ["stop", "length"].iter().zip(&self.finished) {
            let _ = writeln!(
                out,
                "folio:request_success_total{{{l},finished_reason=\"{reason}\"}} {}",
                get(c)
            );
        }
        counter(
            out,
            l,
            "requests_cancelled_total",
            "Requests cancelled: the client went away, or shutdown cut them off.",
            get(&self.cancelled),
        );
        counter(
            out,
            l,
            "requests_failed_total",
            "Requests answered with an error.",
            get(&self.failed),
        );
        counter(
            out,
            l,
            "streams_unread_total",
            "Streams stopped because their client stopped reading them (more events waited than one request may buffer).",
            get(&self.unread),
        );
        counter(
            out,
            l,
            "requests_timed_out_total",
            "Requests stopped by --request-timeout (also counted as failed).",
            get(&self.timed_out),
        );
        self.ttft.render(
            out,
            "folio:time_to_first_token_seconds",
            "Time to first token.",
            l,
        );
        self.per_token.render(
            out,
            "folio:time_per_output_token_seconds",
            "Time between output tokens.",
            l,
        );
        self.e2e.render(
            out,
            "folio:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            l,
        );
        self.queue.render(
            out,
            "folio:request_queue_time_seconds",
            "Time a request waited for its first pages.",
            l,
        );
    }
}

/// A counter's lines.
fn counter(out: &mut String, l: &str, name: &str, help: &str, v: u64) {
    family(out, ("counter", &format!("folio:{name}")), help, l, v);
}

/// A gauge's lines.
fn gauge(out: &mut String, l: &str, name: &str, help: &str, v: String) {
    family(out, ("gauge", &format!("folio:{name}")), help, l, v);
}

/// One sample's family: its help, type and value, under its full name.
fn family(
    out: &mut String,
    (kind, name): (&str, &str),
    help: &str,
    l: &str,
    v: impl std::fmt::Display,
) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{l}}} {v}"
    );
}

/// Speculative decoding's figures: drafts verified, tokens drafted and accepted, the
/// acceptance rate and the tokens a draft step yields on average.
fn render_spec(out: &mut String, l: &str, s: &EngineStats) {
    counter(
        out,
        l,
        "spec_decode_num_drafts_total",
        "Decode steps of a sample that verified a draft.",
        s.spec_drafts,
    );
    counter(
        out,
        l,
        "spec_decode_num_draft_tokens_total",
        "Tokens drafted (without a draft model).",
        s.spec_drafted_tokens,
    );
    counter(
        out,
        l,
        "spec_decode_num_accepted_tokens_total",
        "Drafted tokens accepted.",
        s.spec_accepted_tokens,
    );
    let rate = s.spec_accepted_tokens as f64 / s.spec_drafted_tokens.max(1) as f64;
    gauge(
        out,
        l,
        "spec_decode_acceptance_rate",
        "Drafted tokens accepted, as a fraction of those drafted (0 before any draft).",
        rate.to_string(),
    );
    let per_step = if s.spec_drafts == 0 {
        0.0
    } else {
        1.0 + s.spec_accepted_tokens as f64 / s.spec_drafts as f64
    };
    gauge(
        out,
        l,
        "spec_decode_tokens_per_draft_step",
        "Tokens a sample's draft step yielded on average (1 + accepted per draft; 0 before any).",
        per_step.to_string(),
    );
    gauge(
        out,
        l,
        "spec_decode_row_cost",
        "What a drafted row costs a decode step, in one-row steps, fitted from the engine's one-sequence steps (0.15 until measured); drafts must pay for it.",
        s.spec_row_cost.to_string(),
    );
}

/// What runs the forward steps, as an info gauge (`backend="gpu ..."`), and the
/// backend's own figures (a GPU's device memory and host-device transfers).
fn render_backend(out: &mut String, l: &str, s: &EngineStats) {
    let backend = s.backend.replace(['"', '\\', '\n'], "_");
    let labels = format!("{l},backend=\"{backend}\"");
    family(
        out,
        ("gauge", "folio:backend_info"),
        "What runs the forward steps (the label); always 1.",
        &labels,
        1,
    );
    for f in &s.backend_figures {
        let kind = if f.counter { "counter" } else { "gauge" };
        family(
            out,
            (kind, &format!("folio:{}", f.name)),
            f.help,
            l,
            f.value,
        );
    }
}

/// The disk tier's figures (`--kv-disk`): what it holds, its reads and its writes.
fn render_disk(out: &mut String, l: &str, d: &folio::DiskStats) {
    for (name, help, v) in [
        ("kv_disk_pages", "KV pages on disk.", d.pages as u64),
        (
            "kv_disk_bytes",
            "Bytes of the disk tier's page files.",
            d.bytes,
        ),
        (
            "kv_disk_max_bytes",
            "The disk tier's limit (--kv-disk-size).",
            d.max_bytes,
        ),
        (
            "kv_disk_write_queue",
            "Pages waiting to be written behind.",
            d.queued,
        ),
    ] {
        gauge(out, l, name, help, v.to_string());
    }
    for (name, help, v) in [
        (
            "kv_disk_hits_total",
            "KV pages read back from disk into the pool.",
            d.hits,
        ),
        (
            "kv_disk_misses_total",
            "Prefix lookups that ran out of pages in memory and found none on disk.",
            d.misses,
        ),
        (
            "kv_disk_writes_total",
            "KV pages written to disk.",
            d.writes,
        ),
        (
            "kv_disk_writes_dropped_total",
            "Pages not written because the write-behind queue was full.",
            d.dropped,
        ),
        (
            "kv_disk_write_errors_total",
            "Page writes that failed (I/O error, full disk).",
            d.write_errors,
        ),
        (
            "kv_disk_skipped_files_total",
            "Page files skipped and removed as unusable (corrupt, cut short, another pool's).",
            d.skipped,
        ),
    ] {
        counter(out, l, name, help, v);
    }
    family(
        out,
        ("counter", "folio:kv_disk_read_seconds_total"),
        "Seconds spent reading and checking pages read back from disk.",
        l,
        d.read_seconds,
    );
}

/// The figures a router built for vLLM scores replicas by, under vLLM's own names (llm-d's
/// default scorers and the vLLM production stack's router read these): the queues, the
/// KV usage (as vLLM's fraction, under its current and its older name), the prefix
/// cache's queries and hits in tokens, and the cache's configuration as an info gauge.
fn render_vllm(out: &mut String, l: &str, s: &EngineStats, (queries, hits): (u64, u64)) {
    let used = (s.pages_working + s.pages_committed) as f64 / s.pages_total.max(1) as f64;
    for (kind, name, help, v) in [
        (
            "gauge",
            "num_requests_running",
            "Requests running (holding KV pages).",
            s.running.to_string(),
        ),
        (
            "gauge",
            "num_requests_waiting",
            "Requests waiting for KV pages.",
            s.waiting.to_string(),
        ),
        (
            "gauge",
            "kv_cache_usage_perc",
            "KV cache usage: 1 means every page in use.",
            used.to_string(),
        ),
        (
            "gauge",
            "gpu_cache_usage_perc",
            "KV cache usage (vLLM's older name; folio's pool is in RAM).",
            used.to_string(),
        ),
        (
            "counter",
            "prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            queries.to_string(),
        ),
        (
            "counter",
            "prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            hits.to_string(),
        ),
        (
            "counter",
            "num_preemptions_total",
            "Requests preempted to free KV pages.",
            s.preemptions.to_string(),
        ),
        (
            "counter",
            "spec_decode_num_drafts_total",
            "Speculative decoding: decode steps of a sample that verified a draft.",
            s.spec_drafts.to_string(),
        ),
        (
            "counter",
            "spec_decode_num_draft_tokens_total",
            "Speculative decoding: tokens drafted.",
            s.spec_drafted_tokens.to_string(),
        ),
        (
            "counter",
            "spec_decode_num_accepted_tokens_total",
            "Speculative decoding: drafted tokens accepted.",
            s.spec_accepted_tokens.to_string(),
        ),
    ] {
        family(out, (kind, &format!("vllm:{name}")), help, l, v);
    }
    let info = format!(
        "{l},block_size=\"{}\",num_gpu_blocks=\"{}\",num_cpu_blocks=\"0\",cache_dtype=\"auto\",enable_prefix_caching=\"True\"",
        s.page_size, s.pages_total
    );
    family(
        out,
        ("gauge", "vllm:cache_config_info"),
        "The KV cache's configuration (KV pages are vLLM's blocks).",
        &info,
        1,
    );
}

/// The engine's figures (left out while it loads): the queues, pages, forks and steps.
fn render_engine(out: &mut String, l: &str, s: &EngineStats) {
    gauge(
        out,
        l,
        "num_requests_running",
        "Sequences holding pages.",
        s.running.to_string(),
    );
    gauge(
        out,
        l,
        "num_requests_waiting",
        "Sequences waiting for pages.",
        s.waiting.to_string(),
    );
    let used = (s.pages_working + s.pages_committed) as f64 / s.pages_total.max(1) as f64;
    gauge(
        out,
        l,
        "kv_cache_usage_perc",
        "Fraction of KV pages in use (cached pages are reclaimable, so not counted).",
        used.to_string(),
    );
    counter(
        out,
        l,
        "num_preemptions_total",
        "Sequences preempted to free pages.",
        s.preemptions,
    );
    let _ = writeln!(
        out,
        "# HELP folio:kv_pages KV pages by state.\n# TYPE folio:kv_pages gauge"
    );
    for (state, v) in [
        ("free", s.pages_free),
        ("working", s.pages_working),
        ("committed", s.pages_committed),
        ("cached", s.pages_cached),
        ("pinned", s.pages_pinned),
    ] {
        let _ = writeln!(out, "folio:kv_pages{{{l},state=\"{state}\"}} {v}");
    }
    gauge(
        out,
        l,
        "kv_pages_total",
        "KV pages in the pool.",
        s.pages_total.to_string(),
    );
    gauge(
        out,
        l,
        "kv_pages_shared",
        "KV pages held by more than one sequence, context or snapshot.",
        s.pages_shared.to_string(),
    );
    gauge(
        out,
        l,
        "kv_page_size",
        "Token slots per KV page.",
        s.page_size.to_string(),
    );
    counter(
        out,
        l,
        "forks_total",
        "Forks: n > 1 samples and context forks, each O(1) in committed pages.",
        s.forks,
    );
    counter(
        out,
        l,
        "kv_evictions_total",
        "Cached pages reclaimed.",
        s.evictions,
    );
    counter(
        out,
        l,
        "prefilled_tokens_total",
        "Prompt tokens computed.",
        s.prefilled_tokens,
    );
    counter(
        out,
        l,
        "generation_tokens_total",
        "Tokens generated, counted as the steps sample them (as vLLM's): a request cancelled midway counts what it generated.",
        s.generated_tokens,
    );
    counter(out, l, "engine_steps_total", "Forward steps run.", s.steps);
    render_spec(out, l, s);
    if let Some(d) = &s.disk {
        render_disk(out, l, d);
    }
    render_backend(out, l, s);
    histogram(
        out,
        "folio:iteration_tokens_total",
        "Token rows per forward step.",
        l,
        STEP_TOKEN_BOUNDS.iter().map(|b| b.to_string()),
        &s.step_tokens,
        s.step_tokens_sum as f64,
    );
}
