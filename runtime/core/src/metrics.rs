//! Counters and histograms of one host, rendered in the Prometheus text format.
//!
//! [`Metrics::observe`] takes every [`Event`] of an instance; the Wasm host reports guest traps
//! by kind ([`Metrics::guest_trap`]) and the attempt loop the latency of each heartbeat
//! ([`Metrics::heartbeat_latency`]). Labels are few and bounded (claim outcomes, trap kinds),
//! so ten thousand jobs cost no more series than one.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::instance::{Event, EventKind};

/// Upper bounds (seconds) of the run-duration buckets: 5 ms to 1 h.
const RUN_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Upper bounds (seconds) of the heartbeat-latency buckets: 0.5 ms to 5 s.
const HEARTBEAT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// A histogram with fixed buckets.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        for (bound, count) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug)]
struct Inner {
    claims: BTreeMap<&'static str, u64>,
    takeovers: u64,
    lost: u64,
    skips: u64,
    late: u64,
    hand_overs: u64,
    interrupted: u64,
    runs: BTreeMap<&'static str, u64>,
    traps: BTreeMap<String, u64>,
    run_seconds: Histogram,
    heartbeat_seconds: Histogram,
    /// When each running attempt started, by job, slot and attempt.
    started: HashMap<(String, i64, Option<u32>), Instant>,
}

/// The metrics of one host.
#[derive(Debug)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Metrics {
            inner: Mutex::new(Inner {
                claims: BTreeMap::new(),
                takeovers: 0,
                lost: 0,
                skips: 0,
                late: 0,
                hand_overs: 0,
                interrupted: 0,
                runs: BTreeMap::new(),
                traps: BTreeMap::new(),
                run_seconds: Histogram::new(RUN_BUCKETS),
                heartbeat_seconds: Histogram::new(HEARTBEAT_BUCKETS),
                started: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts an instance event: claims by outcome (`won`, `running` for a backup, `overlap`
    /// or `superseded` for a skip, `late`), takeovers, lost attempts, skips, late claims,
    /// hand-overs, interrupted runs, finished runs by status, and run durations (started to
    /// success or failed).
    pub fn observe(&self, event: &Event) {
        let mut m = self.lock();
        let key = (event.job.clone(), event.slot, event.attempt);
        match event.kind {
            EventKind::Won => *m.claims.entry("won").or_default() += 1,
            EventKind::Backup => *m.claims.entry("running").or_default() += 1,
            EventKind::Skip => {
                m.skips += 1;
                let outcome = if event.reason == "superseded" {
                    "superseded"
                } else {
                    "overlap"
                };
                *m.claims.entry(outcome).or_default() += 1;
            }
            EventKind::Late => {
                m.late += 1;
                *m.claims.entry("late").or_default() += 1;
            }
            EventKind::Takeover => m.takeovers += 1,
            EventKind::Started => {
                m.started.insert(key, Instant::now());
            }
            EventKind::Success | EventKind::Failed => {
                let status = if event.kind == EventKind::Success {
                    "success"
                } else {
                    "failed"
                };
                *m.runs.entry(status).or_default() += 1;
                if let Some(at) = m.started.remove(&key) {
                    m.run_seconds.observe(at.elapsed().as_secs_f64());
                }
            }
            EventKind::Lost => {
                m.lost += 1;
                m.started.remove(&key);
            }
            EventKind::Released => {
                m.hand_overs += 1;
                m.started.remove(&key);
            }
            EventKind::Interrupted => m.interrupted += 1,
        }
    }

    /// Records how long one heartbeat took, sent to answered.
    pub fn heartbeat_latency(&self, took: Duration) {
        self.lock().heartbeat_seconds.observe(took.as_secs_f64());
    }

    /// Counts a guest trap of a kind (`interrupt`, `memory`, `unreachable`, …).
    pub fn guest_trap(&self, kind: &str) {
        *self.lock().traps.entry(kind.to_owned()).or_default() += 1;
    }

    /// The metrics in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let m = self.lock();
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        };
        let labelled =
            |out: &mut String, name: &str, help: &str, label: &str, values: Vec<(&str, u64)>| {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} counter");
                for (value, count) in values {
                    let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {count}", escape(value));
                }
            };
        labelled(
            &mut out,
            "baton_claims_total",
            "Claims this host sent, by the store's answer.",
            "outcome",
            m.claims.iter().map(|(k, v)| (*k, *v)).collect(),
        );
        counter(
            &mut out,
            "baton_takeovers_total",
            "Runs this host took over from a runner that died or handed over.",
            m.takeovers,
        );
        counter(
            &mut out,
            "baton_lost_total",
            "Attempts of this host that lost their lease (refused or self-fenced).",
            m.lost,
        );
        counter(
            &mut out,
            "baton_skips_total",
            "Slots this host skipped (overlap or superseded).",
            m.skips,
        );
        counter(
            &mut out,
            "baton_late_total",
            "Claims the store called late.",
            m.late,
        );
        counter(
            &mut out,
            "baton_hand_overs_total",
            "Attempts this host released on stop.",
            m.hand_overs,
        );
        counter(
            &mut out,
            "baton_interrupted_total",
            "Runs this host's claims marked interrupted.",
            m.interrupted,
        );
        labelled(
            &mut out,
            "baton_runs_total",
            "Attempts this host finished, by status.",
            "status",
            m.runs.iter().map(|(k, v)| (*k, *v)).collect(),
        );
        labelled(
            &mut out,
            "baton_guest_traps_total",
            "Guest traps, by kind.",
            "kind",
            m.traps.iter().map(|(k, v)| (k.as_str(), *v)).collect(),
        );
        m.run_seconds.render(
            &mut out,
            "baton_run_duration_seconds",
            "How long finished attempts ran, started to finished.",
        );
        m.heartbeat_seconds.render(
            &mut out,
            "baton_heartbeat_latency_seconds",
            "How long heartbeats took, sent to answered.",
        );
        out
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, reason: &str) -> Event {
        Event {
            kind,
            job: "report".into(),
            slot: 1000,
            attempt: Some(1),
            runner: "a".into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn events_count_claims_by_outcome_and_runs_by_status() {
        let m = Metrics::new();
        for (kind, reason) in [
            (EventKind::Won, "scheduled"),
            (EventKind::Started, ""),
            (EventKind::Success, ""),
            (EventKind::Backup, ""),
            (EventKind::Skip, "overlap"),
            (EventKind::Skip, "superseded"),
            (EventKind::Late, ""),
            (EventKind::Takeover, ""),
        ] {
            m.observe(&event(kind, reason));
        }
        m.guest_trap("interrupt");
        m.heartbeat_latency(Duration::from_millis(2));
        let text = m.render();
        for line in [
            "baton_claims_total{outcome=\"won\"} 1",
            "baton_claims_total{outcome=\"running\"} 1",
            "baton_claims_total{outcome=\"overlap\"} 1",
            "baton_claims_total{outcome=\"superseded\"} 1",
            "baton_claims_total{outcome=\"late\"} 1",
            "baton_takeovers_total 1",
            "baton_skips_total 2",
            "baton_runs_total{status=\"success\"} 1",
            "baton_guest_traps_total{kind=\"interrupt\"} 1",
            "baton_run_duration_seconds_count 1",
            "baton_heartbeat_latency_seconds_bucket{le=\"0.0025\"} 1",
            "baton_heartbeat_latency_seconds_bucket{le=\"0.001\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
