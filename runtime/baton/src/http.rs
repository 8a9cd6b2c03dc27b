//! The host's HTTP endpoint (off unless `--http ADDR` is given): `/metrics` in the Prometheus
//! text format, `/healthz` (the process is alive), `/readyz` (the store answers and the jobs are
//! loaded) and `/runs` (the runs that are running now, as JSON).
//!
//! A deliberately small HTTP/1.1 server: `GET` only, one request per connection, requests of at
//! most 8 KiB.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use baton_core::metrics::Metrics;

/// The largest request head the server reads: 8 KiB.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a client has to send its request: 5 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What the endpoint asks the host.
#[async_trait]
pub trait Status: Send + Sync + 'static {
    /// `Ok` when the store answers and the jobs are loaded; otherwise why not.
    async fn ready(&self) -> Result<(), String>;

    /// The runs that are running now, as a JSON array (see [`baton_core::report::run_json`]).
    async fn runs(&self) -> Result<serde_json::Value, String>;
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

/// Starts serving on `addr`; returns the bound address (a port of 0 picks a free one).
pub async fn serve(
    addr: &str,
    metrics: Arc<Metrics>,
    status: Arc<dyn Status>,
) -> Result<SocketAddr, BindError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| BindError {
        addr: addr.to_owned(),
        source,
    })?;
    let bound = listener.local_addr().map_err(|source| BindError {
        addr: addr.to_owned(),
        source,
    })?;
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            let status = status.clone();
            tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(REQUEST_TIMEOUT, answer(socket, &metrics, &*status)).await;
            });
        }
    });
    Ok(bound)
}

async fn answer(mut socket: TcpStream, metrics: &Metrics, status: &dyn Status) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > MAX_REQUEST {
            let _ = respond(&mut socket, 431, "text/plain", "request too large\n").await;
            return;
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut parts = head.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or(target);
    let (code, kind, body) = match (method, path) {
        ("GET", "/metrics") => (200, baton_core::metrics::CONTENT_TYPE, metrics.render()),
        ("GET", "/healthz") => (200, "text/plain", "ok\n".to_owned()),
        ("GET", "/readyz") => match status.ready().await {
            Ok(()) => (200, "text/plain", "ready\n".to_owned()),
            Err(why) => (503, "text/plain", format!("not ready: {why}\n")),
        },
        ("GET", "/runs") => match status.runs().await {
            Ok(runs) => (200, "application/json", format!("{runs}\n")),
            Err(why) => (
                503,
                "application/json",
                format!("{}\n", serde_json::json!({ "error": why })),
            ),
        },
        ("GET", _) => (
            404,
            "text/plain",
            "not found; try /metrics, /healthz, /readyz or /runs\n".to_owned(),
        ),
        _ => (405, "text/plain", "only GET is served\n".to_owned()),
    };
    let _ = respond(&mut socket, code, kind, &body).await;
}

async fn respond(socket: &mut TcpStream, code: u16, kind: &str, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await?;
    socket.write_all(body.as_bytes()).await?;
    socket.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        ready: bool,
    }

    #[async_trait]
    impl Status for Fake {
        async fn ready(&self) -> Result<(), String> {
            if self.ready {
                Ok(())
            } else {
                Err("store 127.0.0.1:6379 does not answer".into())
            }
        }
        async fn runs(&self) -> Result<serde_json::Value, String> {
            Ok(serde_json::json!([{"job": "report"}]))
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn endpoints_answer_with_their_status_codes() {
        let metrics = Arc::new(Metrics::new());
        metrics.guest_trap("interrupt");
        let addr = serve(
            "127.0.0.1:0",
            metrics.clone(),
            Arc::new(Fake { ready: false }),
        )
        .await
        .expect("serve");
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
        assert!(
            m.contains("baton_guest_traps_total{kind=\"interrupt\"} 1"),
            "{m}"
        );
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(
            r.ends_with("not ready: store 127.0.0.1:6379 does not answer\n"),
            "{r}"
        );
        let runs = get(addr, "/runs").await;
        assert!(runs.ends_with("[{\"job\":\"report\"}]\n"), "{runs}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    }

    #[tokio::test]
    async fn a_taken_address_names_itself_and_the_fix() {
        let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = taken.local_addr().expect("addr").to_string();
        let err = serve(
            &addr,
            Arc::new(Metrics::new()),
            Arc::new(Fake { ready: true }),
        )
        .await
        .expect_err("taken");
        assert!(err
            .to_string()
            .starts_with(&format!("cannot listen for HTTP on {addr}")));
        assert!(err.to_string().ends_with("choose another --http address"));
    }
}
