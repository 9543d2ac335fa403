//! The second half of `start`: the gRPC server agents stream to and the HTTP server of the
//! REST API and the Kubernetes API proxy, each spawned on its bound listener, with their TLS
//! configurations in watch channels that the TLS reloader replaces.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use scale_agent_hub_net::{incoming, limits::ConnectionGate};
use scale_agent_proto::v1::agent_hub_server::AgentHubServer;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tonic::transport::Server;

use crate::{
    GrpcSecurity, Hub, HubError, Result, agent_auth,
    assemble::Bound,
    serve,
    service::AgentHubService,
    shutting_down, tls_reload,
    wiring::{grpc_state, http_routes, proxy_listener},
};

/// A server's TLS configuration: replaced in the sender, read by new connections.
type TlsChannel = (
    watch::Sender<Arc<rustls::ServerConfig>>,
    watch::Receiver<Arc<rustls::ServerConfig>>,
);

/// A server's task: ends when the hub shuts down, or with the server's error.
pub(crate) type ServerTask = JoinHandle<Result<()>>;

/// Spawns both servers and the TLS reloader, and returns the gRPC and the HTTP server's
/// tasks; a server that fails on its own reports on `failed`.
pub(crate) fn spawn_servers(
    hub: &Arc<Hub>,
    grpc: Bound,
    http: Bound,
    http_tls: Option<Arc<rustls::ServerConfig>>,
    failed: &mpsc::Sender<HubError>,
) -> Result<(ServerTask, ServerTask)> {
    // Both listeners take their TLS configuration from a watch channel that the reloader
    // replaces when the certificate files change: new connections get the new one.
    let grpc_tls: Option<TlsChannel> = grpc_tls(hub)?.map(watch::channel);
    let http_tls: Option<TlsChannel> = http_tls.map(watch::channel);
    if let Some(reloader) = tls_reload::Reloader::new(
        hub.clone(),
        grpc_tls.as_ref().map(|(tx, _)| tx.clone()),
        http_tls.as_ref().map(|(tx, _)| tx.clone()),
    ) {
        tokio::spawn(reloader.run(hub.shutdown.clone()));
    }
    let grpc = spawn_grpc(hub, grpc, grpc_tls.map(|(_, rx)| rx), failed.clone())?;
    let http = spawn_http(hub, http, http_tls.map(|(_, rx)| rx), failed.clone());
    Ok((grpc, http))
}

/// The gRPC listener's TLS: `None` behind a TLS-terminating proxy (its hop is tonic's, see
/// [`proxy_listener`]) and with `--insecure-plaintext`.
fn grpc_tls(hub: &Hub) -> Result<Option<Arc<rustls::ServerConfig>>> {
    // TLS is terminated here rather than by tonic: client certificates are optional at the
    // TLS layer (enrolling and token-authenticated agents have none) and checked per stream.
    Ok(
        match (&hub.config.agents.security, hub.client_certificates()) {
            (GrpcSecurity::MutualTls(tls), Some(clients)) => Some(agent_auth::server_tls_config(
                &tls.cert_pem,
                &tls.key_pem,
                &clients,
            )?),
            (GrpcSecurity::TrustedProxy(_), _) => None,
            _ => {
                tracing::warn!(
                    "--insecure-plaintext: gRPC without TLS; agents without an agent token are \
                     not authenticated and their traffic is readable on the network"
                );
                None
            }
        },
    )
}

/// Serves the agents' gRPC service on `bound` until the hub shuts down.
fn spawn_grpc(
    hub: &Arc<Hub>,
    bound: Bound,
    tls: Option<watch::Receiver<Arc<rustls::ServerConfig>>>,
    failed: mpsc::Sender<HubError>,
) -> Result<ServerTask> {
    let (keepalive_interval, keepalive_timeout) = hub.stream_settings.keepalive();
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(keepalive_interval))
        .http2_keepalive_timeout(Some(keepalive_timeout))
        .tcp_keepalive(Some(Duration::from_secs(60)));
    if let GrpcSecurity::TrustedProxy(proxy) = &hub.config.agents.security {
        builder = proxy_listener(builder, proxy)?;
    }
    let service = AgentHubServer::new(AgentHubService::new(grpc_state(hub)))
        .max_decoding_message_size(hub.stream_settings.max_message_bytes());
    let router = builder.add_service(service);
    let shutdown = hub.shutdown.clone();
    let gate = ConnectionGate::new(
        "grpc",
        hub.config.listeners.grpc_limits,
        hub.metrics.listeners.clone(),
    );
    let Bound { listener, addr } = bound;
    let task = tokio::spawn(async move {
        let result = match tls {
            Some(tls) => {
                router
                    .serve_with_incoming_shutdown(
                        incoming::tls_incoming(listener, tls, gate),
                        shutting_down(shutdown),
                    )
                    .await
            }
            None => {
                router
                    .serve_with_incoming_shutdown(
                        incoming::tcp_incoming(listener, gate),
                        shutting_down(shutdown),
                    )
                    .await
            }
        }
        .map_err(|e| HubError::Grpc(Box::new(e)));
        if let Err(e) = &result {
            let _ = failed.try_send(HubError::Task(crate::error::Chain(e).to_string()));
        }
        result
    });
    hub.grpc_listening.store(true, Ordering::SeqCst);
    tracing::info!(grpc_addr = %addr, mtls = matches!(hub.config.agents.security, GrpcSecurity::MutualTls(_)), "gRPC listening");
    Ok(task)
}

/// Serves the REST API and the Kubernetes API proxy on `bound` until the hub shuts down.
fn spawn_http(
    hub: &Arc<Hub>,
    bound: Bound,
    tls: Option<watch::Receiver<Arc<rustls::ServerConfig>>>,
    failed: mpsc::Sender<HubError>,
) -> ServerTask {
    let app = http_routes(hub);
    let shutdown = hub.shutdown.clone();
    let gate = ConnectionGate::new(
        "http",
        hub.config.listeners.http_limits,
        hub.metrics.listeners.clone(),
    );
    let with_tls = tls.is_some();
    if !with_tls {
        tracing::warn!(
            "--http-plaintext: the HTTP listener has no TLS; proxy tokens and cluster data cross \
             the network in clear"
        );
    }
    let Bound { listener, addr } = bound;
    let task = tokio::spawn(async move {
        let result = serve::serve(listener, app, tls, gate, shutting_down(shutdown)).await;
        if let Err(e) = &result {
            let _ = failed.try_send(HubError::Task(format!(
                "HTTP server: {}",
                crate::error::Chain(e)
            )));
        }
        result
    });
    tracing::info!(http_addr = %addr, tls = with_tls, "HTTP listening (REST API and Kubernetes API proxy)");
    task
}
