//! The host's HTTP surface (off unless `--http ADDR` is given), on axum over hyper: the
//! dashboard (`/`, `/jobs/{job}`), the JSON API (`/api/jobs…`), `/metrics` (OpenMetrics, by
//! prometheus-client), `/healthz`, `/readyz` and `/runs`.
//!
//! Reading needs nothing; pause, resume and trigger need the bearer token of `--http-token`
//! (compared in constant time): without a configured token they are refused (403), without a
//! matching one 401. A client has 5 s to send its request head, of at most 8 KiB.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use baton_core::lease::Run;
use baton_core::metrics::Metrics;
use baton_core::operate::{OperateOutcome, Operation, Operator, Request};
use serde::{Deserialize, Serialize};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

mod dashboard;

/// The largest request head the server reads: 8 KiB.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a client has to send its request head: 5 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest request body (a pause's or trigger's JSON): 16 KiB.
const MAX_BODY: usize = 16 * 1024;

/// How many runs `GET /api/jobs/{job}/runs` returns unless `?limit=N` says: 20.
const DEFAULT_RUNS: usize = 20;

/// A job as the API and the dashboard show it.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    /// The job's name.
    pub name: String,
    /// Its cron expression.
    pub schedule: String,
    /// Its time zone.
    pub zone: String,
    /// Its next slot (RFC 3339 UTC), if the schedule has one.
    pub next_slot: Option<String>,
    /// The pause in force, if the job is paused.
    pub paused: Option<Operation>,
    /// Its latest run, if it has one (see [`baton_core::report::run_json`]).
    pub last_run: Option<serde_json::Value>,
    /// The attempts running now.
    pub running: Vec<RunningView>,
}

/// An attempt running now.
#[derive(Clone, Debug, Serialize)]
pub struct RunningView {
    /// The run's slot (RFC 3339 UTC).
    pub slot: String,
    /// Who runs it.
    pub runner: String,
    /// Which attempt it is.
    pub attempt: u32,
    /// How long its lease has left, in ms (0 once it ran out).
    pub lease_remaining_ms: i64,
}

/// What the HTTP surface asks the host.
#[async_trait]
pub trait Status: Send + Sync + 'static {
    /// `Ok` when the store answers and the jobs are loaded; otherwise why not.
    async fn ready(&self) -> Result<(), String>;

    /// The runs that are running now, as a JSON array (see [`baton_core::report::run_json`]).
    async fn runs(&self) -> Result<serde_json::Value, String>;

    /// Every job this host runs, sorted by name.
    async fn jobs(&self) -> Result<Vec<JobView>, String>;

    /// Up to `limit` runs of a job, newest first; `None` for a job this host does not run.
    async fn job_runs(&self, job: &str, limit: usize) -> Result<Option<Vec<Run>>, String>;

    /// Pauses, resumes or triggers a job; `None` for a job this host does not run.
    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: Operator,
    ) -> Result<Option<OperateOutcome>, String>;
}

/// A failure to start the endpoint.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for HTTP on {addr}: {source}; choose another --http address")]
pub struct BindError {
    /// The address asked for.
    pub addr: String,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

#[derive(Clone)]
struct App {
    metrics: Arc<Metrics>,
    status: Arc<dyn Status>,
    token: Option<Arc<str>>,
}

/// Starts serving on `addr`; returns the bound address (a port of 0 picks a free one).
/// `token` is the bearer token that pause, resume and trigger need; `None` refuses them.
pub async fn serve(
    addr: &str,
    metrics: Arc<Metrics>,
    status: Arc<dyn Status>,
    token: Option<String>,
) -> Result<SocketAddr, BindError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| BindError {
        addr: addr.to_owned(),
        source,
    })?;
    let bound = listener.local_addr().map_err(|source| BindError {
        addr: addr.to_owned(),
        source,
    })?;
    let app = App {
        metrics,
        status,
        token: token.map(Into::into),
    };
    let router = routes(app);
    tokio::spawn(async move {
        loop {
            let Ok((socket, peer)) = listener.accept().await else {
                continue;
            };
            let router = router.clone().layer(axum::Extension(ConnectInfo(peer)));
            tokio::spawn(async move {
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(REQUEST_TIMEOUT)
                    .max_buf_size(MAX_REQUEST)
                    .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

fn routes(app: App) -> Router {
    Router::new()
        .route("/", get(dashboard::overview))
        .route("/jobs/{job}", get(dashboard::job_page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/runs", get(running))
        .route("/api/jobs", get(api_jobs))
        .route("/api/jobs/{job}", get(api_job))
        .route("/api/jobs/{job}/runs", get(api_runs))
        .route("/api/jobs/{job}/{action}", post(api_operate))
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found; try /, /api/jobs, /metrics, /healthz, /readyz or /runs\n",
            )
        })
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY))
        .with_state(app)
}

/// An error answer: `{"error": "..."}` with its status.
fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (code, Json(json!({ "error": message.into() }))).into_response()
}

async fn metrics(State(app): State<App>) -> Response {
    (
        [(header::CONTENT_TYPE, baton_core::metrics::CONTENT_TYPE)],
        app.metrics.render(),
    )
        .into_response()
}

async fn readyz(State(app): State<App>) -> Response {
    match app.status.ready().await {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn running(State(app): State<App>) -> Response {
    match app.status.runs().await {
        Ok(runs) => Json(runs).into_response(),
        Err(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn api_jobs(State(app): State<App>) -> Response {
    match app.status.jobs().await {
        Ok(jobs) => Json(jobs).into_response(),
        Err(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

fn unknown(job: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("this host runs no job {job:?}; GET /api/jobs lists its jobs"),
    )
}

async fn api_job(State(app): State<App>, Path(job): Path<String>) -> Response {
    match app.status.jobs().await {
        Ok(jobs) => match jobs.into_iter().find(|j| j.name == job) {
            Some(view) => Json(view).into_response(),
            None => unknown(&job),
        },
        Err(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// `?limit=N` of the runs listing.
#[derive(Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn api_runs(
    State(app): State<App>,
    Path(job): Path<String>,
    Query(limit): Query<Limit>,
) -> Response {
    let limit = limit.limit.unwrap_or(DEFAULT_RUNS);
    match app.status.job_runs(&job, limit).await {
        Ok(Some(runs)) => Json(
            runs.iter()
                .map(baton_core::report::run_json)
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Ok(None) => unknown(&job),
        Err(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// The optional JSON body of pause, resume and trigger.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperateBody {
    /// Why; recorded with the operation.
    reason: Option<String>,
    /// Who asks. Defaults to `api`.
    user: Option<String>,
    /// For a pause: tell running attempts to stop. Defaults to false.
    #[serde(default)]
    stop: bool,
}

/// Checks the bearer token: the refusal, 403 when none is configured, 401 when the request's
/// does not match; `None` when it matches.
fn refusal(app: &App, headers: &HeaderMap) -> Option<Response> {
    let Some(expected) = &app.token else {
        return Some(error(
            StatusCode::FORBIDDEN,
            "pause, resume and trigger are off: start baton run with --http-token or BATON_HTTP_TOKEN",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        None
    } else {
        Some(error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong token: send Authorization: Bearer TOKEN (the --http-token of baton run)",
        ))
    }
}

async fn api_operate(
    State(app): State<App>,
    Path((job, action)): Path<(String, String)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = refusal(&app, &headers) {
        return refused;
    }
    let body: OperateBody = if body.is_empty() {
        OperateBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(body) => body,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the body is JSON with reason, user and stop (all optional): {e}"),
                )
            }
        }
    };
    let request = match action.as_str() {
        "pause" => Request::Pause { stop: body.stop },
        "resume" => Request::Resume,
        "trigger" => Request::Trigger,
        other => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no action {other:?}: POST /api/jobs/{job}/pause, resume or trigger"),
            )
        }
    };
    let by = Operator {
        host: peer.ip().to_string(),
        user: body.user.unwrap_or_else(|| "api".to_owned()),
        reason: body.reason.filter(|r| !r.is_empty()),
    };
    match app.status.operate(&job, request, by).await {
        Ok(Some(OperateOutcome::Done(op))) => Json(op).into_response(),
        Ok(Some(OperateOutcome::Paused(pause))) => (
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("job {job:?} is paused; resume it first"),
                "paused": pause,
            })),
        )
            .into_response(),
        Ok(None) => unknown(&job),
        Err(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

#[cfg(test)]
mod tests;
