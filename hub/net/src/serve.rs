//! The HTTP listener: TLS with the hub's serving certificate by default (rustls, ALPN `h2`
//! and `http/1.1`, so kubectl and client-go speak HTTP/2 and multiplex their watches on one
//! connection), plaintext only behind an explicit flag. Connections are served by hyper's
//! automatic HTTP/1.1-or-HTTP/2 builder; shutdown stops accepting, then gives open
//! connections (long watches among them) a short time to finish.

use std::{future::Future, sync::Arc, time::Duration};

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use scale_agent_hub_model::error::{HubError, Result};

use crate::{
    incoming::accept,
    limits::{ConnectionGate, HTTP_FIRST_BYTES},
};

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may run on after shutdown begins.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The HTTP listener's rustls configuration from PEM: the certificate chain and its private
/// key, no client certificates, HTTP/2 and HTTP/1.1.
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>> {
    let names = ("the HTTP serving certificate", "the HTTP serving key");
    server_config(cert_pem, key_pem, names, None, &[b"h2", b"http/1.1"])
}

/// A listener's rustls configuration from PEM (both listeners build theirs here): the
/// certificate chain and its key, `clients` to check client certificates (`None`: no
/// client authentication), `alpn` the protocols offered. `names` (certificate, key) say
/// which files an error is about.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    (certificate, key_name): (&str, &str),
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| HubError::Config(format!("{certificate}: {e}")))?;
    if certs.is_empty() {
        return Err(HubError::Config(format!(
            "{certificate} holds no PEM certificate"
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| HubError::Config(format!("{key_name}: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HubError::Config(format!("TLS: {e}")))?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        HubError::Config(format!(
            "{certificate} and {key_name} do not fit together: {e}"
        ))
    })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Logs a failed TLS handshake on `listener` ("HTTPS", "gRPC"): at `warn` with the peer and
/// rustls' reason (an unknown CA, a bad or expired certificate, no shared protocol version),
/// except a peer that closed the connection without a word (a TCP health check or port
/// scan), which is `debug`. Both listeners log through here.
pub fn log_handshake_failure(
    listener: &'static str,
    peer: std::net::SocketAddr,
    error: &std::io::Error,
) {
    let reason = error
        .get_ref()
        .map_or_else(|| error.to_string(), |inner| inner.to_string());
    match error.kind() {
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => {
            tracing::debug!(listener, %peer, %reason, "{listener} TLS handshake ended by the peer");
        }
        _ => tracing::warn!(listener, %peer, %reason, "{listener} TLS handshake failed"),
    }
}

/// Logs a handshake that did not finish within [`HANDSHAKE_TIMEOUT`].
pub fn log_handshake_timeout(listener: &'static str, peer: std::net::SocketAddr) {
    let reason = format!("no handshake within {HANDSHAKE_TIMEOUT:?}");
    tracing::warn!(listener, %peer, %reason, "{listener} TLS handshake failed");
}

/// Serves `router` on `listener` until `shutdown` resolves. With TLS, each connection is
/// handshaken with the configuration `tls` holds when it arrives (a reloaded certificate
/// applies to new connections). `gate` caps the connections open at once and closes those
/// that send no request head within its header-read timeout (HTTP/1.1 request heads after
/// the first too).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>>,
    gate: ConnectionGate,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let graceful = GracefulShutdown::new();
    let header_read_timeout = gate.limits().header_read_timeout;
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener) => accepted,
        };
        let Some(admission) = gate.admit(peer, HTTP_FIRST_BYTES) else {
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        let acceptor = tls
            .as_ref()
            .map(|tls| TlsAcceptor::from(tls.borrow().clone()));
        tokio::spawn(async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let result = match acceptor {
                Some(acceptor) => {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(error)) => {
                                log_handshake_failure("HTTPS", peer, &error);
                                return;
                            }
                            Err(_) => {
                                log_handshake_timeout("HTTPS", peer);
                                return;
                            }
                        };
                    let conn = builder
                        .serve_connection_with_upgrades(
                            TokioIo::new(admission.wrap(stream)),
                            service,
                        )
                        .into_owned();
                    watcher.watch(conn).await
                }
                None => {
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(admission.wrap(tcp)), service)
                        .into_owned();
                    watcher.watch(conn).await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!(
            "HTTP connections still open {DRAIN_TIMEOUT:?} after shutdown began (watches); closing them"
        );
    }
    Ok(())
}
