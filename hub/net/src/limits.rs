//! What a client that connects but does nothing useful may cost the hub (review F23): each
//! listener admits at most `max_connections` connections at once (counted from the TCP
//! accept, TLS handshake included), and a connection must send its first bytes of HTTP (the
//! HTTP/2 preface, or the start of an HTTP/1.1 request) within `header_read_timeout`, or it
//! is closed. HTTP/1.1 request heads after the first are held to the same timeout by hyper
//! itself ([`crate::serve`]). A refused or timed-out connection is counted in the
//! listener's metrics and logged (at most once a second per listener, so that a flood does
//! not become a log flood).

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};

/// Default `--grpc-max-connections`: well above the 10,000 agents of the fleet benchmark's
/// largest run on one hub.
pub const DEFAULT_GRPC_MAX_CONNECTIONS: usize = 20_000;
/// Default `--http-max-connections`: kubectl, Helm and Clouddriver keep few connections each
/// (HTTP/2 multiplexes their watches); thousands of concurrent kubectl processes fit.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 10_000;
/// Default `--header-read-timeout`: hyper's own default for HTTP/1.1 heads.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes a connection must send within the header-read timeout before it counts as
/// speaking: the HTTP/2 connection preface is 24 bytes, and any HTTP/1.1 request with a
/// `Host` header is longer. The gRPC listener, HTTP/2 only, also waits for the SETTINGS
/// frame's 9-byte header that must follow the preface.
pub const HTTP_FIRST_BYTES: usize = 24;
/// See [`HTTP_FIRST_BYTES`].
pub const GRPC_FIRST_BYTES: usize = 24 + 9;

/// One listener's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections served at once; one more is closed at accept.
    pub max_connections: usize,
    /// How long a connection may take to send its first HTTP bytes (and, on HTTP/1.1, each
    /// request head).
    pub header_read_timeout: Duration,
}

impl ListenerLimits {
    /// The gRPC listener's defaults.
    pub fn grpc_default() -> Self {
        Self {
            max_connections: DEFAULT_GRPC_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }

    /// The HTTP listener's defaults.
    pub fn http_default() -> Self {
        Self {
            max_connections: DEFAULT_HTTP_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// The listeners' metrics, labelled by listener (`grpc`, `http`).
#[derive(Clone, Debug, Default)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub open: Family<[(&'static str, &'static str); 1], Gauge>,
    /// Connections closed at accept because the listener was full.
    pub refused: Family<[(&'static str, &'static str); 1], Counter>,
    /// Connections closed because their first bytes did not arrive in time.
    pub timed_out: Family<[(&'static str, &'static str); 1], Counter>,
}

impl ListenerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "listener_connections",
            "Connections open on each listener (against --grpc-max-connections and \
             --http-max-connections)",
            self.open.clone(),
        );
        registry.register(
            "listener_connections_refused",
            "Connections closed at accept because the listener had its maximum open",
            self.refused.clone(),
        );
        registry.register(
            "listener_header_timeouts",
            "Connections closed because their first HTTP bytes did not arrive within \
             --header-read-timeout",
            self.timed_out.clone(),
        );
    }
}

/// Admits connections to one listener within its [`ListenerLimits`].
#[derive(Clone, Debug)]
pub struct ConnectionGate {
    listener: &'static str,
    limits: ListenerLimits,
    permits: Arc<Semaphore>,
    metrics: ListenerMetrics,
    /// Unix second of the last refusal logged, so that a flood logs once a second.
    last_logged: Arc<AtomicU64>,
}

impl ConnectionGate {
    /// A gate for `listener` ("grpc", "http": the metrics' label and the logs' word).
    pub fn new(listener: &'static str, limits: ListenerLimits, metrics: ListenerMetrics) -> Self {
        Self {
            listener,
            limits,
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            metrics,
            last_logged: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn limits(&self) -> ListenerLimits {
        self.limits
    }

    fn label(&self) -> [(&'static str, &'static str); 1] {
        [("listener", self.listener)]
    }

    /// Admits a connection from `peer`, or returns `None` (counted, logged) when the
    /// listener is full: the caller drops the connection. `first_bytes` is how many bytes
    /// of HTTP the peer must send within the header-read timeout of connecting
    /// ([`HTTP_FIRST_BYTES`], [`GRPC_FIRST_BYTES`]); [`Admission::wrap`] applies it to the
    /// stream that carries HTTP (after the TLS handshake, whose bytes do not count).
    pub fn admit(&self, peer: SocketAddr, first_bytes: usize) -> Option<Admission> {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.metrics.refused.get_or_create(&self.label()).inc();
            self.log_once_a_second(|| {
                tracing::warn!(
                    listener = self.listener,
                    %peer,
                    max = self.limits.max_connections,
                    "{} listener full ({} connections open): connection closed; raise --{}-max-connections if this load is legitimate",
                    self.listener,
                    self.limits.max_connections,
                    self.listener,
                );
            });
            return None;
        };
        let open = self.metrics.open.get_or_create(&self.label()).clone();
        open.inc();
        Some(Admission {
            admitted: Admitted {
                _permit: permit,
                open,
            },
            first_bytes: FirstBytes {
                missing: first_bytes,
                deadline: Some(Box::pin(tokio::time::sleep(
                    self.limits.header_read_timeout,
                ))),
                timeout: self.limits.header_read_timeout,
                listener: self.listener,
                peer,
                timed_out: self.metrics.timed_out.get_or_create(&self.label()).clone(),
            },
        })
    }

    fn log_once_a_second(&self, log: impl FnOnce()) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.last_logged.swap(now, Ordering::Relaxed) != now {
            log();
        }
    }
}

/// A connection's place on its listener, given back when the connection is dropped.
#[derive(Debug)]
struct Admitted {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// The deadline for a connection's first bytes.
#[derive(Debug)]
struct FirstBytes {
    /// Bytes still to come before the deadline is lifted.
    missing: usize,
    /// `None` once they came.
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    listener: &'static str,
    peer: SocketAddr,
    timed_out: Counter,
}

/// An admitted connection: holds its place on the listener until dropped, and fails its
/// reads once the header-read timeout passes before its first bytes arrived.
#[derive(Debug)]
pub struct Limited<IO> {
    inner: IO,
    _admitted: Admitted,
    first_bytes: FirstBytes,
}

impl<IO> Limited<IO> {
    pub fn get_ref(&self) -> &IO {
        &self.inner
    }
}

/// A connection's admission, before it is wrapped: its place on the listener and the
/// deadline of its first bytes (running since the accept).
#[derive(Debug)]
pub struct Admission {
    admitted: Admitted,
    first_bytes: FirstBytes,
}

impl Admission {
    /// The stream that carries the connection's HTTP, holding the admission.
    pub fn wrap<IO>(self, io: IO) -> Limited<IO> {
        Limited {
            inner: io,
            _admitted: self.admitted,
            first_bytes: self.first_bytes,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let first = &mut this.first_bytes;
        let Some(deadline) = first.deadline.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                first.missing = first.missing.saturating_sub(read);
                if first.missing == 0 {
                    first.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => {
                    first.deadline = None;
                    first.timed_out.inc();
                    tracing::info!(
                        listener = first.listener,
                        peer = %first.peer,
                        "{} connection sent no request within {:?} (--header-read-timeout): closed",
                        first.listener,
                        first.timeout,
                    );
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "no request within {:?} (--header-read-timeout)",
                            first.timeout
                        ),
                    )))
                }
            },
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// tonic reads the peer's address and certificates from the connection it serves: an
/// admitted connection shows those of the one it wraps.
impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Limited<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
