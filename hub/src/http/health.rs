//! The health routes: `/healthz` (the process answers), `/readyz` (the store is open and
//! gRPC listens), `/readyz/store` (the store commits) and `/metrics`.

use std::sync::{Arc, atomic::Ordering};

use axum::{
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::Hub;

/// Ready while the store is open and gRPC listens. A store that cannot commit (a full
/// volume) does not make the hub unready: it still serves every read from memory and keeps
/// the agents' streams (holding their Acks), and taking it out of its Service would stop
/// those reads too. The body says so, and `/readyz/store` fails.
pub(super) async fn readyz(State(hub): State<Arc<Hub>>) -> Response {
    let store = hub.store_open.load(Ordering::SeqCst);
    let grpc = hub.grpc_listening.load(Ordering::SeqCst);
    if store && grpc {
        match store_failure(&hub) {
            None => (StatusCode::OK, "ready\n").into_response(),
            Some(why) => (StatusCode::OK, format!("ready (degraded: {why})\n")).into_response(),
        }
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: store open {store}, gRPC listening {grpc}\n"),
        )
            .into_response()
    }
}

/// Why the store cannot commit, in words for people; `None` while it commits.
fn store_failure(hub: &Hub) -> Option<String> {
    let health = hub.commits.health();
    health.failure.map(|error| match &hub.config.store {
        crate::store::Backend::Embedded => format!(
            "the store cannot commit in data directory {} ({error}); {} changes are queued and \
             retried, agents' acknowledgements are held until they are committed: free space \
             on that volume or grow it",
            hub.config.data_dir.display(),
            health.queued
        ),
        crate::store::Backend::Postgres(_) => format!(
            "the store cannot commit to PostgreSQL ({error}); {} changes are queued and \
             retried, agents' acknowledgements are held until they are committed: check that \
             PostgreSQL is up, reachable and has space",
            health.queued
        ),
    })
}

/// 200 while the store commits, 503 (with the reason) while it cannot: for alerts and
/// probes that must see a full volume.
pub(super) async fn store_ready(State(hub): State<Arc<Hub>>) -> Response {
    match store_failure(&hub) {
        None => (StatusCode::OK, "store commits\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

pub(super) async fn metrics(State(hub): State<Arc<Hub>>) -> Response {
    hub.refresh_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        hub.metrics.encode(),
    )
        .into_response()
}
