//! The dashboard in a real headless Chromium (Debian's `chromium` and `chromium-driver`): it
//! lists the jobs, its run-now button starts a run that shows up, and its pause button shows
//! the job paused. With `BATON_SCREENSHOTS=DIR` it saves the overview and a job page there
//! (`docs/` holds the ones in the README).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use super::{add_job, http_address, node, Cluster};

/// `chromedriver` on a free port, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver() -> Driver {
    let port = baton_tests::servers::free_port(false);
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start chromedriver ({e}): install Debian's chromium and chromium-driver \
                 (`apt-get install chromium chromium-driver`; tests/run.sh does)"
            )
        });
    baton_tests::servers::wait_for_port(port, "chromedriver");
    Driver { child, port }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = Capabilities::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                        "--window-size=1280,800"]}),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session (is Debian's chromium installed?)")
}

/// Waits until the element's text satisfies `pred`, reloading as the page does.
async fn wait_text(c: &Client, css: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await {
            if let Ok(text) = e.text().await {
                if pred(&text) {
                    return text;
                }
            }
        }
        assert!(Instant::now() < until, "{what}: {css} never matched");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Answers the token prompt (first time only) and the reason prompt.
async fn answer_prompts(c: &Client, answers: &[&str]) {
    for answer in answers {
        let until = Instant::now() + Duration::from_secs(5);
        while c.get_alert_text().await.is_err() {
            assert!(Instant::now() < until, "no prompt for {answer:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.send_alert_text(answer)
            .await
            .expect("type into the prompt");
        c.accept_alert().await.expect("accept the prompt");
    }
}

async fn save(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    if let Some(dir) = std::env::var_os("BATON_SCREENSHOTS") {
        std::fs::write(std::path::Path::new(&dir).join(name), png).expect("write the screenshot");
    }
}

#[test]
fn dashboard_lists_jobs_runs_now_and_pauses_from_its_buttons() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Cluster::new(format!(
        "sqlite://{}",
        dir.path().join("baton.db").display()
    ));
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("mkdir jobs");
    add_job(&jobs, "every-ten-seconds", "*/10 * * * * *");
    add_job(&jobs, "report", "0 6 * * *");
    let mut n = node(&jobs, &c.url, &c.ns, "node-a", Some("s3cret"));
    let base = format!("http://{}", http_address(&mut n));
    let driver = start_driver();
    c.rt.block_on(async {
        let b = browser(&driver).await;
        b.goto(&format!("{base}/"))
            .await
            .expect("open the dashboard");
        let rows = b.find_all(Locator::Css("tr.job")).await.expect("job rows");
        assert_eq!(rows.len(), 2, "both jobs are listed");
        wait_text(&b, "tr[data-job='report']", "the report row", |t| {
            t.contains("0 6 * * *") && t.contains("none yet")
        })
        .await;

        // Run now: asks for the token and a reason; the run shows up as the last run, manual.
        b.find(Locator::Css("tr[data-job='report'] button.trigger"))
            .await
            .expect("the run-now button")
            .click()
            .await
            .expect("click run now");
        answer_prompts(&b, &["s3cret", "from the browser"]).await;
        wait_text(&b, "tr[data-job='report']", "the manual run", |t| {
            t.contains("success") && t.contains("manual")
        })
        .await;

        // Pause: the token is remembered; the row shows the pause and a resume button.
        b.find(Locator::Css("tr[data-job='report'] button.pause"))
            .await
            .expect("the pause button")
            .click()
            .await
            .expect("click pause");
        answer_prompts(&b, &["maintenance"]).await;
        let state = wait_text(&b, "tr[data-job='report'] td.state", "the pause", |t| {
            t.contains("paused")
        })
        .await;
        assert!(
            state.contains("dashboard@127.0.0.1: maintenance"),
            "{state}"
        );
        b.find(Locator::Css("tr[data-job='report'] button.resume"))
            .await
            .expect("a resume button once paused");
        wait_text(
            &b,
            "tr[data-job='every-ten-seconds']",
            "a scheduled run",
            |t| t.contains("success"),
        )
        .await;
        save(&b, "dashboard-overview.png").await;

        b.goto(&format!("{base}/jobs/report"))
            .await
            .expect("open the job page");
        wait_text(&b, "#runs tr.run", "the run in the history", |t| {
            t.contains("manual") && t.contains("success")
        })
        .await;
        b.find(Locator::Css("#runs .bar.success"))
            .await
            .expect("the attempt on the timeline");
        save(&b, "dashboard-job.png").await;
        b.close().await.expect("close the browser");
    });
    let runs = c.history("report");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        runs[0].attempts[0].reason,
        baton_core::lease::ClaimKind::Manual
    );
}
