//! The gRPC listener's accept loop: tonic serves the connections this yields. Each
//! connection is admitted by the listener's [`ConnectionGate`] first (a full listener closes
//! it at once), then, with TLS, handshaken concurrently with the others within
//! [`HANDSHAKE_TIMEOUT`]; the header-read deadline runs from the accept.

use std::{sync::Arc, time::Duration};

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::{Stream, wrappers::ReceiverStream};

use crate::{
    limits::{ConnectionGate, GRPC_FIRST_BYTES, Limited},
    serve::{HANDSHAKE_TIMEOUT, log_handshake_failure, log_handshake_timeout},
};

/// Handshaken connections waiting for tonic to take them.
const ACCEPTED_QUEUE: usize = 64;

/// Accepts TCP connections within `gate`'s limits and completes their TLS handshakes
/// concurrently; yields the connections that made it. A failed handshake is logged with the
/// peer and the reason. Each connection is handshaken with the configuration `config` holds
/// when it arrives, so a reloaded certificate or client CA applies to new connections.
pub fn tls_incoming(
    listener: TcpListener,
    config: tokio::sync::watch::Receiver<Arc<rustls::ServerConfig>>,
    gate: ConnectionGate,
) -> impl Stream<Item = std::io::Result<Limited<TlsStream<TcpStream>>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = tx.closed() => return,
                accepted = accept(&listener) => accepted,
            };
            let Some(admission) = gate.admit(peer, GRPC_FIRST_BYTES) else {
                continue;
            };
            let acceptor = TlsAcceptor::from(config.borrow().clone());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(admission.wrap(tls))).await;
                    }
                    Ok(Err(e)) => log_handshake_failure("gRPC", peer, &e),
                    Err(_) => log_handshake_timeout("gRPC", peer),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Accepts TCP connections within `gate`'s limits, for a gRPC listener without TLS (behind
/// a TLS-terminating proxy, or `--insecure-plaintext`).
pub fn tcp_incoming(
    listener: TcpListener,
    gate: ConnectionGate,
) -> impl Stream<Item = std::io::Result<Limited<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = tx.closed() => return,
                accepted = accept(&listener) => accepted,
            };
            if let Some(admission) = gate.admit(peer, GRPC_FIRST_BYTES)
                && tx.send(Ok(admission.wrap(tcp))).await.is_err()
            {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// The next connection, with `TCP_NODELAY` set. Errors (out of file descriptors and the
/// like) are logged and retried after a pause instead of spinning.
pub(crate) async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                let _ = tcp.set_nodelay(true);
                return (tcp, peer);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
