//! The dashboard: plain server-rendered HTML (maud) with a little JavaScript of our own for
//! the pause, resume and run-now buttons (they ask for the token once per tab) and to refresh
//! the page every 5 s.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use baton_core::lease::Run;
use baton_core::schedule::format_utc;
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::{App, JobView, DEFAULT_RUNS};

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #ddd;vertical-align:top}
th{background:#f4f4f4}
.paused{color:#a60;font-weight:bold}.success{color:#070}.failed,.interrupted{color:#b00}
.running{color:#06c}
button{margin-right:.3em}
.timeline{position:relative;height:1.2em;background:#f4f4f4;min-width:20em}
.bar{position:absolute;top:0;height:1.2em;opacity:.85;font-size:.75em;color:#fff;overflow:hidden}
.bar.success{background:#2a2}.bar.failed{background:#c33}.bar.died{background:#888}
.bar.handed-over{background:#c80}.bar.running{background:#36c}
#message{color:#b00}";

/// Asks for the token once per tab, sends the action, and shows the answer; refreshes the
/// page every 5 s while no action is under way.
const SCRIPT: &str = r#"
let busy = false;
async function act(job, action) {
  busy = true;
  let token = sessionStorage.getItem('batonToken');
  if (!token) {
    token = prompt('Token for pause, resume and run now (--http-token):');
    if (!token) { busy = false; return; }
    sessionStorage.setItem('batonToken', token);
  }
  const reason = action === 'resume' ? '' : (prompt('Why? (optional)') || '');
  const response = await fetch('/api/jobs/' + encodeURIComponent(job) + '/' + action, {
    method: 'POST',
    headers: {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'},
    body: JSON.stringify({reason: reason, user: 'dashboard'}),
  });
  if (response.status === 401) { sessionStorage.removeItem('batonToken'); }
  if (!response.ok) {
    const body = await response.json().catch(() => ({error: response.statusText}));
    document.getElementById('message').textContent = action + ' ' + job + ': ' + body.error;
    busy = false;
    return;
  }
  location.reload();
}
setInterval(() => { if (!busy) location.reload(); }, 5000);
"#;

fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · Baton" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                (body)
                p id="message" {}
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

fn buttons(job: &JobView) -> Markup {
    let name = serde_json::to_string(&job.name).unwrap_or_default();
    html! {
        @if job.paused.is_some() {
            button class="resume" onclick=(format!("act({name},'resume')")) { "Resume" }
        } @else {
            button class="pause" onclick=(format!("act({name},'pause')")) { "Pause" }
            button class="trigger" onclick=(format!("act({name},'trigger')")) { "Run now" }
        }
    }
}

fn paused(job: &JobView) -> Markup {
    html! {
        @if let Some(p) = &job.paused {
            span class="paused" { "paused" }
            " since " (format_utc(p.at)) " by " (p.user) "@" (p.host)
            @if let Some(reason) = &p.reason { ": " (reason) }
        } @else { "active" }
    }
}

/// `GET /`: every job, its schedule, next slot, last outcome, running attempt and pause.
pub(super) async fn overview(State(app): State<App>) -> Response {
    let jobs = match app.status.jobs().await {
        Ok(jobs) => jobs,
        Err(why) => return (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    };
    Html(
        page(
            "Jobs",
            html! {
                h1 { "Baton: " (jobs.len()) " jobs" }
                table id="jobs" {
                    tr { th { "job" } th { "schedule" } th { "next slot" } th { "last run" }
                         th { "running" } th { "state" } th { "" } }
                    @for job in &jobs {
                        tr class="job" data-job=(job.name) {
                            td { a href=(format!("/jobs/{}", job.name)) { (job.name) } }
                            td { code { (job.schedule) } " in " (job.zone) }
                            td { (job.next_slot.as_deref().unwrap_or("none")) }
                            td {
                                @if let Some(run) = &job.last_run {
                                    @let status = run["status"].as_str().unwrap_or("");
                                    span class=(status) { (status) } " "
                                    (run["slot"].as_str().unwrap_or(""))
                                    " (" (run["attempts"][0]["reason"].as_str().unwrap_or("")) ")"
                                } @else { "none yet" }
                            }
                            td {
                                @for r in &job.running {
                                    div { (r.runner) ", attempt " (r.attempt) ", lease "
                                          (r.lease_remaining_ms / 1000) " s left" }
                                }
                            }
                            td class="state" { (paused(job)) }
                            td { (buttons(job)) }
                        }
                    }
                }
            },
        )
        .into_string(),
    )
    .into_response()
}

/// One run's attempts as bars over its time span.
fn timeline(run: &Run) -> Markup {
    let start = run
        .attempts
        .first()
        .map(|a| a.started_at)
        .unwrap_or(run.slot);
    let end = run
        .attempts
        .iter()
        .map(|a| a.ended_at.unwrap_or(run.lease_end))
        .max()
        .unwrap_or(start)
        .max(start + 1);
    let span = (end - start) as f64;
    html! {
        div class="timeline" {
            @for a in &run.attempts {
                @let from = (a.started_at - start) as f64 / span * 100.0;
                @let to = (a.ended_at.unwrap_or(run.lease_end) - start) as f64 / span * 100.0;
                @let outcome = a.outcome.map(|o| o.as_str()).unwrap_or("running");
                div class=(format!("bar {outcome}"))
                    style=(format!("left:{from:.1}%;width:{:.1}%", (to - from).max(1.0)))
                    title=(format!("attempt {} by {} ({}): {outcome}", a.attempt, a.runner, a.reason)) {
                    (a.attempt) " " (a.runner)
                }
            }
        }
    }
}

/// `GET /jobs/{job}`: the job, its recent runs, and each run's attempts as a timeline.
pub(super) async fn job_page(State(app): State<App>, Path(name): Path<String>) -> Response {
    let (jobs, runs) = match (
        app.status.jobs().await,
        app.status.job_runs(&name, DEFAULT_RUNS).await,
    ) {
        (Ok(jobs), Ok(runs)) => (jobs, runs),
        (Err(why), _) | (_, Err(why)) => {
            return (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
        }
    };
    let (Some(job), Some(runs)) = (jobs.into_iter().find(|j| j.name == name), runs) else {
        return (
            StatusCode::NOT_FOUND,
            format!("this host runs no job {name:?}"),
        )
            .into_response();
    };
    Html(page(&job.name, html! {
        p { a href="/" { "← all jobs" } }
        h1 { (job.name) }
        p { code { (job.schedule) } " in " (job.zone) "; next slot "
            (job.next_slot.as_deref().unwrap_or("none")) }
        p class="state" { (paused(&job)) " " (buttons(&job)) }
        table id="runs" {
            tr { th { "slot" } th { "status" } th { "reason" } th { "attempts" } th { "timeline" } }
            @for run in &runs {
                tr class="run" {
                    td { (format_utc(run.slot)) }
                    td class=(run.status.as_str()) { (run.status.as_str()) }
                    td { (run.attempts.first().map(|a| a.reason.as_str()).unwrap_or("")) }
                    td { (run.attempts.len()) }
                    td { (timeline(run)) }
                }
            }
        }
    }).into_string())
    .into_response()
}
