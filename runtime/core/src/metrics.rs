//! Counters, gauges and histograms of one host, kept and rendered by `prometheus-client`.
//!
//! [`Metrics::observe`] takes every [`Event`] of an instance; the Wasm host reports guest traps
//! by kind ([`Metrics::guest_trap`]) and the attempt loop the latency of each heartbeat
//! ([`Metrics::heartbeat_latency`]). The host-wide series have few, bounded labels (claim
//! outcomes, statuses, trap kinds). Three series per job carry the label `job`, the ones
//! operators alert on: the last success's time, the failures since it, and the last run's
//! duration; they go when the job is unloaded ([`Metrics::forget_job`]). So 10 000 jobs cost
//! 30 000 series, plus the host-wide ones.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::event::{Event, EventKind};

/// Upper bounds (seconds) of the run-duration buckets: 5 ms to 1 h.
const RUN_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Upper bounds (seconds) of the heartbeat-latency buckets: 0.5 ms to 5 s.
const HEARTBEAT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The content type of [`Metrics::render`]'s text: OpenMetrics 1.0.0.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One label and its value.
type Label = [(&'static str, String); 1];

fn label(name: &'static str, value: &str) -> Label {
    [(name, value.to_owned())]
}

/// An attempt: its job, slot and number.
type AttemptKey = (String, i64, Option<u32>);

/// A gauge of seconds.
type Seconds = Gauge<f64, AtomicU64>;

/// The metrics of one host.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    claims: Family<Label, Counter>,
    takeovers: Counter,
    lost: Counter,
    skips: Counter,
    late: Counter,
    hand_overs: Counter,
    interrupted: Counter,
    runs: Family<Label, Counter>,
    traps: Family<Label, Counter>,
    /// Outbound requests of guests, by outcome.
    outbound: Family<Label, Counter>,
    run_seconds: Histogram,
    heartbeat_seconds: Histogram,
    last_success: Family<Label, Seconds>,
    consecutive_failures: Family<Label, Gauge>,
    last_duration: Family<Label, Seconds>,
    /// When each running attempt started, by job, slot and attempt.
    started: Mutex<HashMap<AttemptKey, Instant>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            claims: Family::default(),
            takeovers: Counter::default(),
            lost: Counter::default(),
            skips: Counter::default(),
            late: Counter::default(),
            hand_overs: Counter::default(),
            interrupted: Counter::default(),
            runs: Family::default(),
            traps: Family::default(),
            outbound: Family::default(),
            run_seconds: Histogram::new(RUN_BUCKETS.iter().copied()),
            heartbeat_seconds: Histogram::new(HEARTBEAT_BUCKETS.iter().copied()),
            last_success: Family::default(),
            consecutive_failures: Family::default(),
            last_duration: Family::default(),
            started: Mutex::new(HashMap::new()),
            registry: Registry::default(),
        };
        registry.register(
            "baton_claims",
            "Claims this host sent, by the store's answer",
            m.claims.clone(),
        );
        let counters = [
            (
                "baton_takeovers",
                "Runs this host took over from a runner that died or handed over",
                &m.takeovers,
            ),
            (
                "baton_lost",
                "Attempts of this host that lost their lease (refused or self-fenced)",
                &m.lost,
            ),
            (
                "baton_skips",
                "Slots this host skipped (overlap, superseded or paused)",
                &m.skips,
            ),
            ("baton_late", "Claims the store called late", &m.late),
            (
                "baton_hand_overs",
                "Attempts this host released on stop",
                &m.hand_overs,
            ),
            (
                "baton_interrupted",
                "Runs this host's claims marked interrupted",
                &m.interrupted,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "baton_runs",
            "Attempts this host finished, by status",
            m.runs.clone(),
        );
        registry.register("baton_guest_traps", "Guest traps, by kind", m.traps.clone());
        registry.register(
            "baton_outbound_requests",
            "Outbound HTTP requests of guests, by outcome (sent, denied, fenced, failed)",
            m.outbound.clone(),
        );
        registry.register(
            "baton_run_duration_seconds",
            "How long finished attempts ran, started to finished",
            m.run_seconds.clone(),
        );
        registry.register(
            "baton_heartbeat_latency_seconds",
            "How long heartbeats took, sent to answered",
            m.heartbeat_seconds.clone(),
        );
        registry.register(
            "baton_job_last_success_timestamp_seconds",
            "When an attempt of the job last finished with success on this host (Unix time)",
            m.last_success.clone(),
        );
        registry.register(
            "baton_job_consecutive_failures",
            "Attempts of the job this host finished as failed since its last success",
            m.consecutive_failures.clone(),
        );
        registry.register(
            "baton_job_last_run_duration_seconds",
            "How long the job's last attempt finished on this host ran",
            m.last_duration.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts an instance event: claims by outcome (`won`, `running` for a backup, `overlap`,
    /// `superseded` or `paused` for a skip, `late`), takeovers, lost attempts, skips, late
    /// claims, hand-overs, interrupted runs, finished runs by status, run durations (started
    /// to success or failed), and the job's own series.
    pub fn observe(&self, event: &Event) {
        let key = (event.job.clone(), event.slot, event.attempt);
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        match event.kind {
            EventKind::Won => {
                self.claims.get_or_create(&label("outcome", "won")).inc();
            }
            EventKind::Backup => {
                self.claims
                    .get_or_create(&label("outcome", "running"))
                    .inc();
            }
            EventKind::Skip => {
                self.skips.inc();
                let outcome = match event.reason.as_str() {
                    "superseded" => "superseded",
                    "paused" => "paused",
                    _ => "overlap",
                };
                self.claims.get_or_create(&label("outcome", outcome)).inc();
            }
            EventKind::Late => {
                self.late.inc();
                self.claims.get_or_create(&label("outcome", "late")).inc();
            }
            EventKind::Takeover => {
                self.takeovers.inc();
            }
            EventKind::Started => {
                started.insert(key, Instant::now());
            }
            EventKind::Success | EventKind::Failed => {
                let success = event.kind == EventKind::Success;
                let status = if success { "success" } else { "failed" };
                self.runs.get_or_create(&label("status", status)).inc();
                let job = label("job", &event.job);
                if let Some(at) = started.remove(&key) {
                    let took = at.elapsed().as_secs_f64();
                    self.run_seconds.observe(took);
                    self.last_duration.get_or_create(&job).set(took);
                }
                let failures = self.consecutive_failures.get_or_create(&job);
                if success {
                    failures.set(0);
                    self.last_success.get_or_create(&job).set(unix_seconds());
                } else {
                    failures.inc();
                }
            }
            EventKind::Lost => {
                self.lost.inc();
                started.remove(&key);
            }
            EventKind::Released => {
                self.hand_overs.inc();
                started.remove(&key);
            }
            EventKind::Interrupted => {
                self.interrupted.inc();
            }
            EventKind::Paused | EventKind::Resumed | EventKind::Triggered => {}
        }
    }

    /// Drops the series of a job that is no longer loaded.
    pub fn forget_job(&self, job: &str) {
        let job = label("job", job);
        self.last_success.remove(&job);
        self.consecutive_failures.remove(&job);
        self.last_duration.remove(&job);
    }

    /// Records how long one heartbeat took, sent to answered.
    pub fn heartbeat_latency(&self, took: Duration) {
        self.heartbeat_seconds.observe(took.as_secs_f64());
    }

    /// Counts a guest trap of a kind (`interrupt`, `memory`, `unreachable`, …).
    pub fn guest_trap(&self, kind: &str) {
        self.traps.get_or_create(&label("kind", kind)).inc();
    }

    /// Counts an outbound request of a guest by outcome: `sent` (a response came), `denied`
    /// (not allowed, or over a limit), `fenced` (refused or cut because the attempt's lease is
    /// lost), `failed` (sent, but no response: refused, timed out, too large). No per-URL label.
    pub fn outbound_request(&self, outcome: &'static str) {
        self.outbound
            .get_or_create(&label("outcome", outcome))
            .inc();
    }

    /// The metrics in the OpenMetrics text format, served as [`CONTENT_TYPE`].
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
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
    fn a_job_has_its_last_success_failures_and_duration_until_it_is_forgotten() {
        let m = Metrics::new();
        for kind in [
            EventKind::Started,
            EventKind::Failed,
            EventKind::Started,
            EventKind::Failed,
        ] {
            m.observe(&event(kind, ""));
        }
        let text = m.render();
        assert!(
            text.contains("baton_job_consecutive_failures{job=\"report\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("baton_job_last_run_duration_seconds{job=\"report\"} "),
            "{text}"
        );
        m.observe(&event(EventKind::Started, ""));
        m.observe(&event(EventKind::Success, ""));
        let text = m.render();
        assert!(
            text.contains("baton_job_consecutive_failures{job=\"report\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("baton_job_last_success_timestamp_seconds{job=\"report\"} 1"),
            "{text}"
        );
        m.forget_job("report");
        assert!(!m.render().contains("job=\"report\""), "{}", m.render());
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
        m.outbound_request("fenced");
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
            "baton_outbound_requests_total{outcome=\"fenced\"} 1",
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
