//! One full `baton bench` run on one store: every section in order, and the report as JSON or
//! as the Markdown tables `docs/BENCHMARKS.md` holds.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::{failover, round_trips, store_ops, wasm, BenchError, Machine, Stats};
use baton_core::instance::InstanceConfig;
use baton_core::store;

/// What a full run measures, and how much.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The store's URL.
    pub store_url: String,
    /// The store operations' settings.
    pub store_ops: store_ops::Settings,
    /// The round-trip count's settings.
    pub round_trips: round_trips::Settings,
    /// The failover settings.
    pub failover: failover::Settings,
    /// The directory of `empty.wasm` and `busy-loop.wasm`; without it (or when they are
    /// missing) the Wasm section is skipped with a note.
    pub components: Option<PathBuf>,
    /// Runs of each side of the per-run overhead. Defaults to 300.
    pub wasm_runs: usize,
    /// Zombie stops. Defaults to 50.
    pub zombie_stops: usize,
}

/// A full run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The Baton version measured.
    pub baton_version: &'static str,
    /// The store, password removed.
    pub store: String,
    /// The backend: `sqlite`, `redis` (Redis or Valkey) or `postgres`.
    pub backend: &'static str,
    /// The namespace the run used (and left empty).
    pub namespace: String,
    /// The machine before the run.
    pub machine_before: Machine,
    /// The machine after the run.
    pub machine_after: Machine,
    /// How long the run took, s.
    pub duration_s: f64,
    /// Claim, heartbeat, state write and finish against the raw primitive, per number of
    /// clients.
    pub store_ops: Vec<store_ops::ClientsRow>,
    /// Store round trips per successful run.
    pub round_trips: round_trips::RoundTrips,
    /// The Wasm figures, when the components were there.
    pub wasm: Option<wasm::WasmFigures>,
    /// Takeover and hand-over.
    pub failover: failover::Failover,
    /// What was skipped, and why.
    pub notes: Vec<String>,
}

/// Runs every section against the store of `settings`, in a namespace of its own that is left
/// empty at the end.
pub async fn run(settings: &Settings) -> Result<Report, BenchError> {
    let began = Instant::now();
    let machine_before = Machine::now();
    let namespace = super::unique_name("bench");
    let store = store::open(&settings.store_url, &namespace).await?;
    let mut notes = Vec::new();
    let store_ops = store_ops::measure(store.clone(), &settings.store_ops).await?;
    let config = InstanceConfig {
        store_url: settings.store_url.clone(),
        namespace: namespace.clone(),
        runner: "bench".into(),
    };
    let round_trips = round_trips::measure(config.clone(), &*store, &settings.round_trips).await?;
    let failover = failover::measure(&config, &*store, &settings.failover).await?;
    let wasm = match &settings.components {
        None => {
            notes.push(
                "wasm: skipped, no --components DIR (build it with bench/build-components.sh)"
                    .to_owned(),
            );
            None
        }
        Some(dir) => match wasm::check_components(dir) {
            Err(reason) => {
                notes.push(format!("wasm: skipped, {reason}"));
                None
            }
            Ok(()) => Some(
                wasm::measure(&wasm::Settings {
                    components: dir.clone(),
                    runs: settings.wasm_runs,
                    stops: settings.zombie_stops,
                })
                .await?,
            ),
        },
    };
    Ok(Report {
        baton_version: env!("CARGO_PKG_VERSION"),
        store: store::redact(&settings.store_url),
        backend: store.backend(),
        namespace,
        machine_before,
        machine_after: Machine::now(),
        duration_s: began.elapsed().as_secs_f64(),
        store_ops,
        round_trips,
        wasm,
        failover,
        notes,
    })
}

fn us(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1} ms", x / 1000.0)
    } else if x >= 1000.0 {
        format!("{:.2} ms", x / 1000.0)
    } else {
        format!("{x:.0} µs")
    }
}

fn ms(x: f64) -> String {
    format!("{:.0} ms", x / 1000.0)
}

fn load(m: &Machine) -> String {
    let l: Vec<String> = m.load_average.iter().map(|x| format!("{x:.2}")).collect();
    format!("{} (1, 5, 15 min) on {} CPUs", l.join(" "), m.cpus)
}

fn median_p99(s: &Stats, unit: fn(f64) -> String) -> String {
    format!("{} / {}", unit(s.median_us), unit(s.p99_us))
}

impl Report {
    /// The report as Markdown: one table a section, each figure with what it is.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### {} (`{}`), Baton {}\n\nLoad before: {}; after: {}. Took {:.0} s.\n",
            self.backend,
            self.store,
            self.baton_version,
            load(&self.machine_before),
            load(&self.machine_after),
            self.duration_s
        );
        let _ = writeln!(
            out,
            "Store operations, latency median / p99, throughput of all clients together, and \
             median over the raw primitive's median (same run, same connections):\n"
        );
        let _ = writeln!(
            out,
            "| clients | operation | latency median / p99 | ops/s | round trips/op | × raw (median) |"
        );
        let _ = writeln!(out, "| ---: | --- | ---: | ---: | ---: | ---: |");
        for row in &self.store_ops {
            let ops = [
                ("raw primitive", &row.raw_primitive, 1.0),
                ("claim (won)", &row.claim_won, row.ratios.claim_won),
                (
                    "claim (running)",
                    &row.claim_running,
                    row.ratios.claim_running,
                ),
                ("heartbeat", &row.heartbeat, row.ratios.heartbeat),
                ("state write", &row.state_write, row.ratios.state_write),
                ("finish", &row.finish, row.ratios.finish),
            ];
            for (name, f, r) in ops {
                let _ = writeln!(
                    out,
                    "| {} | {name} | {} | {:.0} | {:.2} | {r:.2} |",
                    row.clients,
                    median_p99(&f.latency, us),
                    f.throughput_per_s,
                    f.round_trips_per_op
                );
            }
        }
        let rt = &self.round_trips;
        let _ = writeln!(
            out,
            "\nRound trips per successful run ({} runs of a real instance, lease 600 ms, \
             heartbeat 100 ms, 350 ms of work): {} claims, {} heartbeats, {} finishes, {} other; \
             the backend sent {} requests: {:.2} a run = 2 + {:.2} heartbeats. Exactly one claim \
             and one finish a run plus one a heartbeat: **{}**. The first run (with the \
             instance's start) sent {} requests.\n",
            rt.runs,
            rt.counted.claims,
            rt.counted.heartbeats,
            rt.counted.finishes,
            rt.counted.other,
            rt.counted.round_trips,
            rt.per_run,
            rt.heartbeats_per_run,
            if rt.exact { "yes" } else { "no" },
            rt.warm_up.round_trips
        );
        if let Some(w) = &self.wasm {
            let _ = writeln!(
                out,
                "| per run | median / p99 | runs |\n| --- | ---: | ---: |\n\
                 | Wasm: fresh store + instantiate + call of `empty` | {} | {} |\n\
                 | native: spawn and wait for `/bin/true` | {} | {} |\n\n\
                 A Wasm run costs 1/{:.0} of a native process start.\n",
                median_p99(&w.overhead.wasm, us),
                w.overhead.wasm.count,
                median_p99(&w.overhead.native, us),
                w.overhead.native.count,
                w.overhead.native_over_wasm
            );
            let z = &w.zombie_stop.latency;
            let _ = writeln!(
                out,
                "Zombie stop (abort to guest stopped, `busy-loop` ignores the signal, {} stops): \
                 median {}, p99 {}, max {}.\n",
                z.count,
                us(z.median_us),
                us(z.p99_us),
                us(z.max_us)
            );
        }
        let f = &self.failover;
        let _ = writeln!(
            out,
            "| failover (lease {} ms, heartbeat {} ms) | median | p99 | max | bound | within |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |",
            f.lease_ms, f.heartbeat_ms
        );
        for (name, r) in [
            ("takeover: last heartbeat → backup's claim", &f.takeover),
            ("hand-over: release → backup's claim", &f.hand_over),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} ms | {}/{} |",
                ms(r.latency.median_us),
                ms(r.latency.p99_us),
                ms(r.latency.max_us),
                r.bound_ms,
                r.within_bound,
                r.latency.count
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "\nNote: {note}");
        }
        out
    }
}

/// The scale run's report as Markdown.
pub fn scale_markdown(r: &super::scale::ScaleReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Scale: {} hosts × {} jobs every second, {} s, on `{}`\n\nLoad before: {}; after: {}.\n",
        r.hosts,
        r.jobs,
        r.seconds,
        r.store,
        load(&r.machine_before),
        load(&r.machine_after)
    );
    let _ = writeln!(
        out,
        "Slots due {}, run {} (**{:.2} %**), duplicate runs **{}**.\n",
        r.due, r.run, r.run_percent, r.duplicates
    );
    let _ = writeln!(
        out,
        "| host | executions | CPU s | CPU % of a core | peak RSS | store requests/s | events |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for h in &r.per_host {
        let events: Vec<String> = h.events.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.0} | {:.0} MiB | {:.0} | {} |",
            h.host,
            h.executions,
            h.cpu_s,
            h.cpu_percent_of_one_core,
            h.peak_rss_mib,
            h.round_trips_per_s,
            events.join(", ")
        );
    }
    out
}
