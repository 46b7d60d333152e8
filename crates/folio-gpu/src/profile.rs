//! [`Profile`]: where a step's device time goes, dispatch by dispatch (`folio bench
//! --gpu-profile`, [`GpuBackend::with_profile`](crate::GpuBackend::with_profile)).
//!
//! Where the device writes timestamps inside a compute pass (wgpu's
//! `TIMESTAMP_QUERY_INSIDE_PASSES`: Vulkan's `vkCmdWriteTimestamp` at the end of the
//! pipeline), a profiled step writes one as its pass begins and one after each
//! dispatch ([`Timer`], `arena.rs`). A dispatch's time is its stamp less the one
//! before: its own run and the barrier and launch before it, which is what the step
//! pays for it. The profile sums them by the step's size (its rows: a decode step of
//! one sequence is 1, a prefill of 512 tokens 512) and by what each dispatch is (its
//! kernel; a matmul's matrix and format too, with the weight bytes it reads, so that a
//! matmul's GB/s says how near the memory's bandwidth it comes). Each size's host time
//! is beside it: from the step's recording to its results on the host, of which
//! recording the dispatches is a part.
//!
//! The stamps take some device time of their own: a profiled run's speed is not the
//! bench's. A step of more dispatches than a query set holds (4095) is left out; a
//! step whose head runs in further passes (all the logits of a long prompt over a
//! large vocabulary, more than one binding holds) has only its first pass timed, and
//! its host time counts them all. Figures are means over a size's steps.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Timestamps one query set holds (wgpu's most).
pub(crate) const STAMPS: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// A profile's figures, shared by the backend (which adds each step's) and whoever
/// reads them (a clone is another handle on the same figures).
#[derive(Clone, Default)]
pub struct Profile {
    sizes: Arc<Mutex<BTreeMap<usize, StepTimes>>>,
}

/// The steps of one size: how many, their device and host time, and each kind of
/// dispatch's share.
#[derive(Debug, Clone, Default)]
pub struct StepTimes {
    pub steps: u64,
    /// From the first stamp to the last, in the device's ticks (`period_ns` each).
    pub device_ticks: u64,
    pub period_ns: f64,
    /// From recording to the results on the host, and recording alone.
    pub host: Duration,
    pub record: Duration,
    /// Dispatches of the steps, all kinds together.
    pub dispatches: u64,
    /// By kind, in the order the first step ran them.
    pub kinds: Vec<DispatchTimes>,
}

/// One kind of dispatch over the steps of one size.
#[derive(Debug, Clone)]
pub struct DispatchTimes {
    /// The kernel (`attention`, `glu`), or a matmul's matrix and format
    /// (`matmul ffn_down q4_k`).
    pub what: String,
    pub count: u64,
    pub ticks: u64,
    /// Weight bytes its dispatches read (matmuls; 0 for the rest).
    pub bytes: u64,
}

/// One profiled step, as the step hands it over.
pub(crate) struct Stamped<'a> {
    pub rows: usize,
    /// Each dispatch's kind and weight bytes, in order.
    pub kinds: &'a [(String, u64)],
    /// One stamp before the first dispatch and one after each.
    pub ticks: &'a [u64],
    pub period_ns: f32,
    pub host: Duration,
    pub record: Duration,
}

impl Profile {
    /// The sizes (rows a step) profiled so far, smallest first.
    pub fn sizes(&self) -> Vec<usize> {
        self.lock().keys().copied().collect()
    }

    /// The steps of `rows` rows, where any were profiled.
    pub fn steps(&self, rows: usize) -> Option<StepTimes> {
        self.lock().get(&rows).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, StepTimes>> {
        self.sizes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, s: Stamped<'_>) {
        if s.ticks.len() != s.kinds.len() + 1 {
            return;
        }
        let mut sizes = self.lock();
        let t = sizes.entry(s.rows).or_default();
        t.steps += 1;
        t.period_ns = f64::from(s.period_ns);
        t.host += s.host;
        t.record += s.record;
        t.dispatches += s.kinds.len() as u64;
        let (first, last) = (s.ticks[0], s.ticks[s.ticks.len() - 1]);
        t.device_ticks += last.saturating_sub(first);
        for (i, (what, bytes)) in s.kinds.iter().enumerate() {
            let ticks = s.ticks[i + 1].saturating_sub(s.ticks[i]);
            match t.kinds.iter_mut().find(|k| k.what == *what) {
                Some(k) => {
                    k.count += 1;
                    k.ticks += ticks;
                    k.bytes += bytes;
                }
                None => t.kinds.push(DispatchTimes {
                    what: what.clone(),
                    count: 1,
                    ticks,
                    bytes: *bytes,
                }),
            }
        }
    }

    /// A table per size: each kind of dispatch's count, µs and share a step, and a
    /// matmul's weight GB/s; most time first.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (rows, t) in self.lock().iter() {
            let steps = t.steps.max(1) as f64;
            let us = |ticks: u64| ticks as f64 * t.period_ns / 1e3 / steps;
            let device = us(t.device_ticks);
            let _ = writeln!(
                out,
                "gpu profile, steps of {rows} row{}: {} step{}; a step {device:.0} µs on the \
                 device (first dispatch to last, {:.0} dispatches), {:.0} µs on the host from \
                 recording to results ({:.0} µs recording)",
                if *rows == 1 { "" } else { "s" },
                t.steps,
                if t.steps == 1 { "" } else { "s" },
                t.dispatches as f64 / steps,
                t.host.as_secs_f64() * 1e6 / steps,
                t.record.as_secs_f64() * 1e6 / steps,
            );
            let _ = writeln!(
                out,
                "| dispatch                         | a step | µs a step | share | weights GB/s |"
            );
            let _ = writeln!(
                out,
                "|----------------------------------|--------|-----------|-------|--------------|"
            );
            let mut kinds = t.kinds.clone();
            kinds.sort_by_key(|k| std::cmp::Reverse(k.ticks));
            for k in &kinds {
                let time = us(k.ticks);
                let gbs = match k.bytes {
                    0 => "-".to_string(),
                    b => format!("{:.1}", b as f64 / steps / (time * 1e3)),
                };
                let _ = writeln!(
                    out,
                    "| {:<32} | {:>6.0} | {time:>9.1} | {:>4.0}% | {gbs:>12} |",
                    k.what,
                    k.count as f64 / steps,
                    100.0 * time / device.max(f64::MIN_POSITIVE),
                );
            }
        }
        out
    }
}

/// What a profiled step writes its stamps into: a query set and the buffer it is
/// resolved into (kept by the arena across steps).
pub(crate) struct Timer {
    pub set: wgpu::QuerySet,
    pub resolved: wgpu::Buffer,
}

impl Timer {
    pub fn new(device: &wgpu::Device) -> Self {
        Timer {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count: STAMPS,
            }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("profile stamps"),
                size: u64::from(STAMPS) * 8,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_sums_each_kind_of_dispatch_by_step_size() {
        let p = Profile::default();
        let kinds = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|&(w, b)| (w.to_string(), b)).collect()
        };
        let one = kinds(&[
            ("rms_norm", 0),
            ("matmul ffn_down q4_k", 1000),
            ("rms_norm", 0),
        ]);
        let ms = Duration::from_millis(1);
        for ticks in [[10, 12, 20, 21], [100, 101, 111, 113]] {
            p.add(Stamped {
                rows: 1,
                kinds: &one,
                ticks: &ticks,
                period_ns: 2.0,
                host: ms,
                record: ms / 4,
            });
        }
        // A step whose stamps do not match its dispatches is left out.
        p.add(Stamped {
            rows: 1,
            kinds: &one,
            ticks: &[1, 2],
            period_ns: 2.0,
            host: ms,
            record: ms,
        });
        let t = p.steps(1).expect("profiled");
        assert_eq!((t.steps, t.dispatches, t.device_ticks), (2, 6, 24));
        let got: Vec<_> = t
            .kinds
            .iter()
            .map(|k| (&k.what[..], k.count, k.ticks, k.bytes))
            .collect();
        assert_eq!(
            got,
            [("rms_norm", 4, 6, 0), ("matmul ffn_down q4_k", 2, 18, 2000)]
        );
        assert_eq!(p.sizes(), [1]);
        assert!(p.steps(2).is_none());
        // Another size is summed apart.
        p.add(Stamped {
            rows: 7,
            kinds: &one[..1],
            ticks: &[5, 9],
            period_ns: 2.0,
            host: ms,
            record: ms,
        });
        assert_eq!(p.sizes(), [1, 7]);
        let seven = p.steps(7).expect("profiled");
        assert_eq!(
            (seven.steps, seven.dispatches, seven.device_ticks),
            (1, 1, 4)
        );
        assert_eq!(p.steps(1).expect("profiled").device_ticks, 24);
        // 18 ticks of 2 ns over 2 steps: 18 ns a step; 1000 bytes in 18 ns.
        let report = p.report();
        assert!(report.contains("2 steps; a step 0 µs"), "{report}");
        assert!(report.contains("steps of 7 rows: 1 step;"), "{report}");
        let down = report
            .lines()
            .find(|l| l.contains("ffn_down"))
            .expect("a row");
        assert!(
            down.contains("75%") && down.trim_end().ends_with("55.6 |"),
            "{down}"
        );
    }
}
