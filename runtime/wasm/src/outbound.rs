//! Outbound HTTP (`wasi:http/outgoing-handler`, wasmtime's own implementation): default deny,
//! a per-job allow list, limits, and the fence headers, all applied by the host inside the call.
//!
//! Every request a guest sends passes [`Hooks::send_request`], synchronously inside
//! `outgoing-handler.handle`, before any DNS lookup or connection:
//!
//! 1. the [fence gate](crate::fence::Gate): a request of an attempt whose lease is lost is
//!    refused (`fenced`), and so is one whose attempt is lost before the request starts;
//! 2. the allow list (`[grants] allowed_outbound_hosts`): any other scheme, host or port is
//!    refused (`denied`) with a line in the attempt's log that names the host and the key;
//! 3. the attempt's request budget (`limits.http_requests`);
//! 4. the host's headers, set over whatever the guest set: `baton-job`, `baton-slot` (RFC 3339),
//!    `baton-attempt`, `baton-fence` and `Idempotency-Key` (the same for every attempt of a run,
//!    different between runs); a guest's own `baton-*` and `Idempotency-Key` are dropped;
//! 5. the guest's timeouts, clamped to the job's limits; the response body, capped.
//!
//! A refused request fails in the guest with `http-request-denied`. The request body streams
//! through the gate too, and the host opens the connection itself with the gate under every
//! write to the socket ([`wire`]): once the lease is lost, nothing more of a request in flight
//! leaves the host, even one that passed the gate before its runner was frozen.

use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::fence::Gate;
use crate::log::AttemptLog;
use crate::OutboundSink;

mod wire;

/// The limits of one job's outbound HTTP, per attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// How many requests one attempt may send. Defaults to 100.
    pub requests: u32,
    /// The longest a request may wait for its connection. Defaults to 10 s.
    pub connect_timeout: Duration,
    /// The longest a request may wait for its response to begin. Defaults to 30 s.
    pub first_byte_timeout: Duration,
    /// The longest a response body may pause between two parts. Defaults to 30 s.
    pub between_bytes_timeout: Duration,
    /// The largest response body, bytes. Defaults to 16 MiB.
    pub response_size: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            requests: 100,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(30),
            between_bytes_timeout: Duration::from_secs(30),
            response_size: 16 << 20,
        }
    }
}

/// What a job may reach: its allow list and its limits. Defaults to nothing allowed and the
/// default limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outbound {
    /// Where requests may go.
    pub allowed: Vec<AllowedHost>,
    /// How many, how long, how large.
    pub limits: HttpLimits,
}

/// The scheme of an allowed host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `http`, port 80 unless given.
    Http,
    /// `https`, port 443 unless given.
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// One entry of `[grants] allowed_outbound_hosts`: a scheme, a host (or `*.` and a domain,
/// for every subdomain of it, not the domain itself) and an optional port (the scheme's own
/// by default), e.g. `https://api.example.com`, `http://127.0.0.1:8080`, `https://*.example.org`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHost {
    scheme: Scheme,
    /// Lower case; for a wildcard, the domain after `*.`.
    host: String,
    wildcard: bool,
    port: u16,
}

/// An entry of `allowed_outbound_hosts` that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("entry {entry:?}: {reason}; write a scheme, a host and an optional port, e.g. \"https://api.example.com\", \"http://127.0.0.1:8080\" or \"https://*.example.org\"")]
pub struct AllowedHostError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FromStr for AllowedHost {
    type Err = AllowedHostError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| AllowedHostError {
            entry: entry.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = entry
            .split_once("://")
            .ok_or_else(|| err("no scheme (http:// or https://)"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(err("the scheme must be http or https")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(err("a path, query or fragment is not allowed"));
        }
        if rest.contains('@') {
            return Err(err("a user name or password is not allowed"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (addr, after) = v6
                .split_once(']')
                .ok_or_else(|| err("an IPv6 address needs its closing ]"))?;
            addr.parse::<std::net::Ipv6Addr>()
                .map_err(|_| err("not an IPv6 address"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| err("junk after ]"))?),
            };
            (format!("[{addr}]"), port)
        } else {
            match rest.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (rest.to_owned(), None),
            }
        };
        let port = match port {
            None => scheme.default_port(),
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| err("the port must be a number from 1 to 65535"))?,
        };
        let host = host.to_ascii_lowercase();
        let (wildcard, host) = match host.strip_prefix("*.") {
            Some(domain) => (true, domain.to_owned()),
            None => (false, host),
        };
        if host.is_empty() {
            return Err(err("no host"));
        }
        let name_ok = host.starts_with('[')
            || host.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !name_ok {
            return Err(err(if host.contains('*') {
                "`*` is only allowed as the first label, as in *.example.org"
            } else {
                "not a host name or IP address"
            }));
        }
        Ok(AllowedHost {
            scheme,
            host,
            wildcard,
            port,
        })
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let star = if self.wildcard { "*." } else { "" };
        write!(
            f,
            "{}://{star}{}:{}",
            self.scheme.as_str(),
            self.host,
            self.port
        )
    }
}

impl AllowedHost {
    /// Whether a request to `scheme://host:port` may go out under this entry.
    pub fn allows(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        if scheme != self.scheme || port != self.port {
            return false;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.wildcard {
            host.len() > self.host.len()
                && host.ends_with(self.host.as_str())
                && host.as_bytes()[host.len() - self.host.len() - 1] == b'.'
        } else {
            host == self.host
        }
    }
}

/// The headers the host sets on every request of an attempt.
const JOB: HeaderName = HeaderName::from_static("baton-job");
const SLOT: HeaderName = HeaderName::from_static("baton-slot");
const ATTEMPT: HeaderName = HeaderName::from_static("baton-attempt");
const FENCE: HeaderName = HeaderName::from_static("baton-fence");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The `Idempotency-Key` of every request of a run: 32 hex digits of a SHA-256 of the job and
/// the slot, so the same for each attempt of the run and different between runs.
pub fn idempotency_key(job: &str, slot: i64) -> String {
    let digest = Sha256::digest(format!("baton:idempotency:{job}:{slot}").as_bytes());
    hex::encode(&digest[..16])
}

/// The fence headers of an attempt.
pub(crate) fn fence_headers(job: &str, slot: i64, attempt: u32, fence: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let text = |s: String| HeaderValue::from_bytes(s.as_bytes()).ok();
    let values = [
        (JOB, text(job.to_owned())),
        (SLOT, text(baton_core::schedule::format_utc(slot))),
        (ATTEMPT, text(attempt.to_string())),
        (FENCE, text(fence.to_string())),
        (IDEMPOTENCY_KEY, text(idempotency_key(job, slot))),
    ];
    for (name, value) in values {
        if let Some(value) = value {
            headers.insert(name, value);
        }
    }
    headers
}

/// One attempt's side of `wasi:http`: the checks and headers of every request it sends.
pub(crate) struct Hooks {
    gate: Gate,
    outbound: Arc<Outbound>,
    job_file: PathBuf,
    headers: HeaderMap,
    log: AttemptLog,
    sink: Option<OutboundSink>,
    sent: u32,
}

impl Hooks {
    /// The hooks of one attempt.
    pub(crate) fn new(
        gate: Gate,
        outbound: Arc<Outbound>,
        job_file: PathBuf,
        headers: HeaderMap,
        log: AttemptLog,
        sink: Option<OutboundSink>,
    ) -> Self {
        Hooks {
            gate,
            outbound,
            job_file,
            headers,
            log,
            sink,
            sent: 0,
        }
    }

    fn count(&self, outcome: &'static str) {
        if let Some(sink) = &self.sink {
            sink(outcome);
        }
    }

    /// Refuses a request: counted, explained in the attempt's log, `http-request-denied`.
    fn refuse(&self, outcome: &'static str, why: String) -> SendFuture {
        self.count(outcome);
        self.log.host(&why);
        Box::new(async { Err(Error::HttpRequestDenied) })
    }

    /// The allow list's verdict on a request's URI.
    fn allowed(&self, uri: &http::Uri) -> Result<(), String> {
        let scheme = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("https") => Scheme::Https,
            Some(s) if s.eq_ignore_ascii_case("http") => Scheme::Http,
            other => return Err(format!("the scheme {other:?} is not http or https")),
        };
        let host = uri.host().unwrap_or("");
        let port = uri.port_u16().unwrap_or(scheme.default_port());
        if self
            .outbound
            .allowed
            .iter()
            .any(|a| a.allows(scheme, host, port))
        {
            Ok(())
        } else {
            Err(format!(
                "{}://{host}:{port} is not in [grants] allowed_outbound_hosts of {}; add it there to allow it",
                scheme.as_str(),
                self.job_file.display()
            ))
        }
    }

    /// The guest's timeouts, each at most the job's limit (unset: the limit).
    fn clamp(&self, options: Option<RequestOptions>) -> RequestOptions {
        let limits = &self.outbound.limits;
        let given = options.unwrap_or_default();
        let clamp = |asked: Option<Duration>, max: Duration| Some(asked.unwrap_or(max).min(max));
        RequestOptions {
            connect_timeout: clamp(given.connect_timeout, limits.connect_timeout),
            first_byte_timeout: clamp(given.first_byte_timeout, limits.first_byte_timeout),
            between_bytes_timeout: clamp(given.between_bytes_timeout, limits.between_bytes_timeout),
        }
    }
}

type SendFuture = Box<
    dyn std::future::Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn std::future::Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn std::future::Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        let uri = request.uri().clone();
        if let Err(cause) = self.gate.check() {
            return self.refuse(
                "fenced",
                format!(
                    "outbound request to {} refused: {}",
                    origin(&uri),
                    crate::attempt::lost_reason(cause)
                ),
            );
        }
        if let Err(why) = self.allowed(&uri) {
            return self.refuse("denied", format!("outbound request denied: {why}"));
        }
        let limits = self.outbound.limits.clone();
        if self.sent >= limits.requests {
            return self.refuse(
                "denied",
                format!(
                    "outbound request to {} denied: the attempt has sent its {} requests (limits.http_requests in {})",
                    origin(&uri),
                    limits.requests,
                    self.job_file.display()
                ),
            );
        }
        self.sent += 1;
        let options = self.clamp(options);
        let (mut parts, body) = request.into_parts();
        let guest_set: Vec<HeaderName> = parts
            .headers
            .keys()
            .filter(|name| name.as_str().starts_with("baton-") || *name == IDEMPOTENCY_KEY)
            .cloned()
            .collect();
        for name in guest_set {
            parts.headers.remove(&name);
        }
        for (name, value) in &self.headers {
            parts.headers.insert(name.clone(), value.clone());
        }
        let gate = self.gate.clone();
        let body = GatedBody {
            inner: body,
            gate: gate.clone(),
        }
        .boxed_unsync();
        let request = http::Request::from_parts(parts, body);
        let sink = self.sink.clone();
        let log = self.log.clone();
        let count = move |outcome: &'static str| {
            if let Some(sink) = &sink {
                sink(outcome);
            }
        };
        Box::new(async move {
            // The request may start later than it was made: check again.
            if let Err(cause) = gate.check() {
                count("fenced");
                log.host(&format!(
                    "outbound request to {} refused: {}",
                    origin(&uri),
                    crate::attempt::lost_reason(cause)
                ));
                return Err(Error::HttpRequestDenied);
            }
            let (response, io) = match wire::send(request, options, gate.clone()).await {
                Ok(sent) => sent,
                Err(e) => {
                    count(if gate.check().is_err() {
                        "fenced"
                    } else {
                        "failed"
                    });
                    return Err(e);
                }
            };
            let declared = response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limits.response_size) {
                count("failed");
                log.host(&format!(
                    "outbound request to {}: the response body of {} bytes is over limits.http_response_size ({} bytes)",
                    origin(&uri),
                    declared.unwrap_or_default(),
                    limits.response_size
                ));
                return Err(Error::HttpResponseBodySize(declared));
            }
            count("sent");
            let response = response.map(|body| {
                CappedBody {
                    inner: body.boxed_unsync(),
                    left: limits.response_size,
                    limit: limits.response_size,
                }
                .boxed_unsync()
            });
            Ok((
                response,
                Box::new(io) as Box<dyn std::future::Future<Output = _> + Send>,
            ))
        })
    }
}

/// `scheme://host:port` of a URI, for messages (never its path or query, which may hold a
/// secret).
fn origin(uri: &http::Uri) -> String {
    let scheme = uri.scheme_str().unwrap_or("https");
    let default = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    format!(
        "{scheme}://{}:{}",
        uri.host().unwrap_or(""),
        uri.port_u16().unwrap_or(default)
    )
}

/// A request body that stops at the gate: once the attempt's lease is lost, no further part
/// of it leaves the host.
struct GatedBody {
    inner: WasiBody,
    gate: Gate,
}

impl Body for GatedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_some() && self.gate.check().is_err() {
            return Poll::Ready(Some(Err(Error::HttpRequestDenied)));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that fails once it passes the job's size limit.
struct CappedBody {
    inner: WasiBody,
    left: u64,
    limit: u64,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame {
            if let Some(data) = frame.data_ref() {
                let n = data.len() as u64;
                if n > self.left {
                    self.left = 0;
                    return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(self.limit)))));
                }
                self.left -= n;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(entry: &str, scheme: Scheme, host: &str, port: u16) -> bool {
        entry
            .parse::<AllowedHost>()
            .expect("valid entry")
            .allows(scheme, host, port)
    }

    #[test]
    fn entries_allow_their_scheme_host_and_port_only() {
        assert!(allowed(
            "https://api.example.com",
            Scheme::Https,
            "api.example.com",
            443
        ));
        assert!(allowed(
            "https://API.example.com",
            Scheme::Https,
            "api.EXAMPLE.com",
            443
        ));
        assert!(!allowed(
            "https://api.example.com",
            Scheme::Http,
            "api.example.com",
            80
        ));
        assert!(!allowed(
            "https://api.example.com",
            Scheme::Https,
            "api.example.com",
            8443
        ));
        assert!(!allowed(
            "https://api.example.com",
            Scheme::Https,
            "evil-api.example.com",
            443
        ));
        assert!(allowed(
            "http://127.0.0.1:8080",
            Scheme::Http,
            "127.0.0.1",
            8080
        ));
        assert!(!allowed(
            "http://127.0.0.1:8080",
            Scheme::Http,
            "127.0.0.1",
            80
        ));
        assert!(allowed("http://[::1]:8080", Scheme::Http, "[::1]", 8080));
    }

    #[test]
    fn a_wildcard_allows_subdomains_and_not_the_domain_itself() {
        let e = "https://*.example.org";
        assert!(allowed(e, Scheme::Https, "a.example.org", 443));
        assert!(allowed(e, Scheme::Https, "b.a.example.org", 443));
        assert!(!allowed(e, Scheme::Https, "example.org", 443));
        assert!(!allowed(e, Scheme::Https, "badexample.org", 443));
    }

    #[test]
    fn malformed_entries_are_refused_with_the_entry_and_the_reason() {
        for (entry, reason) in [
            ("api.example.com", "no scheme"),
            ("ftp://example.com", "http or https"),
            ("https://example.com/path", "path"),
            ("https://example.com:0", "port"),
            ("https://example.com:http", "port"),
            ("https://a.*.example.com", "first label"),
            ("https://user@example.com", "user name"),
            ("https://", "no host"),
        ] {
            let e = entry.parse::<AllowedHost>().expect_err(entry);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{entry:?}")) && msg.contains(reason),
                "{msg}"
            );
        }
    }

    #[test]
    fn the_idempotency_key_is_per_run() {
        assert_eq!(idempotency_key("a", 1000), idempotency_key("a", 1000));
        assert_ne!(idempotency_key("a", 1000), idempotency_key("a", 2000));
        assert_ne!(idempotency_key("a", 1000), idempotency_key("b", 1000));
        assert_eq!(idempotency_key("a", 1000).len(), 32);
    }
}
