//! Issue 16's failover with real parts: a real PostgreSQL, three hub processes on it
//! (`--store postgres`, one `--replica-id` each), two real control planes with their own
//! accounts, and two real agent processes per account reaching "the Service" through a
//! load balancer ([`Balancer`]) that spreads connections over the replicas and sends
//! reconnections to the live ones.
//!
//! While ConfigMaps churn in every account's namespace, the replica owning the most accounts
//! is killed (SIGKILL). Then every account streams again on a live replica within
//! [`STREAMS_AGAIN`]; the agents' ServiceAccounts made no LIST of ConfigMaps since the kill,
//! as each API server's audit log shows; every live replica's cache (its objects API) equals
//! each API server's ConfigMaps by uid and resourceVersion; a tunnelled proxy request sent to
//! each live replica reaches the account's own cluster through its owner, and a proxied LIST
//! is answered from the owner's cache; `kubectl exec -i` and `port-forward` work through a
//! replica that does not own the account; no tenure in `ownership_history` was taken from a
//! replica that still held it. Then PostgreSQL is restarted while the agents stream and the
//! churn goes on: the replicas take their accounts again, the churn made before, during and
//! after the restart reaches the cache, and still no LIST.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, ServiceAccount},
    rbac::v1::PolicyRule,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    churn::Churn,
    fixtures::{self, Scope},
    fleet::{AgentProcess, HubProcess},
    http::Call,
    kubectl::Kubectl,
    kwok,
    pki::CertificateAuthority,
    postgres::{self, PostgresServer, Tenure},
    relay::{Balancer, TlsFront},
    replica_fleet::proxy_token,
};
use serde_json::{Value, json};

/// Replicas of the hub.
const REPLICAS: usize = 3;
/// Accounts of each control plane, each with its own namespace, ServiceAccount and agent.
const ACCOUNTS_PER_CLUSTER: usize = 2;
/// Replicas of each account's agent (as its Deployment would run them): one streams, the
/// others stand by, each connected to the replica the balancer gave it.
const AGENT_REPLICAS: usize = 2;
/// How long an account may take to stream again after its owner died or PostgreSQL
/// restarted.
const STREAMS_AGAIN: Duration = Duration::from_secs(30);
/// How long the caches may take to equal the API servers once the churn stopped.
const CONVERGE: Duration = Duration::from_secs(60);
/// The replicas' shared secret (`--replica-secret-file`).
const SECRET: &str = "0123456789abcdef0123456789abcdef-failover";

/// One account: a namespace of one control plane, streamed by its own agent.
struct Account {
    name: String,
    /// Index of its control plane.
    cluster: usize,
    namespace: String,
    /// The agent's ServiceAccount as the audit log names it.
    user: String,
    /// A proxy token of this account.
    token: String,
    /// Its agent's replicas: one streams, the other stands by.
    agents: Vec<AgentProcess>,
}

/// `(uid, resourceVersion)` by name.
type State = fixtures::UidVersions;

use fixtures::uid_versions as state_of;

async fn api_state(admin: &Client, namespace: &str) -> anyhow::Result<State> {
    let list = Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let items: Vec<Value> = list
        .items
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    Ok(state_of(&items))
}

/// LISTs of ConfigMaps by `user` in the audit log of `control_plane`.
fn configmap_lists(control_plane: &ControlPlane, user: &str) -> anyhow::Result<usize> {
    Ok(control_plane
        .audit_events()?
        .iter()
        .filter(|e| e.verb == "list" && e.user.username == user)
        .filter(|e| e.request_uri.contains("/configmaps"))
        .count())
}

/// The replica named in `account_owners` for each account.
async fn owners(sql: &tokio_postgres::Client) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(sql
        .query("SELECT account, replica FROM account_owners", &[])
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// When each account's latest tenure began.
async fn latest_tenures(
    sql: &tokio_postgres::Client,
) -> anyhow::Result<BTreeMap<String, SystemTime>> {
    Ok(sql
        .query(
            "SELECT account, max(acquired_at) FROM ownership_history GROUP BY account",
            &[],
        )
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// When database sessions died: a replica killed (`Some`), or every one (`None`, PostgreSQL
/// restarted).
type Deaths = [(SystemTime, Option<String>)];

/// No account had two owners at once. Tenures never overlap in `ownership_history`, but that
/// alone proves little: a replica taking an account closes whatever tenure is still open, at
/// the same instant it opens its own. So a tenure closed that way (its end is its
/// successor's start) must be one whose replica had lost its session before: killed, or
/// PostgreSQL restarted, as `deaths` says. Any other change of owner is a release by the
/// owner itself, which ends before the next tenure begins.
fn assert_never_two_owners(history: &BTreeMap<String, Vec<Tenure>>, deaths: &Deaths) {
    for (account, tenures) in history {
        postgres::assert_no_overlap(account, tenures);
        for pair in tenures.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            if before.released != Some(after.acquired) {
                continue;
            }
            let lost_its_session = deaths.iter().any(|(at, replica)| {
                before.acquired < *at
                    && *at <= after.acquired
                    && replica.as_ref().is_none_or(|r| *r == before.replica)
            });
            assert!(
                lost_its_session,
                "{account}: {after:?} took the account from {before:?}, whose replica still \
                 held it (deaths: {deaths:?})"
            );
        }
    }
}

/// Everything the test runs.
struct World {
    dir: PathBuf,
    postgres: PostgresServer,
    control_planes: Vec<ControlPlane>,
    admins: Vec<Client>,
    hubs: Vec<Option<HubProcess>>,
    /// `hub-<i>` for `hubs[i]`.
    names: Vec<String>,
    balancer: Balancer,
    accounts: Vec<Account>,
    passed: bool,
}

impl World {
    /// Churn in every account's namespace, until [`Churn::finish`].
    fn churn(&self, seed: u64) -> Churn {
        Churn::start(
            self.accounts
                .iter()
                .map(|a| (self.admins[a.cluster].clone(), a.namespace.clone())),
            seed,
        )
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // The agents and hubs stop (their own Drop) before the directory goes.
        self.accounts.iter_mut().for_each(|a| a.agents.clear());
        self.hubs.iter_mut().for_each(|h| drop(h.take()));
        if self.passed && std::env::var_os("SCALE_AGENT_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("[failover] kept {}", self.dir.display());
        }
    }
}

impl World {
    fn live(&self) -> impl Iterator<Item = (&str, &HubProcess)> {
        self.names
            .iter()
            .zip(&self.hubs)
            .filter_map(|(name, hub)| hub.as_ref().map(|h| (name.as_str(), h)))
    }

    /// Waits until every account is owned by a live replica whose agent streams it, as
    /// every live replica answers, the accounts of `retaken` in a tenure begun after
    /// `since`; returns how long each took, by account.
    async fn all_streaming(
        &self,
        sql: &tokio_postgres::Client,
        since: Instant,
        retaken: &[String],
    ) -> anyhow::Result<BTreeMap<String, Duration>> {
        let since_wall = SystemTime::now() - since.elapsed();
        let mut streaming = BTreeMap::new();
        let live: Vec<&str> = self.live().map(|(name, _)| name).collect();
        while streaming.len() < self.accounts.len() {
            let owners = owners(sql).await.unwrap_or_default();
            let latest = latest_tenures(sql).await.unwrap_or_default();
            for account in &self.accounts {
                let owned_by_a_live_replica = owners
                    .get(&account.name)
                    .is_some_and(|o| live.contains(&o.as_str()));
                let tenure_is_new = !retaken.contains(&account.name)
                    || latest.get(&account.name).is_some_and(|t| *t >= since_wall);
                if streaming.contains_key(&account.name)
                    || !owned_by_a_live_replica
                    || !tenure_is_new
                {
                    continue;
                }
                let mut everywhere = true;
                for (_, hub) in self.live() {
                    everywhere &= hub
                        .streaming_replica(&account.name)
                        .await
                        .is_ok_and(|r| r.is_some());
                }
                if everywhere {
                    streaming.insert(account.name.clone(), since.elapsed());
                }
            }
            if since.elapsed() > STREAMS_AGAIN {
                let waiting: Vec<_> = self
                    .accounts
                    .iter()
                    .filter(|a| !streaming.contains_key(&a.name))
                    .map(|a| &a.name)
                    .collect();
                panic!(
                    "after {STREAMS_AGAIN:?} {waiting:?} do not stream (owners: {:?})\n{}",
                    owners,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(streaming)
    }

    /// Waits until every live replica's cache of every account equals its API server's
    /// ConfigMaps by uid and resourceVersion; returns how long that took.
    async fn converged(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let mut differences = Vec::new();
            for account in &self.accounts {
                let api = api_state(&self.admins[account.cluster], &account.namespace).await?;
                for (name, hub) in self.live() {
                    match hub
                        .objects(&account.name, "configmaps", &account.namespace)
                        .await
                    {
                        Ok(items) => {
                            let cached = state_of(&items);
                            // Two objects of one name would be one in `cached`.
                            if cached != api || items.len() != cached.len() {
                                differences.push(format!(
                                    "{} on {name}:\n  API server {api:?}\n  hub        {cached:?}",
                                    account.name
                                ));
                            }
                        }
                        Err(e) => differences.push(format!("{} on {name}: {e:#}", account.name)),
                    }
                }
            }
            if differences.is_empty() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > CONVERGE {
                panic!(
                    "after {CONVERGE:?} the hub's caches differ from the API servers:\n{}\n{}",
                    differences.join("\n"),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// LISTs of ConfigMaps each account's agent made, by account.
    fn lists(&self) -> anyhow::Result<BTreeMap<String, usize>> {
        self.accounts
            .iter()
            .map(|a| {
                Ok((
                    a.name.clone(),
                    configmap_lists(&self.control_planes[a.cluster], &a.user)?,
                ))
            })
            .collect()
    }

    /// Through each live replica's proxy, for each account: a tunnelled GET of the agent's
    /// ServiceAccount is the one of the account's own cluster (its uid), answered by the
    /// owner; a LIST of ConfigMaps is answered from the cache and equals the API server's.
    async fn proxy_reaches_the_right_cluster(
        &self,
        sql: &tokio_postgres::Client,
    ) -> anyhow::Result<()> {
        let owners = owners(sql).await?;
        for account in &self.accounts {
            let admin = &self.admins[account.cluster];
            let uid = Api::<ServiceAccount>::namespaced(admin.clone(), &account.namespace)
                .get("agent")
                .await?
                .metadata
                .uid
                .unwrap_or_default();
            for (name, hub) in self.live() {
                let base = format!("http://{}/clusters/{}", hub.http, account.name);
                let path = format!(
                    "/api/v1/namespaces/{}/serviceaccounts/agent",
                    account.namespace
                );
                let response = Call::new("GET", format!("{base}{path}"))
                    .bearer(&account.token)
                    .send()
                    .await?;
                assert_eq!(
                    response.status, 200,
                    "GET {path} of {} through {name}: {}",
                    account.name, response.body
                );
                assert_eq!(
                    response.header("x-scale-agent-cache"),
                    Some("tunnel"),
                    "{response:?}"
                );
                assert_eq!(
                    response.json_or_null()["metadata"]["uid"],
                    uid.as_str(),
                    "{} through {name} reached another cluster: {}",
                    account.name,
                    response.body
                );
                assert_eq!(
                    response.header("x-scale-agent-replica"),
                    owners.get(&account.name).map(String::as_str),
                    "{} through {name}: served by another replica than its owner",
                    account.name
                );

                let path = format!("/api/v1/namespaces/{}/configmaps", account.namespace);
                let response = Call::new("GET", format!("{base}{path}"))
                    .bearer(&account.token)
                    .send()
                    .await?;
                assert_eq!(response.status, 200, "{response:?}");
                assert_eq!(
                    response.header("x-scale-agent-cache"),
                    Some("hit"),
                    "{response:?}"
                );
                let listed = response.json_or_null();
                let items = listed["items"].as_array().cloned().unwrap_or_default();
                assert_eq!(
                    state_of(&items),
                    api_state(admin, &account.namespace).await?,
                    "{}'s proxied LIST through {name}",
                    account.name
                );
            }
        }
        Ok(())
    }

    /// kubectl exec (with stdin) and port-forward into a pod of the first account, through a
    /// live replica that does not own it: the request is forwarded to the owner, an upgraded
    /// connection both ways.
    async fn exec_and_port_forward_through_a_replica_not_owning(
        &self,
        sql: &tokio_postgres::Client,
    ) -> anyhow::Result<()> {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
        let account = &self.accounts[0];
        let owner = owners(sql).await?.remove(&account.name).unwrap_or_default();
        let Some((name, hub)) = self.live().find(|(name, _)| *name != owner) else {
            anyhow::bail!("no live replica but the owner {owner}");
        };
        let control_plane = &self.control_planes[account.cluster];
        kwok::run_logger(&self.admins[account.cluster], &account.namespace, CONVERGE).await?;
        // kubectl sends a token over TLS only; the replica's listener is plaintext.
        let ca = CertificateAuthority::new("failover-front")?;
        let serving = ca.serving("localhost", &[])?;
        let front = TlsFront::start(hub.http, &serving.cert_pem, &serving.key_pem).await?;
        let kubeconfig = self
            .dir
            .join(format!("{}-through-{name}.kubeconfig", account.name));
        std::fs::write(
            &kubeconfig,
            proxy_kubeconfig(
                front.addr(),
                &ca.cert_pem,
                &account.name,
                &account.token,
                &account.namespace,
            ),
        )?;
        let kubectl = Kubectl::new(
            control_plane.binaries().kubectl(),
            self.dir.join("kubectl-home"),
        );
        let args = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let started = Instant::now();
        let exec = kubectl
            .run(
                &kubeconfig,
                &args(&[
                    "exec", "-i", "logger", "-c", "main", "--", "head", "-n", "1",
                ]),
                Some("typed into stdin\n"),
                CONVERGE,
            )
            .await?;
        assert!(
            exec.success(),
            "kubectl exec through {name} (the owner is {owner}): {}",
            exec.messages()
        );
        assert_eq!(exec.stdout, "typed into stdin\n", "through {name}");
        let exec_took = started.elapsed();

        // port-forward: kwok echoes what is sent to a forwarded port.
        let mut forward = tokio::process::Command::new(control_plane.binaries().kubectl())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["port-forward", "pod/logger", ":8080"])
            .env("HOME", self.dir.join("kubectl-home"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = forward
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        // "Forwarding from 127.0.0.1:43211 -> 8080"
        let port: u16 = loop {
            let line = tokio::time::timeout(CONVERGE, lines.next_line())
                .await??
                .ok_or_else(|| anyhow::anyhow!("kubectl port-forward through {name} ended"))?;
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                break rest.split_whitespace().next().unwrap_or("").parse()?;
            }
        };
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"ping through a replica\n").await?;
        let mut echoed = vec![0u8; "ping through a replica\n".len()];
        tokio::time::timeout(CONVERGE, stream.read_exact(&mut echoed)).await??;
        assert_eq!(echoed, b"ping through a replica\n", "through {name}");
        drop(stream);
        let _ = forward.kill().await;

        // The API server saw both from the agent's ServiceAccount.
        let events = control_plane.audit_events()?;
        for sub in ["/exec", "/portforward"] {
            assert!(
                events.iter().any(|e| e.user.username == account.user
                    && e.request_uri.contains(&format!("/pods/logger{sub}"))),
                "no {sub} by {} in the audit log",
                account.user
            );
        }
        eprintln!(
            "[failover] kubectl exec -i ({exec_took:?}) and port-forward of {} through {name}, \
             forwarded to its owner {owner}",
            account.name
        );
        Ok(())
    }

    /// The ends of the hubs' and agents' logs, for a failure message.
    fn logs(&self) -> String {
        let hubs = self
            .live()
            .map(|(name, hub)| format!("{name}:\n{}", hub.log_tail(15)));
        let agents = self.accounts.iter().flat_map(|a| {
            a.agents
                .iter()
                .map(|agent| format!("agent {}:\n{}", agent.replica, agent.log_tail(15)))
        });
        hubs.chain(agents).collect::<Vec<_>>().join("\n")
    }
}

/// What the agents may do: read ConfigMaps (streamed) and ServiceAccounts (proxied), and
/// exec and port-forward into pods.
fn agent_rules() -> Vec<PolicyRule> {
    let mut rules = fixtures::read_rules(&["configmaps", "serviceaccounts", "pods"]);
    rules.push(PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["pods/exec".into(), "pods/portforward".into()]),
        verbs: vec!["create".into(), "get".into()],
        ..Default::default()
    });
    rules
}

/// A kubeconfig for `account`'s proxy at `https://<front>` (trusting `ca_pem`), with
/// `token`.
fn proxy_kubeconfig(
    front: SocketAddr,
    ca_pem: &str,
    account: &str,
    token: &str,
    namespace: &str,
) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "hub", "cluster": {
            "server": format!("https://{front}/clusters/{account}"),
            "certificate-authority-data": fixtures::base64(ca_pem.as_bytes()),
        } }],
        "users": [{ "name": "proxy", "user": { "token": token } }],
        "contexts": [{ "name": "hub", "context": { "cluster": "hub", "user": "proxy", "namespace": namespace } }],
        "current-context": "hub",
    })
    .to_string()
}

async fn start(dir: &Path) -> anyhow::Result<World> {
    let started = Instant::now();
    let (postgres, one, two) = tokio::try_join!(
        async { Ok::<_, anyhow::Error>(PostgresServer::start().await?) },
        // The first runs pods (kwok), for exec and port-forward.
        async {
            let options = ControlPlaneOptions::default().with_audit().with_kwok();
            Ok(ControlPlane::start(options).await?)
        },
        async { Ok(ControlPlane::start(ControlPlaneOptions::default().with_audit()).await?) },
    )?;
    let control_planes = vec![one, two];
    eprintln!(
        "[failover] PostgreSQL and two control planes in {:?}",
        started.elapsed()
    );
    let url_file = dir.join("postgres-url");
    std::fs::write(&url_file, postgres.url())?;
    let secret_file = dir.join("replica-secret");
    std::fs::write(&secret_file, SECRET)?;
    let names: Vec<String> = (0..REPLICAS).map(|i| format!("hub-{i}")).collect();
    let account_names: Vec<(usize, String)> = (0..control_planes.len())
        .flat_map(|c| (0..ACCOUNTS_PER_CLUSTER).map(move |a| (c, format!("c{c}-a{a}"))))
        .collect();

    let mut hubs = Vec::new();
    let mut tokens = BTreeMap::new();
    for name in &names {
        let flags = [
            "--store=postgres".to_string(),
            // The harness\'s PostgreSQL is plaintext on loopback.
            "--postgres-insecure-tls".to_string(),
            format!("--postgres-url-file={}", url_file.display()),
            format!("--replica-id={name}"),
            "--replica-address=http://{http}".to_string(),
            format!("--replica-secret-file={}", secret_file.display()),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let hub = HubProcess::start(&dir.join(name), &flags).await?;
        if tokens.is_empty() {
            // Proxy tokens are read from the store at start-up only (the guide's docs/src/concepts/replicas.md): issue
            // them on the first replica before the others start.
            for (_, account) in &account_names {
                tokens.insert(
                    account.clone(),
                    proxy_token(&hub, account, "failover").await?,
                );
            }
        }
        hubs.push(Some(hub));
    }
    let balancer = Balancer::start(hubs.iter().flatten().map(|h| h.grpc).collect()).await?;

    let mut admins = Vec::new();
    for control_plane in &control_planes {
        admins.push(control_plane.client().await?);
    }
    let mut accounts = Vec::new();
    for (cluster, name) in account_names {
        let (control_plane, admin) = (&control_planes[cluster], &admins[cluster]);
        let namespace = control_plane.namespace(admin, &name).await?;
        let kubeconfig = fixtures::service_account_identity(
            control_plane,
            admin,
            &namespace,
            "agent",
            Scope::Namespace,
            agent_rules(),
            dir.join(format!("{name}.kubeconfig")),
        )
        .await?;
        for i in 0..3 {
            let object: ConfigMap = serde_json::from_value(json!({
                "metadata": { "name": format!("cm-{i}") },
                "data": { "v": "0" },
            }))?;
            Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
                .create(&PostParams::default(), &object)
                .await?;
        }
        let config = dir.join(format!("{name}.yaml"));
        fixtures::write_plaintext_agent_config(
            &config,
            balancer.addr(),
            json!([fixtures::account(
                &name,
                &kubeconfig,
                &namespace,
                &["ConfigMap"]
            )]),
            1,
        )?;
        let mut agents = Vec::new();
        for replica in 0..AGENT_REPLICAS {
            agents.push(AgentProcess::start(dir, &config, &format!("{name}-r{replica}")).await?);
        }
        accounts.push(Account {
            token: tokens.remove(&name).unwrap_or_default(),
            user: format!("system:serviceaccount:{namespace}:agent"),
            name,
            cluster,
            namespace,
            agents,
        });
    }
    Ok(World {
        dir: dir.to_path_buf(),
        postgres,
        control_planes,
        admins,
        hubs,
        names,
        balancer,
        accounts,
        passed: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_and_postgres_restarted_under_churn_lose_nothing_and_relist_nothing()
-> anyhow::Result<()> {
    let began = Instant::now();
    let dir = fixtures::temp_dir("scale-agent-failover")?;
    let mut world = start(&dir).await?;
    let sql = postgres::connect(&world.postgres.superuser_url()).await?;
    let first = world.all_streaming(&sql, began, &[]).await?;
    let synced = world.converged().await?;
    eprintln!(
        "[failover] {} accounts streaming ({first:?}), caches equal in {synced:?}; set up in {:?}",
        world.accounts.len(),
        began.elapsed()
    );

    // The accounts are spread over the replicas.
    let before = owners(&sql).await?;
    let mut owned: BTreeMap<&str, usize> = BTreeMap::new();
    for owner in before.values() {
        *owned.entry(owner.as_str()).or_default() += 1;
    }
    assert!(
        owned.len() >= 2,
        "the balancer spread the agents over one replica only: {before:?}"
    );
    let spread: Vec<String> = world
        .live()
        .map(|(name, hub)| format!("{name}: {}", world.balancer.relayed_to(hub.grpc)))
        .collect();
    eprintln!("[failover] owners {before:?}; connections {spread:?}");
    assert_never_two_owners(&postgres::ownership_history(&sql).await?, &[]);
    let lists_before = world.lists()?;
    for (account, lists) in &lists_before {
        assert_eq!(*lists, 1, "{account}: one LIST for its first snapshot");
    }

    // Kill the replica owning the most accounts (SIGKILL) while every namespace churns.
    let (victim, orphans) = owned
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(name, n)| (name.to_string(), *n))
        .unwrap_or_default();
    let victim_index = world.names.iter().position(|n| *n == victim).unwrap_or(0);
    let churn = world.churn(16);
    tokio::time::sleep(Duration::from_secs(1)).await;
    if let Some(hub) = world.hubs[victim_index].as_mut() {
        hub.kill();
    }
    world.hubs[victim_index] = None;
    let killed = Instant::now();
    let mut deaths = vec![(SystemTime::now(), Some(victim.clone()))];
    let orphaned: Vec<String> = before
        .iter()
        .filter(|(_, owner)| **owner == victim)
        .map(|(account, _)| account.clone())
        .collect();
    let again = world.all_streaming(&sql, killed, &orphaned).await?;
    let slowest = again.values().max().copied().unwrap_or_default();
    eprintln!(
        "[failover] {victim} (owner of {orphans} accounts) killed; every account streams \
         again within {slowest:?}: {again:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let changes = churn.finish().await?;
    let caught_up = world.converged().await?;
    eprintln!(
        "[failover] {changes} changes during the failover; caches equal {caught_up:?} after the churn stopped"
    );
    let after = owners(&sql).await?;
    assert!(
        after.values().all(|o| *o != victim),
        "an account is still owned by the dead replica: {after:?}"
    );
    assert_eq!(
        world.lists()?,
        lists_before,
        "the agents LISTed again after {victim} was killed"
    );
    world.proxy_reaches_the_right_cluster(&sql).await?;
    world
        .exec_and_port_forward_through_a_replica_not_owning(&sql)
        .await?;
    assert_never_two_owners(&postgres::ownership_history(&sql).await?, &deaths);

    // PostgreSQL restarts while the agents stream and the churn goes on.
    let churn = world.churn(61);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let restarting = Instant::now();
    deaths.push((SystemTime::now(), None));
    world.postgres.restart().await?;
    let restarted = restarting.elapsed();
    let sql = postgres::connect(&world.postgres.superuser_url()).await?;
    let every: Vec<String> = world.accounts.iter().map(|a| a.name.clone()).collect();
    let again = world.all_streaming(&sql, restarting, &every).await?;
    let slowest = again.values().max().copied().unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let changes = churn.finish().await?;
    let caught_up = world.converged().await?;
    eprintln!(
        "[failover] PostgreSQL restarted in {restarted:?}; every account streams again within \
         {slowest:?} of the restart: {again:?}; {changes} changes; caches equal {caught_up:?} \
         after the churn stopped"
    );
    assert_eq!(
        world.lists()?,
        lists_before,
        "the agents LISTed again after PostgreSQL restarted"
    );
    world.proxy_reaches_the_right_cluster(&sql).await?;
    let history = postgres::ownership_history(&sql).await?;
    assert_never_two_owners(&history, &deaths);
    for account in &world.accounts {
        let tenures = history.get(&account.name).map_or(0, Vec::len);
        assert!(
            tenures >= 2,
            "{}: PostgreSQL's restart should have ended its tenure: {history:?}",
            account.name
        );
    }
    eprintln!("[failover] passed in {:?}", began.elapsed());
    world.passed = true;
    Ok(())
}
