//! A hub replica in the test's own process on a shared PostgreSQL (`--store postgres`
//! with PostgreSQL ownership), for the tests that speak the protocol to several replicas
//! themselves: plaintext gRPC on a free port, HTTP on a free port it gives the other
//! replicas as its address, the replicas' shared secret. What differs between those tests
//! (the agents' allow rules, heartbeats, the sync period) is set on the [`config`] before
//! [`start`].

use std::path::{Path, PathBuf};

use scale_agent_hub::{
    Config, GrpcSecurity, RunningHub,
    owners::{OwnershipSource, forward::ReplicaSecret},
    store::{Backend, PostgresOptions},
};

use crate::http::Call;

/// A replica started by [`start`].
pub struct InProcessReplica {
    pub hub: RunningHub,
    /// Its data directory.
    pub dir: PathBuf,
    /// Its admin token.
    pub admin: String,
}

/// The configuration of replica `name` (`--replica-id`), its data in `dir`, on the
/// PostgreSQL at `url`, sharing `secret` with the other replicas.
pub fn config(url: &str, name: &str, dir: &Path, secret: &str) -> anyhow::Result<Config> {
    let port = crate::local_agent::free_port()?;
    let mut config = Config::new(GrpcSecurity::InsecurePlaintext, dir);
    config.listeners.grpc_addr = "127.0.0.1:0".parse()?;
    config.listeners.http_addr = format!("127.0.0.1:{port}").parse()?;
    config.replicas.id = name.into();
    config.replicas.address = Some(format!("http://127.0.0.1:{port}"));
    config.replicas.secret = Some(ReplicaSecret::new(secret)?);
    let options = PostgresOptions::new(url);
    config.replicas.ownership = OwnershipSource::Postgres {
        options: options.clone(),
    };
    config.store.backend = Backend::Postgres(options);
    Ok(config)
}

/// Starts the hub `config` describes and reads its admin token.
pub async fn start(config: Config) -> anyhow::Result<InProcessReplica> {
    let dir = config.store.data_dir.clone();
    let hub = scale_agent_hub::start(config).await?;
    let token_file = hub
        .admin_token_file()
        .ok_or_else(|| anyhow::anyhow!("the hub wrote no admin token"))?;
    let admin = std::fs::read_to_string(token_file)?.trim().to_string();
    Ok(InProcessReplica { hub, dir, admin })
}

impl InProcessReplica {
    /// `method path` on its HTTP API with its admin token: the status and the body.
    pub async fn admin_call(&self, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
        let response = Call::new(method, format!("http://{}{path}", self.hub.http_addr))
            .bearer(&self.admin)
            .send()
            .await?;
        Ok((response.status, response.body))
    }

    /// Stops the hub and removes its data directory.
    pub async fn stop(self) {
        let _ = self.hub.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
