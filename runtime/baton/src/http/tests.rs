use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    async fn jobs(&self) -> Result<Vec<JobView>, String> {
        Ok(vec![JobView {
            name: "report".into(),
            schedule: "*/10 * * * * *".into(),
            zone: "UTC".into(),
            next_slot: None,
            paused: None,
            last_run: None,
            running: Vec::new(),
        }])
    }
    async fn job_runs(&self, job: &str, _: usize) -> Result<Option<Vec<Run>>, String> {
        Ok((job == "report").then(Vec::new))
    }
    async fn operate(
        &self,
        job: &str,
        request: Request,
        by: Operator,
    ) -> Result<Option<OperateOutcome>, String> {
        Ok((job == "report")
            .then(|| OperateOutcome::Done(Operation::new(job, request, &by, 1_000))))
    }
}

async fn send(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

async fn get(addr: SocketAddr, path: &str) -> String {
    send(
        addr,
        &format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await
}

async fn post(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    send(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\n{auth}content-length: 0\r\nconnection: close\r\n\r\n"
        ),
    )
    .await
}

async fn start(token: Option<&str>) -> SocketAddr {
    let metrics = Arc::new(Metrics::new());
    metrics.guest_trap("interrupt");
    serve(
        "127.0.0.1:0",
        metrics,
        Arc::new(Fake { ready: false }),
        token.map(str::to_owned),
    )
    .await
    .expect("serve")
}

#[tokio::test]
async fn endpoints_answer_with_their_status_codes() {
    let addr = start(None).await;
    let m = get(addr, "/metrics").await;
    assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
    assert!(
        m.contains("application/openmetrics-text; version=1.0.0"),
        "{m}"
    );
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
    assert!(runs.ends_with("[{\"job\":\"report\"}]"), "{runs}");
    assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    assert!(get(addr, "/api/jobs/nope")
        .await
        .starts_with("HTTP/1.1 404"));
    let page = get(addr, "/").await;
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains("report"),
        "{page}"
    );
}

#[tokio::test]
async fn mutating_calls_need_a_configured_token_and_the_matching_one() {
    let off = start(None).await;
    let r = post(off, "/api/jobs/report/pause", Some("anything")).await;
    assert!(r.starts_with("HTTP/1.1 403"), "{r}");
    let on = start(Some("s3cret")).await;
    for token in [None, Some("wrong"), Some("s3cre")] {
        let r = post(on, "/api/jobs/report/trigger", token).await;
        assert!(r.starts_with("HTTP/1.1 401"), "{token:?}: {r}");
    }
    let r = post(on, "/api/jobs/report/trigger", Some("s3cret")).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\"action\":\"triggered\""), "{r}");
    assert!(r.contains("\"host\":\"127.0.0.1\""), "{r}");
}

#[tokio::test]
async fn a_request_head_over_8_kib_is_refused() {
    let addr = start(None).await;
    let big = "x".repeat(MAX_REQUEST * 2);
    let r = send(
        addr,
        &format!("GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n"),
    )
    .await;
    assert!(!r.starts_with("HTTP/1.1 200"), "{r}");
}

#[tokio::test]
async fn a_taken_address_names_itself_and_the_fix() {
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let err = serve(
        &addr,
        Arc::new(Metrics::new()),
        Arc::new(Fake { ready: true }),
        None,
    )
    .await
    .expect_err("taken");
    assert!(err
        .to_string()
        .starts_with(&format!("cannot listen for HTTP on {addr}")));
    assert!(err.to_string().ends_with("choose another --http address"));
}
