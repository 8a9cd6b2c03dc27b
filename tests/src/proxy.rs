//! A small fault-injecting TCP proxy for the tests: it forwards 127.0.0.1:`port` to a target
//! and can be told to delay, to stall requests for a while, to swallow the server's replies and
//! cut the connection, to refuse every connection (a partition), or to forward to another
//! server from now on (a failover). It also counts round trips as they cross the wire.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to traffic now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Forward requests, but swallow the next reply and cut the connection: the request took
    /// effect on the server, the client never hears of it.
    CutReplies,
    /// Cut every connection and refuse new ones: the store is out of reach.
    Partition,
}

impl Mode {
    fn code(self) -> u8 {
        match self {
            Mode::Pass => 0,
            Mode::CutReplies => 1,
            Mode::Partition => 2,
        }
    }

    fn from_code(code: u8) -> Mode {
        match code {
            1 => Mode::CutReplies,
            2 => Mode::Partition,
            _ => Mode::Pass,
        }
    }
}

struct Shared {
    mode: AtomicU8,
    delay_ms: AtomicU64,
    /// What the client sends is held until `base` + this many ms (a stall).
    stalled_until_ms: AtomicU64,
    base: tokio::time::Instant,
    /// Bumped by every change to [`Mode::Partition`] and by [`Proxy::retarget`], so live
    /// connections notice and close.
    generation: AtomicU64,
    /// Where new connections go (`host:port`).
    target: std::sync::Mutex<String>,
    /// Round trips seen on every connection (see [`Proxy::round_trips`]).
    round_trips: AtomicU64,
    /// Connection tests seen on every connection (see [`Proxy::pings`]).
    pings: AtomicU64,
    /// The bytes whose requests lose their answer (see [`Proxy::cut_replies_to`]).
    marker: std::sync::Mutex<Option<Vec<u8>>>,
}

/// A running proxy; it stops when dropped.
pub struct Proxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Starts a proxy to `target` (`host:port`) on a free port.
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass.code()),
            delay_ms: AtomicU64::new(0),
            stalled_until_ms: AtomicU64::new(0),
            base: tokio::time::Instant::now(),
            generation: AtomicU64::new(0),
            target: std::sync::Mutex::new(target),
            round_trips: AtomicU64::new(0),
            pings: AtomicU64::new(0),
            marker: std::sync::Mutex::new(None),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if Mode::from_code(s.mode.load(Ordering::SeqCst)) == Mode::Partition {
                    drop(client);
                    continue;
                }
                let target = s.target.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, s.clone()));
            }
        });
        Proxy { port, shared, task }
    }

    /// From now on, a request that contains `marker` reaches the server and loses its answer:
    /// the connection is cut instead (every other request passes). Narrower than
    /// [`Mode::CutReplies`], which a client's reconnection handshake cannot get past: one
    /// operation, picked by a name it carries, takes effect unheard, as often as it is sent.
    /// [`Proxy::set`] ends it.
    pub fn cut_replies_to(&self, marker: &[u8]) {
        *self.shared.marker.lock().unwrap_or_else(|p| p.into_inner()) = Some(marker.to_vec());
    }

    /// Changes what the proxy does from now on (and ends [`Proxy::cut_replies_to`]).
    pub fn set(&self, mode: Mode) {
        *self.shared.marker.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if mode == Mode::Partition {
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.mode.store(mode.code(), Ordering::SeqCst);
    }

    /// Points the proxy at another server (`host:port`), as a failover moves a virtual
    /// address: the live connections are cut, new ones go to `target`.
    pub fn retarget(&self, target: String) {
        *self.shared.target.lock().unwrap_or_else(|p| p.into_inner()) = target;
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Delays every chunk forwarded in either direction by `delay` (latency: chunks keep their
    /// order, and one waiting does not hold back the next).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Round trips that crossed the proxy so far, on all its connections: on each connection,
    /// every time the server answers after the client spoke counts one. Requests a client
    /// pipelines before the answer (a script and its `WAIT`, a statement's bind and execute,
    /// a connection test and the next statement) are one round trip, as they cost one network
    /// delay; a message the client sends that the server does not answer costs none. A
    /// connection test alone and its answer count in [`Proxy::pings`] instead.
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::SeqCst)
    }

    /// Connection tests answered alone so far: a PostgreSQL client's bare `Sync` (which a pool
    /// that tests each connection it takes back sends, after the operation had its answer)
    /// and the server's `ReadyForQuery`. Seen only on a connection without TLS.
    pub fn pings(&self) -> u64 {
        self.shared.pings.load(Ordering::SeqCst)
    }

    /// Stalls what the client sends for `stall` from now: every request read meanwhile reaches
    /// the server when the stall ends, however many round trips it takes (the first waits,
    /// the next pass), and the server's answers pass at once.
    pub fn stall_requests(&self, stall: Duration) {
        let until = self.shared.base.elapsed() + stall;
        self.shared.stalled_until_ms.store(
            u64::try_from(until.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

async fn pipe(client: TcpStream, server: TcpStream, s: Arc<Shared>) {
    let generation = s.generation.load(Ordering::SeqCst);
    let (client_read, mut client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    let live = |s: &Shared| {
        s.generation.load(Ordering::SeqCst) == generation
            && Mode::from_code(s.mode.load(Ordering::SeqCst)) != Mode::Partition
    };
    // What the client has sent since the server last spoke: the server's next chunk answers it.
    let awaiting = Arc::new(AtomicU8::new(Awaiting::Nothing as u8));
    // Whether the client sent a request with the marker: the answer is cut.
    let marked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Each direction: a reader stamps every chunk with when it is due (read time + delay) and
    // a writer forwards it then, in order. A delay is latency: a chunk waiting does not hold
    // back the reading of the next one.
    let up = {
        let s = s.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let read = read_chunks(
            client_read,
            tx,
            s.clone(),
            Side::Client(awaiting.clone(), marked.clone()),
        );
        let write = async move {
            let mut rx = rx;
            while let Some((due, chunk)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if !live(&s) || server_write.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        };
        forward(read, write)
    };
    let down = {
        let s = s.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let read = read_chunks(server_read, tx, s.clone(), Side::Server(awaiting.clone()));
        let write = async move {
            let mut rx = rx;
            while let Some((due, chunk)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if !live(&s)
                    || Mode::from_code(s.mode.load(Ordering::SeqCst)) == Mode::CutReplies
                    || marked.load(Ordering::SeqCst)
                {
                    return;
                }
                if client_write.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        };
        forward(read, write)
    };
    // Either direction ending closes both: dropping the halves shuts the sockets.
    let watch = {
        let s = s.clone();
        async move {
            while live(&s) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = watch => {}
    }
}

/// One direction: it ends when its writer does (a cut, an error, or the reader's end once the
/// chunks read before it are forwarded).
async fn forward(
    read: impl std::future::Future<Output = ()>,
    write: impl std::future::Future<Output = ()>,
) {
    let read = async {
        read.await;
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = write => {}
        _ = read => {}
    }
}

/// What a connection's client has sent since its server last spoke.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Awaiting {
    Nothing = 0,
    /// A connection test alone (a PostgreSQL `Sync`).
    Ping = 1,
    /// A request.
    Request = 2,
}

/// PostgreSQL's `Sync` message: `S` and its length, 4.
const PG_SYNC: [u8; 5] = [b'S', 0, 0, 0, 4];

/// Which end a stream of chunks comes from, with what the connection's client has sent since
/// its server last spoke ([`Awaiting`]) and, for the client, whether it sent the marker of
/// [`Proxy::cut_replies_to`].
enum Side {
    Client(Arc<AtomicU8>, Arc<std::sync::atomic::AtomicBool>),
    Server(Arc<AtomicU8>),
}

/// Reads chunks until the end of the stream, each stamped with when it is due; what the
/// client sends (requests) a stall holds up, and the server's first chunk after a request
/// counts a round trip.
async fn read_chunks(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::sync::mpsc::UnboundedSender<(tokio::time::Instant, Vec<u8>)>,
    s: Arc<Shared>,
    side: Side,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = Duration::from_millis(s.delay_ms.load(Ordering::SeqCst));
        let mut due = tokio::time::Instant::now() + delay;
        match &side {
            Side::Client(awaiting, marked) => {
                let marker = s.marker.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if marker
                    .is_some_and(|m| !m.is_empty() && buf[..n].windows(m.len()).any(|w| w == m))
                {
                    marked.store(true, Ordering::SeqCst);
                }
                let now = if buf[..n] == PG_SYNC {
                    Awaiting::Ping
                } else {
                    Awaiting::Request
                };
                let _ = awaiting.fetch_max(now as u8, Ordering::SeqCst);
                let stalled = Duration::from_millis(s.stalled_until_ms.load(Ordering::SeqCst));
                due = due.max(s.base + stalled);
            }
            Side::Server(awaiting) => {
                match awaiting.swap(Awaiting::Nothing as u8, Ordering::SeqCst) {
                    x if x == Awaiting::Request as u8 => {
                        s.round_trips.fetch_add(1, Ordering::SeqCst);
                    }
                    x if x == Awaiting::Ping as u8 => {
                        s.pings.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
        }
        if to.send((due, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}
