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

/// What [`send`] answers: the response, and the connection's own work, which must be driven
/// until the response body is read.
pub(super) type Sent = (
    http::Response<ResponseBody>,
    Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>,
);

/// Sends `request` on a new HTTP/1.1 connection whose writes pass `gate`, within the
/// `options`' timeouts (all set: the hooks clamp them to the job's limits).
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
    let connect_timeout = options.connect_timeout.unwrap_or(Duration::from_secs(10));
    let first_byte_timeout = options
        .first_byte_timeout
        .unwrap_or(Duration::from_secs(30));
    let between_bytes = options
        .between_bytes_timeout
        .unwrap_or(Duration::from_secs(30))
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

    let mut connection: Pin<Box<dyn Future<Output = Result<(), Error>> + Send>> =
        Box::pin(async move { connection.await.map_err(Error::from) });
    let response = tokio::time::timeout(first_byte_timeout, async {
        let mut respond = std::pin::pin!(sender.send_request(request));
        let mut driving = true;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(answer) = respond.as_mut().poll(cx) {
                return Poll::Ready(answer.map_err(Error::from));
            }
            if driving {
                if let Poll::Ready(done) = connection.as_mut().poll(cx) {
                    driving = false;
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
    let response = response.map(|incoming| ResponseBody {
        incoming,
        between_bytes,
        quiet: Box::pin(tokio::time::sleep(between_bytes)),
    });
    Ok((response, connection))
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
