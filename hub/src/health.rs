//! The hub's answers to the API's health routes ([`http::Health`]): the readiness flags the
//! listeners set, the commit writer's health with where the store is, and the metrics
//! registry with its gauges refreshed from the live state.

use std::sync::atomic::Ordering;

use crate::{Hub, http, store::Backend};

impl http::Health for Hub {
    fn readiness(&self) -> http::Readiness {
        http::Readiness {
            store_open: self.store_open.load(Ordering::SeqCst),
            grpc_listening: self.grpc_listening.load(Ordering::SeqCst),
        }
    }

    fn store_failure(&self) -> Option<String> {
        let health = self.commits.health();
        health
            .failure
            .map(|error| match &self.config.store.backend {
                Backend::Embedded => format!(
                    "the store cannot commit in data directory {} ({error}); {} changes are queued \
                 and retried, agents' acknowledgements are held until they are committed: free \
                 space on that volume or grow it",
                    self.config.store.data_dir.display(),
                    health.queued
                ),
                Backend::Postgres(_)
                    if health.failing
                        == Some(scale_agent_hub_store::writer::Failing::Ownership) =>
                {
                    format!(
                        "the accounts' ownership cannot reach PostgreSQL ({error}); no replica can \
                 take the accounts, so their agents stand by: check that PostgreSQL is up and \
                 reachable from this replica"
                    )
                }
                Backend::Postgres(_) => format!(
                    "the store cannot commit to PostgreSQL ({error}); {} changes are queued and \
                 retried, agents' acknowledgements are held until they are committed: check \
                 that PostgreSQL is up, reachable and has space",
                    health.queued
                ),
            })
    }

    fn metrics(&self) -> String {
        self.refresh_gauges();
        self.metrics.encode()
    }
}
