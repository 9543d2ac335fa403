//! What `start` builds from the configuration and the hub's handles for each crate: their
//! settings, the gRPC service's state, the HTTP listener's routes, the TLS-terminating proxy's
//! hop.

use std::{sync::Arc, time::Duration};

use scale_agent_hub_replicas::ReplicaSettings;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::{
    Config, GrpcSecurity, HttpSecurity, Hub, HubError, ProxyMode, Result, http, owners, proxy,
    service, session::Limits,
};

/// What the replicas' handle reads of the configuration.
pub(crate) fn replica_settings(config: &Config) -> ReplicaSettings {
    ReplicaSettings {
        id: config.replicas.id.clone(),
        address: config.replicas.address.clone(),
        server_name: config.replicas.server_name.clone(),
        secret: config.replicas.secret.clone(),
        secret_overlap: config.replicas.secret_overlap,
        sync_period: config.replicas.sync_period,
        grace_period: config.streams.grace_period,
        serves_tls: matches!(config.listeners.http_security, HttpSecurity::Tls { .. }),
        peer_cidrs: config.replicas.peer_cidrs.clone(),
    }
}

/// The gRPC listener behind a TLS-terminating proxy: plaintext, or TLS whose client is the
/// proxy (its certificate required when only proxy identities are trusted, optional when
/// an address range is trusted too).
pub(crate) fn proxy_listener(builder: Server, proxy: &ProxyMode) -> Result<Server> {
    let header = proxy.trust.header();
    if !proxy.trust.trusts_identities() {
        tracing::warn!(%header, "gRPC proxy trusted by source address only: anyone who can connect from the trusted ranges can send any agent's (public) certificate in the header; the hub renews no certificate on such streams. Trust the proxy by its client certificate (--trusted-proxy-identity, --trusted-proxy-ca) and admit only it to the gRPC port (a NetworkPolicy)");
    }
    let Some(hop) = &proxy.hop_tls else {
        tracing::info!(%header, "gRPC behind a TLS-terminating proxy: plaintext hop; agents are identified by the forwarded certificate from trusted proxies only");
        return Ok(builder);
    };
    let mut tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&hop.cert_pem, &hop.key_pem))
        .timeout(Duration::from_secs(10));
    if let Some(ca) = &hop.proxy_ca_pem {
        tls = tls
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!proxy.trust.trusts_only_identities());
    }
    tracing::info!(%header, proxy_certificates = hop.proxy_ca_pem.is_some(), "gRPC behind a TLS-terminating proxy: TLS hop");
    builder
        .tls_config(tls)
        .map_err(|e| HubError::Grpc(Box::new(e)))
}

/// What the gRPC service works with: the hub's handles it uses, its settings and metrics.
pub(crate) fn grpc_state(hub: &Hub) -> service::GrpcState {
    service::GrpcState {
        live: hub.live.clone(),
        auth: hub.auth.clone(),
        replicas: hub.replicas.clone(),
        operations: hub.operations.clone(),
        commits: hub.commits.clone(),
        store: hub.store.clone(),
        tunnels: hub.proxy.tunnels.clone(),
        settings: hub.stream_settings.clone(),
        metrics: hub.metrics.grpc.clone(),
        shutdown: hub.shutdown.clone(),
    }
}

/// What the gRPC service reads of the configuration.
pub(crate) fn stream_settings(config: &Config) -> service::StreamSettings {
    service::StreamSettings {
        heartbeat: config.streams.heartbeat_bounds(),
        max_unacked: config.streams.max_unacked,
        limits: Limits {
            max_object_bytes: config.streams.max_object_bytes,
            max_staged_bytes: config.streams.max_staged_bytes,
            max_objects_per_account: config.streams.max_objects_per_account,
            max_accounts_per_identity: config.streams.max_accounts_per_identity,
            allow: config.agents.allow.clone(),
        },
        max_streams_per_identity: config.streams.max_streams_per_identity,
        agent_cert_lifetime: config.agents.agent_cert_lifetime,
        agent_max_enrolment_age: config.agents.agent_max_enrolment_age,
        trusted_proxy: match &config.agents.security {
            GrpcSecurity::TrustedProxy(proxy) => Some(proxy.trust.clone()),
            GrpcSecurity::MutualTls(_) | GrpcSecurity::InsecurePlaintext => None,
        },
    }
}

/// What the REST API reads of the configuration.
pub(crate) fn api_settings(config: &Config) -> http::ApiSettings {
    http::ApiSettings {
        public_url: config.api.public_url.clone(),
        https: matches!(config.listeners.http_security, HttpSecurity::Tls { .. }),
        serving_ca_pem: config.api.serving_ca_pem.clone(),
        max_request_bytes: config.api.max_request_bytes,
        operation_retention: config.operations.retention,
        metrics_unauthenticated: config.api.metrics_unauthenticated,
        token_ttl: config.api.token_ttl,
    }
}

/// The HTTP listener's routes: the REST API's ([`http::router`], with the handles it works
/// with and the hub answering its health routes) and the Kubernetes API proxy's, at
/// `/clusters/...` and, for other replicas, behind the replicas' secret under
/// [`owners::forward::INTERNAL_PREFIX`]. Each router has its own state.
pub(crate) fn http_routes(hub: &Arc<Hub>) -> axum::Router {
    let api = http::router(http::ApiState {
        live: hub.live.clone(),
        auth: hub.auth.clone(),
        store: hub.store.clone(),
        commits: hub.commits.clone(),
        replicas: hub.replicas.clone(),
        operations: hub.operation_driver.clone(),
        registrar: hub.registrar.clone(),
        settings: api_settings(&hub.config),
        health: hub.clone(),
    });
    let internal_proxy = proxy::router(hub.proxy_routes()).route_layer(
        axum::middleware::from_fn_with_state(hub.replicas.clone(), owners::forward::internal_auth),
    );
    let proxy =
        proxy::router(hub.proxy_routes()).nest(owners::forward::INTERNAL_PREFIX, internal_proxy);
    // Refusals answer once their request's body is in (bounded): see the module docs.
    api.merge(proxy).layer(axum::middleware::from_fn(
        scale_agent_hub_net::refusals::read_refused_bodies,
    ))
}
