//! Hub replicas on a real PostgreSQL with real agents, for the tests that break parts of
//! them (issue 29): a PostgreSQL server, hub processes on it (`--store postgres`, one
//! `--replica-id` each, `hub-<i>`), a real control plane with an audit log, and real agent
//! processes per account reaching "the Service" through a load balancer ([`Balancer`]) in
//! front of one [`Relay`] per replica. A test turns a replica's relay into a silent
//! partition from its agents ([`Relay::blackhole`]); with
//! [`FleetOptions::postgres_relays`] each replica also reaches PostgreSQL through a relay of
//! its own, for a partition between one replica and the store.
//!
//! And the checks those tests share after a fault: every account streaming again
//! ([`ReplicaFleet::all_streaming`]), every replica's cache equal to the API server
//! ([`ReplicaFleet::converged`]), the agents' LISTs in the audit log
//! ([`ReplicaFleet::lists`]: a relist shows), and an ownership history without overlap
//! ([`history_without_overlap`]).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, PostParams},
};
use serde_json::{Value, json};

use crate::{
    ControlPlane, ControlPlaneOptions,
    churn::ChurnKind,
    fixtures::{self, Scope},
    fleet::{AgentProcess, HubProcess},
    http::Call,
    postgres::{self, PostgresServer, Tenure},
    relay::{Balancer, Relay},
};

/// The replicas' shared secret (`--replica-secret-file`).
const SECRET: &str = "0123456789abcdef0123456789abcdef-replica-fleet";

/// What a [`ReplicaFleet`] runs.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Names the logs' lines (`[<label>]`) and the kubeconfig tokens issued.
    pub label: &'static str,
    /// Hub replicas.
    pub replicas: usize,
    /// Accounts, each with its own namespace, ServiceAccount and agent.
    pub accounts: Vec<String>,
    /// Replicas of each account's agent: one streams, the others stand by.
    pub agent_replicas: usize,
    /// The kinds the agents stream (and a churn changes).
    pub kinds: Vec<ChurnKind>,
    /// `--heartbeat-period` of the hubs, the period the agents ask for; `None`: the e2e
    /// hubs' 1 s.
    pub heartbeat: Option<Duration>,
    /// ConfigMaps (`cm-0`..) created in each namespace before the agents start.
    pub config_maps: usize,
    /// Each replica reaches PostgreSQL through its own relay ([`ReplicaFleet::postgres_relays`]).
    pub postgres_relays: bool,
    /// How long the caches may take to equal the API server.
    pub converge: Duration,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            label: "replicas",
            replicas: 2,
            accounts: vec!["p0".into(), "p1".into()],
            agent_replicas: 2,
            kinds: vec![ChurnKind::config_maps()],
            heartbeat: None,
            config_maps: 3,
            postgres_relays: false,
            converge: Duration::from_secs(60),
        }
    }
}

/// One account: a namespace streamed by its own agents.
pub struct Account {
    pub name: String,
    pub namespace: String,
    /// The agent's ServiceAccount as the audit log names it.
    pub user: String,
    /// A proxy token of this account.
    pub token: String,
    pub agents: Vec<AgentProcess>,
}

/// Everything a test runs. Its directory is removed when dropped with `passed` set (unless
/// `SCALE_AGENT_E2E_KEEP` is), kept and printed otherwise.
pub struct ReplicaFleet {
    pub options: FleetOptions,
    pub dir: PathBuf,
    pub postgres: PostgresServer,
    pub control_plane: ControlPlane,
    pub admin: Client,
    pub hubs: Vec<HubProcess>,
    /// `hub-<i>` for `hubs[i]`.
    pub names: Vec<String>,
    /// `relays[i]` relays to `hubs[i]`'s gRPC port; the balancer spreads over them.
    pub relays: Vec<Relay>,
    /// `postgres_relays[i]` relays `hubs[i]`'s connections to PostgreSQL (empty unless
    /// [`FleetOptions::postgres_relays`]).
    pub postgres_relays: Vec<Relay>,
    pub balancer: Balancer,
    pub accounts: Vec<Account>,
    pub passed: bool,
}

impl Drop for ReplicaFleet {
    fn drop(&mut self) {
        self.accounts.iter_mut().for_each(|a| a.agents.clear());
        self.hubs.clear();
        if self.passed && std::env::var_os("SCALE_AGENT_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("[{}] kept {}", self.options.label, self.dir.display());
        }
    }
}

/// Issues a kubeconfig of `account` on `hub` with its admin token; returns its token.
pub async fn proxy_token(hub: &HubProcess, account: &str, name: &str) -> anyhow::Result<String> {
    let admin = std::fs::read_to_string(hub.data_dir.join("admin-token"))?;
    let response = Call::new(
        "POST",
        format!(
            "http://{}/api/v1/accounts/{account}/kubeconfig?tokenName={name}",
            hub.http
        ),
    )
    .bearer(admin.trim())
    .send()
    .await?;
    anyhow::ensure!(response.status == 200, "{response:?}");
    response
        .body
        .lines()
        .find_map(|line| line.trim().strip_prefix("token:"))
        .map(|token| token.trim().trim_matches('"').to_string())
        .ok_or_else(|| anyhow::anyhow!("no token in {}", response.body))
}

impl ReplicaFleet {
    /// Starts everything in `dir` and waits until each agent process runs (not until the
    /// accounts stream: [`Self::all_streaming`]).
    pub async fn start(dir: &Path, options: FleetOptions) -> anyhow::Result<ReplicaFleet> {
        let (postgres, control_plane) = tokio::try_join!(
            async { Ok::<_, anyhow::Error>(PostgresServer::start().await?) },
            async { Ok(ControlPlane::start(ControlPlaneOptions::default().with_audit()).await?) },
        )?;
        let secret_file = dir.join("replica-secret");
        std::fs::write(&secret_file, SECRET)?;
        let names: Vec<String> = (0..options.replicas).map(|i| format!("hub-{i}")).collect();
        let direct = format!("127.0.0.1:{}", postgres.port());
        let mut postgres_relays = Vec::new();
        let mut hubs = Vec::new();
        let mut tokens = BTreeMap::new();
        for name in &names {
            let url = if options.postgres_relays {
                let relay = Relay::start(direct.parse()?).await?;
                let url = postgres.url().replace(&direct, &relay.addr().to_string());
                postgres_relays.push(relay);
                url
            } else {
                postgres.url()
            };
            let url_file = dir.join(format!("postgres-url-{name}"));
            std::fs::write(&url_file, url)?;
            let mut flags = vec![
                "--store=postgres".to_string(),
                // The harness's PostgreSQL is plaintext on loopback.
                "--postgres-insecure-tls".to_string(),
                format!("--postgres-url-file={}", url_file.display()),
                format!("--replica-id={name}"),
                "--replica-address=http://{http}".to_string(),
                format!("--replica-secret-file={}", secret_file.display()),
            ];
            if let Some(heartbeat) = options.heartbeat {
                flags.push(format!("--heartbeat-period={}s", heartbeat.as_secs()));
            }
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let hub = HubProcess::start(&dir.join(name), &flags).await?;
            if tokens.is_empty() {
                // Proxy tokens are read from the store at start-up only: issue them on the
                // first replica before the others start.
                for account in &options.accounts {
                    tokens.insert(
                        account.clone(),
                        proxy_token(&hub, account, options.label).await?,
                    );
                }
            }
            hubs.push(hub);
        }
        let mut relays = Vec::new();
        for hub in &hubs {
            relays.push(Relay::start(hub.grpc).await?);
        }
        let balancer = Balancer::start(relays.iter().map(Relay::addr).collect()).await?;
        let admin = control_plane.client().await?;
        let plurals: Vec<&str> = options
            .kinds
            .iter()
            .map(|k| k.resource.plural.as_str())
            .collect();
        let kinds: Vec<&str> = options
            .kinds
            .iter()
            .map(|k| k.resource.kind.as_str())
            .collect();
        let heartbeat = options.heartbeat.map_or(1, |h| h.as_secs());
        let mut accounts = Vec::new();
        for name in &options.accounts {
            let namespace = control_plane.namespace(&admin, name).await?;
            let kubeconfig = fixtures::service_account_identity(
                &control_plane,
                &admin,
                &namespace,
                "agent",
                Scope::Namespace,
                fixtures::read_rules(&plurals),
                dir.join(format!("{name}.kubeconfig")),
            )
            .await?;
            let config_maps = Api::<DynamicObject>::namespaced_with(
                admin.clone(),
                &namespace,
                &ChurnKind::config_maps().resource,
            );
            for i in 0..options.config_maps {
                let object: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": { "name": format!("cm-{i}") },
                    "data": { "v": "0" },
                }))?;
                config_maps.create(&PostParams::default(), &object).await?;
            }
            let config = dir.join(format!("{name}.yaml"));
            fixtures::write_plaintext_agent_config(
                &config,
                balancer.addr(),
                json!([fixtures::account(name, &kubeconfig, &namespace, &kinds)]),
                u32::try_from(heartbeat)?,
            )?;
            let mut agents = Vec::new();
            for replica in 0..options.agent_replicas {
                agents
                    .push(AgentProcess::start(dir, &config, &format!("{name}-r{replica}")).await?);
            }
            accounts.push(Account {
                token: tokens.remove(name).unwrap_or_default(),
                user: format!("system:serviceaccount:{namespace}:agent"),
                name: name.clone(),
                namespace,
                agents,
            });
        }
        Ok(ReplicaFleet {
            options,
            dir: dir.to_path_buf(),
            postgres,
            control_plane,
            admin,
            hubs,
            names,
            relays,
            postgres_relays,
            balancer,
            accounts,
            passed: false,
        })
    }

    /// The index of replica `replica` (`hub-<i>`) in [`Self::hubs`].
    pub fn index(&self, replica: &str) -> usize {
        self.names.iter().position(|n| n == replica).unwrap_or(0)
    }

    /// A superuser session on the fleet's PostgreSQL (not through any relay).
    pub async fn sql(&self) -> anyhow::Result<tokio_postgres::Client> {
        Ok(postgres::connect(&self.postgres.superuser_url()).await?)
    }

    /// Waits until every account is owned by a replica `allowed` accepts and streams, as
    /// every replica in `asked` answers (all of them when `None`); how long each took since
    /// `since`, by account. Fails after `limit`.
    pub async fn all_streaming(
        &self,
        sql: &tokio_postgres::Client,
        since: Instant,
        limit: Duration,
        asked: Option<&[usize]>,
        allowed: impl Fn(&str, &str) -> bool,
    ) -> anyhow::Result<BTreeMap<String, Duration>> {
        let all: Vec<usize> = (0..self.hubs.len()).collect();
        let asked = asked.unwrap_or(all.as_slice());
        let mut streaming = BTreeMap::new();
        loop {
            let owners = owners(sql).await.unwrap_or_default();
            for account in &self.accounts {
                let owner_ok = owners
                    .get(&account.name)
                    .is_some_and(|owner| allowed(&account.name, owner));
                if streaming.contains_key(&account.name) || !owner_ok {
                    continue;
                }
                let mut everywhere = true;
                for hub in asked.iter().map(|i| &self.hubs[*i]) {
                    everywhere &= hub
                        .streaming_replica(&account.name)
                        .await
                        .is_ok_and(|r| r.is_some());
                }
                if everywhere {
                    streaming.insert(account.name.clone(), since.elapsed());
                }
            }
            if streaming.len() == self.accounts.len() {
                return Ok(streaming);
            }
            anyhow::ensure!(
                since.elapsed() <= limit,
                "after {limit:?} only {streaming:?} stream (owners: {owners:?})\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every replica's cache of every account equals the API server's objects
    /// of each kind by uid and resourceVersion; returns how long that took. Fails after
    /// [`FleetOptions::converge`] with the differences.
    pub async fn converged(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let differences = self.differences().await?;
            if differences.is_empty() {
                return Ok(started.elapsed());
            }
            let limit = self.options.converge;
            anyhow::ensure!(
                started.elapsed() <= limit,
                "after {limit:?} the hub's caches differ from the API server:\n{}\n{}",
                differences.join("\n"),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Where a replica's cache differs from the API server now, one line each.
    async fn differences(&self) -> anyhow::Result<Vec<String>> {
        let mut differences = Vec::new();
        for account in &self.accounts {
            for kind in &self.options.kinds {
                let plural = &kind.resource.plural;
                let api = api_state(&self.admin, &account.namespace, kind).await;
                let api = match api {
                    Ok(api) => api,
                    Err(e) => {
                        differences.push(format!("{} {plural}: API server: {e:#}", account.name));
                        continue;
                    }
                };
                for (name, hub) in self.names.iter().zip(&self.hubs) {
                    match hub.objects(&account.name, plural, &account.namespace).await {
                        Ok(items) => {
                            let cached = fixtures::uid_versions(&items);
                            if let Some(d) = difference(&api, &cached) {
                                differences
                                    .push(format!("{} {plural} on {name}: {d}", account.name));
                            } else if items.len() != cached.len() {
                                differences.push(format!(
                                    "{} {plural} on {name}: {} objects for {} names",
                                    account.name,
                                    items.len(),
                                    cached.len()
                                ));
                            }
                        }
                        Err(e) => {
                            differences.push(format!("{} {plural} on {name}: {e:#}", account.name))
                        }
                    }
                }
            }
        }
        Ok(differences)
    }

    /// LISTs of the streamed kinds each account's agents made for their watches, by account
    /// (the audit log). Proxied reads (the path alone: a watch pages its LIST) are not
    /// counted: one the cache could not answer (the account between two owners) goes to the
    /// cluster through the agent.
    pub fn lists(&self) -> anyhow::Result<BTreeMap<String, usize>> {
        let events = self.control_plane.audit_events()?;
        Ok(self
            .accounts
            .iter()
            .map(|a| {
                let lists = events
                    .iter()
                    .filter(|e| e.verb == "list" && e.user.username == a.user)
                    .filter(|e| {
                        self.options.kinds.iter().any(|k| {
                            let plural = &k.resource.plural;
                            let proxied = format!("/api/v1/namespaces/{}/{plural}", a.namespace);
                            e.request_uri.contains(&format!("/{plural}"))
                                && e.request_uri != proxied
                        })
                    })
                    .count();
                (a.name.clone(), lists)
            })
            .collect())
    }

    /// `(client, namespace)` of every account, for a [`crate::churn::Churn`].
    pub fn namespaces(&self) -> Vec<(Client, String)> {
        self.accounts
            .iter()
            .map(|a| (self.admin.clone(), a.namespace.clone()))
            .collect()
    }

    /// The ends of the hubs' and agents' logs, for a failure message.
    pub fn logs(&self) -> String {
        let hubs = self
            .names
            .iter()
            .zip(&self.hubs)
            .map(|(name, hub)| format!("{name}:\n{}", hub.log_tail(15)));
        let agents = self.accounts.iter().flat_map(|a| {
            a.agents
                .iter()
                .map(|agent| format!("agent {}:\n{}", agent.replica, agent.log_tail(15)))
        });
        hubs.chain(agents).collect::<Vec<_>>().join("\n")
    }
}

/// Lost, ghosted and stale objects of a hub's cache against the API server, or `None` when
/// equal.
pub fn difference(api: &fixtures::UidVersions, hub: &fixtures::UidVersions) -> Option<String> {
    let lost: Vec<_> = api.keys().filter(|n| !hub.contains_key(*n)).collect();
    let ghosts: Vec<_> = hub.keys().filter(|n| !api.contains_key(*n)).collect();
    let stale: Vec<_> = api
        .iter()
        .filter_map(|(n, a)| hub.get(n).filter(|h| *h != a).map(|h| (n, a, h)))
        .collect();
    if lost.is_empty() && ghosts.is_empty() && stale.is_empty() {
        return None;
    }
    Some(format!(
        "lost (in the API server, not in the hub): {lost:?}; ghosts (in the hub, not in the \
         API server): {ghosts:?}; stale (name, API server's (uid, rv), hub's): {stale:?}"
    ))
}

/// `kind`'s objects in `namespace` as the API server has them.
pub async fn api_state(
    admin: &Client,
    namespace: &str,
    kind: &ChurnKind,
) -> anyhow::Result<fixtures::UidVersions> {
    let list = Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, &kind.resource)
        .list(&ListParams::default())
        .await?;
    let items: Vec<Value> = list
        .items
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    Ok(fixtures::uid_versions(&items))
}

/// The replica named in `account_owners` for each account.
pub async fn owners(sql: &tokio_postgres::Client) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(sql
        .query("SELECT account, replica FROM account_owners", &[])
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// `ownership_history`, after checking that no account's tenures overlap (panics, as
/// [`postgres::assert_no_overlap`], when two replicas owned one at once).
pub async fn history_without_overlap(
    sql: &tokio_postgres::Client,
) -> anyhow::Result<BTreeMap<String, Vec<Tenure>>> {
    let history = postgres::ownership_history(sql).await?;
    for (account, tenures) in &history {
        postgres::assert_no_overlap(account, tenures);
    }
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_lost_ghosted_and_stale_objects() {
        let state = |items: &[(&str, &str, &str)]| -> fixtures::UidVersions {
            items
                .iter()
                .map(|(n, u, r)| (n.to_string(), (u.to_string(), r.to_string())))
                .collect()
        };
        let api = state(&[("a", "u1", "5"), ("b", "u2", "6"), ("c", "u3", "7")]);
        assert_eq!(difference(&api, &api.clone()), None);
        let hub = state(&[("a", "u1", "5"), ("c", "u9", "7"), ("d", "u4", "8")]);
        let d = difference(&api, &hub).expect("they differ");
        assert!(
            d.contains(r#"lost (in the API server, not in the hub): ["b"]"#),
            "{d}"
        );
        assert!(
            d.contains(r#"ghosts (in the hub, not in the API server): ["d"]"#),
            "{d}"
        );
        assert!(d.contains(r#""c""#) && d.contains("u9"), "{d}");
    }
}
