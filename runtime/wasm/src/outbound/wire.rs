//! The connection of one outbound request, fenced at the socket.
//!
//! The gate is asked when the guest calls and again when the request starts, but a request
//! that passed both still has a connection to open and bytes to write, and a runner frozen in
//! between (a `SIGSTOP`, a suspended VM) would send them when it wakes, after its lease was
//! given to a backup. So the host opens the connection itself and puts the gate under it: every
//! write to the socket (the request line, the headers, each part of the body, and under TLS
//! every record, the handshake's included) asks [`Gate::check`] first, in the same poll that
//! writes. A closed gate fails the write, and nothing more of the request leaves the host.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Scheme;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions};

use crate::fence::Gate;

/// A stream whose every write asks the attempt's gate first.
pub(super) struct GatedStream<S> {
    inner: S,
    gate: Gate,
}

impl<S> GatedStream<S> {
    /// `inner`, written only while `gate` is open.
    pub(super) fn new(inner: S, gate: Gate) -> Self {
        GatedStream { inner, gate }
    }

    /// `Ok` while the gate is open; else the error every write then fails with.
    fn open(&self) -> io::Result<()> {
        self.gate.check().map_err(|cause| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "write refused at the socket: {}",
                    crate::attempt::lost_reason(cause)
                ),
            )
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GatedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GatedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.open()?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.open()?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection, plain or TLS, under the gate.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// A connection's own work (writing the request, reading the answer), driven to its end.
pub(super) type Driving = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// What [`send`] answers: the response, and what is left of the connection's work, which must
/// be driven until the response body is read.
pub(super) type Sent = (http::Response<ResponseBody>, Driving);

/// Sends `request` on a new HTTP/1.1 connection whose writes pass `gate`, within the
/// `options`' timeouts (all set: the hooks clamp them to the job's limits; an unset one takes
/// [`HttpLimits`](super::HttpLimits)' default).
pub(super) async fn send<B>(
    mut request: http::Request<B>,
    options: RequestOptions,
    gate: Gate,
) -> Result<Sent, Error>
where
    B: Body<Data = Bytes, Error = Error> + Send + 'static,
{
    let uri = request.uri();
    let authority = uri.authority().ok_or(Error::HttpRequestUriInvalid)?;
    let tls = uri.scheme() == Some(&Scheme::HTTPS);
    // An IPv6 host is written in brackets in a URI, and without them in a socket address.
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    // The hooks set every timeout; the job limits' defaults stand in for any left unset.
    let defaults = super::HttpLimits::default();
    let connect_timeout = options.connect_timeout.unwrap_or(defaults.connect_timeout);
    let first_byte_timeout = options
        .first_byte_timeout
        .unwrap_or(defaults.first_byte_timeout);
    let between_bytes = options
        .between_bytes_timeout
        .unwrap_or(defaults.between_bytes_timeout)
        .max(Duration::from_nanos(1));

    let tcp = tokio::time::timeout(connect_timeout, TcpStream::connect((host.as_str(), port)))
        .await
        .map_err(|_| Error::ConnectionTimeout)?
        .map_err(Error::Connect)?;
    let stream = GatedStream::new(tcp, gate);
    let stream: Box<dyn Stream> = if tls {
        let name = server_name(&host)?;
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let handshake = connector.connect(name, stream);
        Box::new(
            tokio::time::timeout(connect_timeout, handshake)
                .await
                .map_err(|_| Error::ConnectionTimeout)?
                .map_err(Error::Tls)?,
        )
    } else {
        Box::new(stream)
    };
    let (mut sender, connection) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;

    // A request to an origin server names only its path and query.
    let path = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .map_err(|_| Error::HttpRequestUriInvalid)?;
    *request.uri_mut() = path;

    // The connection's own work (writing the request, reading the answer) is driven here
    // until the response begins; what is left of it goes back with the response. Once it has
    // ended it must not be polled again.
    let mut connection: Option<Driving> =
        Some(Box::pin(
            async move { connection.await.map_err(Error::from) },
        ));
    let response = tokio::time::timeout(first_byte_timeout, async {
        let mut respond = std::pin::pin!(sender.send_request(request));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(answer) = respond.as_mut().poll(cx) {
                return Poll::Ready(answer.map_err(Error::from));
            }
            if let Some(driving) = connection.as_mut() {
                if let Poll::Ready(done) = driving.as_mut().poll(cx) {
                    connection = None;
                    done?;
                    return respond.as_mut().poll(cx).map_err(Error::from);
                }
            }
            Poll::Pending
        })
        .await
    })
    .await
    .map_err(|_| Error::ConnectionReadTimeout)??;
    let rest = connection.unwrap_or_else(|| Box::pin(std::future::ready(Ok(()))));
    let response = response.map(|incoming| ResponseBody {
        incoming,
        between_bytes,
        quiet: Box::pin(tokio::time::sleep(between_bytes)),
    });
    Ok((response, rest))
}

/// The name a TLS server's certificate is checked against: its IP address or its host name
/// (`host` without brackets).
fn server_name(host: &str) -> Result<rustls::pki_types::ServerName<'static>, Error> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(rustls::pki_types::ServerName::from(ip));
    }
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|_| Error::HttpRequestUriInvalid)
}

/// A response body that fails once it pauses longer than the between-bytes timeout.
pub(super) struct ResponseBody {
    incoming: hyper::body::Incoming,
    between_bytes: Duration,
    quiet: Pin<Box<tokio::time::Sleep>>,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + self.between_bytes;
                self.quiet.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) if e.is_timeout() => {
                Poll::Ready(Some(Err(Error::HttpResponseTimeout)))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map_err(Error::from))),
            Poll::Pending => {
                std::task::ready!(self.quiet.as_mut().poll(cx));
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::instance::{AbortReason, LeaseDeadline, Signal};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// A gated stream with a minute of lease, the other end of its wire, and its signal.
    fn gated() -> (GatedStream<DuplexStream>, DuplexStream, Signal) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let signal = Signal::new();
        let deadline = LeaseDeadline::new(std::time::Instant::now() + Duration::from_secs(60));
        let gate = Gate::new(signal.clone(), deadline);
        (GatedStream::new(ours, gate), theirs, signal)
    }

    /// Everything that reached the other end once `stream` is closed.
    async fn received(stream: GatedStream<DuplexStream>, mut theirs: DuplexStream) -> Vec<u8> {
        drop(stream);
        let mut seen = Vec::new();
        theirs
            .read_to_end(&mut seen)
            .await
            .expect("the other end reads");
        seen
    }

    #[tokio::test]
    async fn a_write_after_the_lease_is_lost_leaves_nothing_on_the_wire() {
        let (mut stream, theirs, signal) = gated();
        stream
            .write_all(b"first")
            .await
            .expect("an open gate writes");
        signal.abort(AbortReason::Lost);
        let refused = stream
            .write_all(b"second")
            .await
            .expect_err("a closed gate");
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(received(stream, theirs).await, b"first");
    }

    /// A server on 127.0.0.1 that answers one request with `answer` and closes; it hands back
    /// what it received.
    async fn one_shot(answer: &'static [u8]) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let origin = format!("http://{}", listener.local_addr().expect("an address"));
        let served = tokio::spawn(async move {
            let Ok((mut socket, _)) = listener.accept().await else {
                return Vec::new();
            };
            let mut seen = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_millis(500), socket.read(&mut seen))
                .await
                .map_or(0, |r| r.unwrap_or(0));
            seen.truncate(n);
            if n > 0 {
                let _ = socket.write_all(answer).await;
            }
            seen
        });
        (origin, served)
    }

    /// A `GET` of `origin`, with a body of the hooks' error type.
    fn get(origin: &str) -> http::Request<impl Body<Data = Bytes, Error = Error> + Send> {
        use http_body_util::BodyExt;
        http::Request::get(format!("{origin}/path?q=1"))
            .body(
                http_body_util::Empty::<Bytes>::new()
                    .map_err(|never: std::convert::Infallible| -> Error { match never {} }),
            )
            .expect("a request")
    }

    fn options() -> RequestOptions {
        RequestOptions {
            connect_timeout: Some(Duration::from_secs(5)),
            first_byte_timeout: Some(Duration::from_secs(5)),
            between_bytes_timeout: Some(Duration::from_secs(5)),
        }
    }

    #[tokio::test]
    async fn a_request_whose_connection_closes_with_the_answer_is_read_to_its_end() {
        use http_body_util::BodyExt;
        let (origin, served) =
            one_shot(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
        let (stream_gate, _, _) = gated();
        let (response, rest) = send(get(&origin), options(), stream_gate.gate)
            .await
            .expect("an answer");
        assert_eq!(response.status(), 200);
        let (_, body) = response.into_parts();
        let driven = tokio::spawn(rest);
        let bytes = body.collect().await.expect("the body").to_bytes();
        assert_eq!(&bytes[..], b"ok");
        driven
            .await
            .expect("the connection's task")
            .expect("the connection ends cleanly");
        let seen = String::from_utf8(served.await.expect("the server")).expect("text");
        assert!(seen.starts_with("GET /path?q=1 HTTP/1.1\r\n"), "{seen}");
    }

    #[tokio::test]
    async fn a_request_of_a_lost_attempt_sends_nothing() {
        let (origin, served) = one_shot(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
        let (stream_gate, _, signal) = gated();
        signal.abort(AbortReason::Lost);
        let sent = send(get(&origin), options(), stream_gate.gate).await;
        assert!(sent.is_err(), "a lost attempt's request was answered");
        assert!(
            served.await.expect("the server").is_empty(),
            "bytes reached the server"
        );
    }

    #[tokio::test]
    async fn a_stop_request_still_lets_the_attempt_write() {
        let (mut stream, theirs, signal) = gated();
        signal.abort(AbortReason::Stopping);
        stream
            .write_all(b"last words")
            .await
            .expect("the lease is still held");
        assert_eq!(received(stream, theirs).await, b"last words");
    }
}
