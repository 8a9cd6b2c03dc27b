//! An example job that calls the outside world: it POSTs the run's info as JSON to the URL of
//! `config.url`, with `Authorization: Bearer <config.token>` when the job file gives a token
//! (a secret, e.g. `token = { env = "WEBHOOK_TOKEN" }`). The host adds the fence headers and
//! the idempotency key; the receiver can use them to refuse a stale or repeated call.
//!
//! ```toml
//! schedule = "@hourly"
//! [grants]
//! allowed_outbound_hosts = ["https://hooks.example.com"]
//! [config]
//! url = "https://hooks.example.com/baton"
//! token = { env = "WEBHOOK_TOKEN" }
//! ```

baton_guest::job!(|info| {
    let url = baton_guest::config::require("url")?;
    let body = format!(
        "{{\"job\":\"{}\",\"slot\":{},\"attempt\":{},\"fence\":{}}}",
        info.job, info.slot, info.attempt, info.fence
    );
    let token = baton_guest::config::get("token")?;
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer.as_str()));
    }
    let response = baton_guest::http::request("POST", &url, &headers, body.as_bytes())?;
    if !(200..300).contains(&response.status) {
        return Err(format!("the webhook answered {}", response.status));
    }
    baton_guest::log::info!("posted to the webhook: {}", response.status);
    Ok(())
});
