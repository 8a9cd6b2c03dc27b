//! Outbound HTTP through `wasi:http/outgoing-handler`: one blocking call per request.
//!
//! The host allows only the hosts of the job file's `[grants] allowed_outbound_hosts`, limits
//! the requests, and sets the fence headers itself (`baton-job`, `baton-slot`,
//! `baton-attempt`, `baton-fence`, `Idempotency-Key`); any of those the job sets is replaced.
//!
//! ```ignore
//! let response = baton_guest::http::post("https://hooks.example.com/x", "application/json", b"{}")?;
//! if response.status >= 300 { return Err(format!("status {}", response.status)); }
//! ```

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

/// A response: its status, headers and whole body.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// A `GET` of `url`.
pub fn get(url: &str) -> Result<Response, String> {
    request("GET", url, &[], &[])
}

/// A `POST` of `body` to `url`, with its content type.
pub fn post(url: &str, content_type: &str, body: &[u8]) -> Result<Response, String> {
    request("POST", url, &[("content-type", content_type)], body)
}

/// `scheme://host[:port]` and the path of a URL.
fn split(url: &str) -> Result<(Scheme, &str, &str), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} is not a URL (no scheme)"))?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_owned()),
    };
    let cut = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(cut);
    Ok((scheme, authority, if path.is_empty() { "/" } else { path }))
}

/// Why a request failed, in words. `http-request-denied` is the host's refusal.
fn explain(url: &str, e: ErrorCode) -> String {
    let origin = url.split(['/', '?']).take(3).collect::<Vec<_>>().join("/");
    match e {
        ErrorCode::HttpRequestDenied => format!(
            "request to {origin} refused by the host (http-request-denied): its host is not in [grants] allowed_outbound_hosts of the job file, the attempt used up limits.http_requests, or its lease is lost; the host's log line for the attempt says which"
        ),
        ErrorCode::HttpResponseBodySize(limit) => format!(
            "request to {origin}: the response body is over limits.http_response_size{}",
            limit.map(|n| format!(" ({n} bytes)")).unwrap_or_default()
        ),
        ErrorCode::ConnectionTimeout => format!("request to {origin}: connecting timed out (limits.http_connect_timeout)"),
        ErrorCode::ConnectionReadTimeout | ErrorCode::HttpResponseTimeout => format!(
            "request to {origin}: the response timed out (limits.http_first_byte_timeout, limits.http_between_bytes_timeout)"
        ),
        other => format!("request to {origin} failed: {other:?}"),
    }
}

/// Sends one request and reads the whole response. `headers` are sent as given, except the
/// host's own (see the module).
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, String> {
    let (scheme, authority, path) = split(url)?;
    let fields = Fields::new();
    for (name, value) in headers {
        fields
            .append(name, value.as_bytes())
            .map_err(|e| format!("header {name}: {e:?}"))?;
    }
    let request = OutgoingRequest::new(fields);
    let method = match method {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_owned()),
    };
    let invalid = |what: &str| format!("{url:?}: invalid {what}");
    request.set_method(&method).map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("host"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;
    let outgoing = request
        .body()
        .map_err(|()| "the request body was taken twice".to_owned())?;
    let pending = outgoing_handler::handle(request, None).map_err(|e| explain(url, e))?;
    {
        let stream = outgoing
            .write()
            .map_err(|()| "the request body's stream was taken twice".to_owned())?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("request to {url}: sending the body failed: {e:?}"))?;
        }
    }
    OutgoingBody::finish(outgoing, None).map_err(|e| explain(url, e))?;
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return Err(explain(url, e)),
        Some(Err(())) | None => return Err(format!("request to {url}: no response")),
    };
    let status = response.status();
    let headers = response.headers().entries();
    let incoming = response
        .consume()
        .map_err(|()| "the response body was taken twice".to_owned())?;
    let mut body = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| "the response body's stream was taken twice".to_owned())?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(bytes) => body.extend_from_slice(&bytes),
                Err(wasip2::io::streams::StreamError::Closed) => break,
                Err(wasip2::io::streams::StreamError::LastOperationFailed(e)) => {
                    let code = wasip2::http::types::http_error_code(&e);
                    return Err(match code {
                        Some(code) => explain(url, code),
                        None => format!("request to {url}: reading the body failed: {}", e.to_debug_string()),
                    });
                }
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}
