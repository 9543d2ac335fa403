//! The agent's status writer on the real control plane (issue 12, item 1), with real agent
//! processes authenticated as a ServiceAccount that may only patch the status of its
//! ScaleAgent and AgentAccount:
//! - an agent that never reaches its hub writes `Connected=False` `HubUnreachable` with its
//!   last connection error into both, so a wrong hub address shows in `kubectl get` instead
//!   of an empty column;
//! - a replica that lost the hub writes `status.hub.state` `Unknown` with why, not the hub's
//!   last verdict beside `Connected=False`;
//! - a replica the hub demotes (the streaming one loses the hub for a few seconds, the hub
//!   promotes the other) writes `Connected=True` `Standby`, and the promoted replica's
//!   `Streaming` is the account's verdict again within the writer's resync.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1::PolicyRule};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, Patch, PatchParams},
    core::{ApiResource, GroupVersionKind},
};
use scale_agent_e2e::{
    ControlPlane, crds,
    fixtures::{self, Scope},
    local_agent,
    process::{self, ManagedProcess},
    relay::Relay,
    wait::{wait_for, wait_for_within},
};
use serde_json::{Value, json};

const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
/// The status writer's resync (30 s, `status_writer::RESYNC`) and some ticks to spare.
const RESYNC_WAIT: Duration = Duration::from_secs(60);

/// As the operator's Role has it: patch on the status subresources of ScaleAgent `prod` and
/// AgentAccount `one`, nothing else.
fn status_rules() -> Vec<PolicyRule> {
    [
        ("scaleagents/status", "prod"),
        ("agentaccounts/status", "one"),
    ]
    .map(|(resource, name)| PolicyRule {
        api_groups: Some(vec!["scaleagent.dev".into()]),
        resources: Some(vec![resource.into()]),
        resource_names: Some(vec![name.into()]),
        verbs: vec!["patch".into()],
        ..Default::default()
    })
    .into()
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scaleagent.dev", "v1alpha1", kind),
        plural,
    )
}

async fn apply(client: &Client, ns: &str, api: &ApiResource, object: Value) -> anyhow::Result<()> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, api)
        .patch(
            &name,
            &PatchParams::apply(crds::FIELD_MANAGER),
            &Patch::Apply(&object),
        )
        .await?;
    Ok(())
}

/// One `Connected` condition as written: (status, reason, message).
type Verdict = (String, String, String);

/// The `Connected` condition in an object's `status`, if written.
fn verdict(status: &Value) -> Option<Verdict> {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Connected")
        .map(|c| {
            let field = |f: &str| c[f].as_str().unwrap_or_default().to_string();
            (field("status"), field("reason"), field("message"))
        })
}

/// The `Connected` condition of `name`, if written, and its whole status.
async fn connected(
    client: &Client,
    ns: &str,
    api: &ApiResource,
    name: &str,
) -> anyhow::Result<(Option<Verdict>, Value)> {
    let object = Api::<DynamicObject>::namespaced_with(client.clone(), ns, api)
        .get(name)
        .await?;
    let status = object.data["status"].clone();
    Ok((verdict(&status), status))
}

async fn wait_unreachable(
    client: &Client,
    ns: &str,
    api: &ApiResource,
    name: &str,
    log: &Path,
) -> anyhow::Result<(String, Value)> {
    wait_for(
        &format!("{name} to become Connected=False/HubUnreachable"),
        || async {
            let (condition, status) = connected(client, ns, api, name).await?;
            Ok(condition
                .filter(|(state, reason, _)| state == "False" && reason == "HubUnreachable")
                .map(|(_, _, message)| (message, status)))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", process::tail(log, 30)))
}

/// A namespace holding ScaleAgent `prod` and its AgentAccount `one`, and a kubeconfig of
/// ServiceAccount `agent` there, bound to `rules`.
struct Setup {
    admin: Client,
    ns: String,
    dir: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    scale_agents: ApiResource,
    agent_accounts: ApiResource,
}

impl Setup {
    async fn new(prefix: &str, rules: Vec<PolicyRule>) -> anyhow::Result<Setup> {
        let control_plane = ControlPlane::shared()?;
        let admin = control_plane.client().await?;
        crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
        let ns = control_plane.namespace(&admin, prefix).await?;
        let dir = fixtures::temp_dir(prefix)?;
        let scale_agents = resource("ScaleAgent", "scaleagents");
        let agent_accounts = resource("AgentAccount", "agentaccounts");
        let objects = [
            (
                &scale_agents,
                json!({
                    "apiVersion": "scaleagent.dev/v1alpha1", "kind": "ScaleAgent",
                    "metadata": { "name": "prod" },
                    "spec": {
                        "hub": { "address": "hub.spinnaker.example.com:9091" },
                        "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
                    },
                }),
            ),
            (
                &agent_accounts,
                json!({
                    "apiVersion": "scaleagent.dev/v1alpha1", "kind": "AgentAccount",
                    "metadata": { "name": "one" },
                    "spec": { "agentRef": "prod" },
                }),
            ),
        ];
        for (api, object) in objects {
            apply(&admin, &ns, api, object).await?;
        }
        let kubeconfig = fixtures::service_account_identity(
            control_plane,
            &admin,
            &ns,
            "agent",
            Scope::Namespace,
            rules,
            dir.join("agent-kubeconfig"),
        )
        .await?;
        Ok(Setup {
            admin,
            ns,
            dir,
            kubeconfig,
            scale_agents,
            agent_accounts,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_reaches_the_hub_says_so_in_the_status() -> anyhow::Result<()> {
    let s = Setup::new("never-connected", status_rules()).await?;

    // A hub address where nothing listens: every connection is refused.
    let port = scale_agent_e2e::local_agent::free_port()?;
    let hub = format!("127.0.0.1:{port}");
    let config = s.dir.join("agent.yaml");
    std::fs::write(
        &config,
        serde_json::to_string_pretty(&json!({
            "clouddriver": {
                "grpc": hub,
                "insecure": true,
                "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
            },
            "kubernetes": { "accounts": [{
                "name": format!("one-{}", s.ns),
                "kubeconfigFile": s.kubeconfig.display().to_string(),
                "agentAccount": "one",
            }] },
            "status": { "namespace": s.ns, "scaleAgent": "prod" },
        }))?,
    )?;
    let admin_port = scale_agent_e2e::local_agent::free_port()?;
    let mut command = std::process::Command::new(AGENT);
    command
        .arg(format!("--config={}", config.display()))
        .arg("--replica=never-0")
        .arg(format!("--admin-addr=127.0.0.1:{admin_port}"))
        .env("KUBECONFIG", &s.kubeconfig)
        .env("RUST_LOG", "info");
    let log = s.dir.join("agent.log");
    let mut agent = ManagedProcess::spawn_command("e2e-agent", command, log.clone())?;

    let (message, status) =
        wait_unreachable(&s.admin, &s.ns, &s.agent_accounts, "one", &log).await?;
    assert!(
        message.contains("never-0")
            && message.contains("has not reached the hub")
            && message.contains(&hub),
        "{message}"
    );
    assert!(status["hub"]["replica"] == "never-0", "{status}");
    let (message, status) =
        wait_unreachable(&s.admin, &s.ns, &s.scale_agents, "prod", &log).await?;
    assert!(
        message.contains("has not reached the hub") && message.contains(&hub),
        "{message}"
    );
    assert_eq!(status["connected"], 0, "{status}");

    agent.stop(Duration::from_secs(20));
    process::remove_at_exit(s.dir);
    Ok(())
}

/// `status.hub` while no agent reaches the hub (issue 29): the only replica of an account
/// streams it (`status.hub.state` ACTIVE, the hub's verdict), then its connection to the hub
/// is cut and refused; it writes `Connected=False/HubUnreachable` and `status.hub.state`
/// `Unknown` with why, instead of leaving the stale ACTIVE beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_lost_the_hub_says_the_hub_state_is_unknown() -> anyhow::Result<()> {
    let mut rules = fixtures::read_rules(&["configmaps"]);
    rules.extend(status_rules());
    let s = Setup::new("hub-unknown", rules).await?;
    let hub = fixtures::start_plaintext_hub(&s.dir).await?;
    let relay = Relay::start(hub.grpc_addr).await?;
    let account = format!("one-{}", s.ns);
    replica_config(
        &s.dir.join("a-0.yaml"),
        relay.addr(),
        &account,
        &s.ns,
        &s.kubeconfig,
    )?;
    let admin = SocketAddr::from(([127, 0, 0, 1], local_agent::free_port()?));
    let mut agent = spawn_replica(&s.dir, "a-0", admin, &s.kubeconfig)?;
    let log = s.dir.join("a-0.log");
    wait_for("status.hub.state ACTIVE", || async {
        let (condition, status) = connected(&s.admin, &s.ns, &s.agent_accounts, "one").await?;
        Ok((condition.is_some_and(|(state, _, _)| state == "True")
            && status["hub"]["state"] == "ACTIVE")
            .then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", process::tail(&log, 30)))?;

    relay.cut();
    let (message, status) =
        wait_unreachable(&s.admin, &s.ns, &s.agent_accounts, "one", &log).await?;
    assert!(message.contains("a-0 lost the hub"), "{message}");
    assert_eq!(status["hub"]["state"], "Unknown", "{status}");
    let reason = status["hub"]["stateReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("unknown") && reason.contains("lost the hub"),
        "{status}"
    );

    agent.stop(Duration::from_secs(20));
    drop(relay);
    hub.shutdown().await?;
    process::remove_at_exit(s.dir);
    Ok(())
}

/// Every `Connected` condition written to AgentAccount `name`, in order, as a watch of the
/// API server delivers them (a poll could miss a verdict overwritten within moments).
fn record_verdicts(
    client: &Client,
    ns: &str,
    api: &ApiResource,
    name: &str,
) -> (Arc<Mutex<Vec<Verdict>>>, tokio::task::JoinHandle<()>) {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let seen = Arc::new(Mutex::new(Vec::<Verdict>::new()));
    let objects = Api::<DynamicObject>::namespaced_with(client.clone(), ns, api);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut events = watcher(objects, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(object) = event else { continue };
                if let (Some(verdict), Ok(mut seen)) =
                    (verdict(&object.data["status"]), seen.lock())
                    && seen.last() != Some(&verdict)
                {
                    seen.push(verdict);
                }
            }
        }
    });
    (seen, task)
}

/// The agent's config for replica-independent settings: `hub` reached through `grpc`, one
/// account of ConfigMaps in `ns` that writes its verdict to AgentAccount `one`.
fn replica_config(
    path: &Path,
    grpc: SocketAddr,
    account: &str,
    ns: &str,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let config = json!({
        "clouddriver": {
            "grpc": grpc.to_string(),
            "insecure": true,
            "keepAliveHeartbeatSeconds": 2,
            "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
        },
        "kubernetes": { "accounts": [{
            "name": account,
            "kubeconfigFile": kubeconfig.display().to_string(),
            "namespaces": [ns],
            "kinds": ["configmaps"],
            "agentAccount": "one",
        }] },
        "status": { "namespace": ns, "scaleAgent": "prod" },
    });
    Ok(std::fs::write(path, config.to_string())?)
}

/// A real agent process as replica `replica`, with its admin port on `admin`.
fn spawn_replica(
    dir: &Path,
    replica: &str,
    admin: SocketAddr,
    kubeconfig: &Path,
) -> anyhow::Result<ManagedProcess> {
    let mut command = std::process::Command::new(AGENT);
    command
        .arg(format!(
            "--config={}",
            dir.join(format!("{replica}.yaml")).display()
        ))
        .arg(format!("--replica={replica}"))
        .arg(format!("--admin-addr={admin}"))
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,scale_agent::status_writer=debug");
    Ok(ManagedProcess::spawn_command(
        "e2e-agent",
        command,
        dir.join(format!("{replica}.log")),
    )?)
}

/// Waits until the replicas the hub names for `account` are `streaming` and `standbys`.
async fn wait_hub_roles(
    hub: SocketAddr,
    account: &str,
    streaming: &[&str],
    standbys: &[&str],
) -> anyhow::Result<()> {
    wait_for(
        &format!("the hub to have {streaming:?} streaming {account} and {standbys:?} on standby"),
        || async {
            let (now_streaming, now_standbys) = hub_replicas(hub, account).await?;
            Ok((now_streaming == streaming && now_standbys == standbys).then_some(()))
        },
    )
    .await
}

/// The replicas the hub names for `account`: (streaming, standbys).
async fn hub_replicas(
    hub: SocketAddr,
    account: &str,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let view = fixtures::hub_get_json(hub, &format!("/api/v1/accounts/{account}"))
        .await?
        .unwrap_or_default();
    let names = |replicas: &[Value]| -> Vec<String> {
        replicas
            .iter()
            .filter_map(|r| r["replica"].as_str().map(str::to_string))
            .collect()
    };
    Ok((
        names(std::slice::from_ref(&view["streaming"])),
        names(view["standbys"].as_array().map_or(&[], Vec::as_slice)),
    ))
}

/// Issue 12: a replica the hub demotes says so. Two real agent processes serve one account
/// through a real hub; the streaming one (`a-0`) reaches the hub through a relay that the
/// test cuts for a few seconds. The hub promotes `b-0`; `a-0`, which meanwhile wrote
/// `HubUnreachable` (its own last verdict), comes back as STANDBY and replaces that with
/// `Connected=True/Standby`, so the account does not stay `False` while `b-0` streams it;
/// within the writer's resync `b-0`'s `Streaming` is the account's verdict again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_replica_writes_standby() -> anyhow::Result<()> {
    let mut rules = fixtures::read_rules(&["configmaps"]);
    rules.extend(status_rules());
    let Setup {
        admin,
        ns,
        dir,
        kubeconfig,
        agent_accounts,
        ..
    } = Setup::new("demoted", rules).await?;

    let hub = fixtures::start_plaintext_hub(&dir).await?;
    let relay = Relay::start(hub.grpc_addr).await?;
    let account = format!("one-{ns}");
    replica_config(
        &dir.join("a-0.yaml"),
        relay.addr(),
        &account,
        &ns,
        &kubeconfig,
    )?;
    replica_config(
        &dir.join("b-0.yaml"),
        hub.grpc_addr,
        &account,
        &ns,
        &kubeconfig,
    )?;
    let a_admin = SocketAddr::from(([127, 0, 0, 1], local_agent::free_port()?));
    let b_admin = SocketAddr::from(([127, 0, 0, 1], local_agent::free_port()?));
    let mut a = spawn_replica(&dir, "a-0", a_admin, &kubeconfig)?;
    let (verdicts, recorder) = record_verdicts(&admin, &ns, &agent_accounts, "one");
    // The first verdict at or after index `from` with this status and reason, written by
    // `replica`: its index.
    let written =
        |status: &'static str, reason: &'static str, replica: &'static str, from: usize| {
            let verdicts = verdicts.clone();
            move || {
                let verdicts = verdicts.clone();
                async move {
                    let seen = verdicts
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .clone();
                    Ok(seen
                        .iter()
                        .enumerate()
                        .skip(from)
                        .find(|(_, (s, r, m))| s == status && r == reason && m.contains(replica))
                        .map(|(i, _)| i))
                }
            }
        };
    let streaming_a = wait_for(
        "a-0 to write Streaming",
        written("True", "Streaming", "a-0", 0),
    )
    .await?;
    let mut b = spawn_replica(&dir, "b-0", b_admin, &kubeconfig)?;
    wait_hub_roles(hub.http_addr, &account, &["a-0"], &["b-0"]).await?;

    // The outage: a-0's connection ends and its reconnections are refused.
    relay.cut();
    wait_hub_roles(hub.http_addr, &account, &["b-0"], &[]).await?;
    // The premise of what follows: a-0 noticed, and said so where its verdict stood.
    let unreachable_a = wait_for(
        "a-0 to write HubUnreachable",
        written("False", "HubUnreachable", "a-0", streaming_a + 1),
    )
    .await?;
    relay.restore();
    wait_hub_roles(hub.http_addr, &account, &["b-0"], &["a-0"]).await?;
    let standby_a = wait_for(
        "a-0, demoted, to write Standby over its HubUnreachable",
        written("True", "Standby", "a-0", unreachable_a + 1),
    )
    .await
    .with_context(|| {
        format!(
            "verdicts: {:?}\na-0's log:\n{}",
            verdicts.lock().map(|v| v.clone()).unwrap_or_default(),
            process::tail(a.log(), 30)
        )
    })?;
    // The streaming replica's verdict stands again within the writer's resync, and the
    // demoted one writes nothing more.
    let streaming_b = wait_for_within(
        "b-0's Streaming to be the account's verdict again",
        RESYNC_WAIT,
        Duration::from_millis(250),
        written("True", "Streaming", "b-0", standby_a + 1),
    )
    .await?;
    let seen = verdicts
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    assert!(
        seen[standby_a + 1..]
            .iter()
            .all(|(_, _, m)| !m.contains("a-0")),
        "a-0 wrote again after Standby: {seen:?}"
    );
    let (now, _) = connected(&admin, &ns, &agent_accounts, "one").await?;
    assert_eq!(now.as_ref(), seen.get(streaming_b), "{seen:?}");

    recorder.abort();
    a.stop(Duration::from_secs(20));
    b.stop(Duration::from_secs(20));
    drop(relay);
    hub.shutdown().await?;
    process::remove_at_exit(dir);
    Ok(())
}

/// `(accountState, stateReason)` of `account` in the hub's REST API, once it lists it.
async fn hub_account_state(
    hub: &fixtures::TlsHub,
    account: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let response = hub
        .api("GET", &format!("/api/v1/accounts/{account}"))
        .send()
        .await?;
    if response.status != 200 {
        return Ok(None);
    }
    let view: Value = serde_json::from_str(&response.body)?;
    let field = |name: &str| view[name].as_str().unwrap_or_default().to_string();
    Ok(Some((field("accountState"), field("stateReason"))))
}

/// The shared control plane, an admin client, a fresh namespace `<prefix>-…`, a temporary
/// directory `<dir>` and in it the kubeconfig of ServiceAccount `agent`, which may read
/// configmaps in the namespace.
async fn configmap_reader(
    prefix: &str,
    dir: &str,
) -> anyhow::Result<(
    &'static ControlPlane,
    Client,
    String,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    let control_plane = ControlPlane::shared()?;
    let admin = control_plane.client().await?;
    let ns = control_plane.namespace(&admin, prefix).await?;
    let dir = fixtures::temp_dir(dir)?;
    let kubeconfig = fixtures::service_account_identity(
        control_plane,
        &admin,
        &ns,
        "agent",
        Scope::Namespace,
        fixtures::read_rules(&["configmaps"]),
        dir.join("kubeconfig"),
    )
    .await?;
    Ok((control_plane, admin, ns, dir, kubeconfig))
}

/// An account the agent cannot serve at all is reported to the hub (AccountUnavailable) and
/// shows FAILED there with the agent's reason, beside the agent's good account, ACTIVE: one
/// account's kubeconfig file does not exist, another's token is refused by the API server
/// (401 on the account's first request). Before, the hub knew nothing of either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_the_agent_cannot_serve_are_failed_in_the_hub_with_the_reason()
-> anyhow::Result<()> {
    let (control_plane, _, ns, dir, kubeconfig) =
        configmap_reader("unservable", "unservable-accounts").await?;
    let refused = dir.join("kubeconfig-refused");
    std::fs::write(
        &refused,
        control_plane.kubeconfig_for_token("not-a-token-this-api-server-issued"),
    )?;
    let missing = dir.join("no-such-kubeconfig");
    let hub = fixtures::TlsHub::start(&dir, |_| {}).await?;
    let (good, unloadable, unauthorized) = (
        format!("good-{ns}"),
        format!("unloadable-{ns}"),
        format!("unauthorized-{ns}"),
    );
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.hub.grpc_addr,
        json!([
            fixtures::account(&good, &kubeconfig, &ns, &["configmaps"]),
            fixtures::account(&unloadable, &missing, &ns, &["configmaps"]),
            fixtures::account(&unauthorized, &refused, &ns, &["configmaps"]),
        ]),
        2,
    )?;
    let agent = fixtures::start_agent_replica(&config, "agent-0").await?;
    let states = wait_for("the hub's verdict on all three accounts", || async {
        let response = hub.api("GET", "/api/v1/accounts").send().await?;
        anyhow::ensure!(response.status == 200, "{}", response.body);
        let list: Vec<Value> = serde_json::from_str(&response.body)?;
        let state = |name: &str| {
            list.iter().find(|a| a["name"] == name).map(|a| {
                (
                    a["accountState"].as_str().unwrap_or_default().to_string(),
                    a["stateReason"].as_str().unwrap_or_default().to_string(),
                )
            })
        };
        let all = (state(&good), state(&unloadable), state(&unauthorized));
        Ok(match all {
            (Some(g), Some(l), Some(u))
                if g.0 == "ACTIVE" && l.0 == "FAILED" && u.0 == "FAILED" =>
            {
                Some((l.1, u.1))
            }
            _ => None,
        })
    })
    .await
    .with_context(|| {
        format!(
            "the agent's view: {}",
            serde_json::to_string(&agent.view()).unwrap_or_default()
        )
    })?;
    let (unloadable_reason, unauthorized_reason) = states;
    assert!(
        unloadable_reason.contains("cannot serve it")
            && unloadable_reason.contains(&missing.display().to_string()),
        "{unloadable_reason}"
    );
    assert!(
        unauthorized_reason.contains("cannot serve it") && unauthorized_reason.contains("401"),
        "{unauthorized_reason}"
    );
    let metrics = hub.api("GET", "/metrics").send().await?.body;
    assert!(
        metrics.contains("scale_agent_hub_accounts_by_state{state=\"FAILED\"} 2")
            && metrics.contains("scale_agent_hub_accounts_by_state{state=\"ACTIVE\"} 1"),
        "{metrics}"
    );
    // The agent shows the hub's verdict on the account too.
    wait_for("the agent to hear FAILED", || async {
        let view = serde_json::to_value(agent.view())?;
        Ok(view["accounts"].as_array().and_then(|accounts| {
            accounts
                .iter()
                .find(|a| a["name"] == unloadable.as_str())
                .filter(|a| a["hubState"]["state"] == "FAILED")
                .map(|_| ())
        }))
    })
    .await?;

    agent.shutdown();
    hub.hub.shutdown().await?;
    process::remove_at_exit(dir);
    Ok(())
}

/// Issue 12 item 2: the account's ServiceAccount is deleted while the agent streams, which
/// revokes its token. When the agent streams again (here after the hub restarts, as after
/// any reconnect) the API server answers its discovery with 401, and the hub shows the
/// account FAILED with the API server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_credentials_make_the_account_failed_in_the_hub() -> anyhow::Result<()> {
    let (_, admin, ns, dir, kubeconfig) =
        configmap_reader("revoked", "revoked-credentials").await?;
    let hub = fixtures::TlsHub::start(&dir, |_| {}).await?;
    let account = format!("revoked-{ns}");
    let config = dir.join("agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        hub.hub.grpc_addr,
        json!([fixtures::account(
            &account,
            &kubeconfig,
            &ns,
            &["configmaps"]
        )]),
        2,
    )?;
    let agent = fixtures::start_agent_replica(&config, "agent-0").await?;
    wait_for("the account ACTIVE", || async {
        Ok(hub_account_state(&hub, &account)
            .await?
            .filter(|(state, _)| state == "ACTIVE"))
    })
    .await?;

    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .delete("agent", &DeleteParams::default())
        .await?;
    // The API server caches token verdicts for a few seconds: wait until it refuses it.
    let revoked = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &Default::default(),
        )
        .await?,
    )?;
    wait_for("the token to be refused", || async {
        let answer = Api::<ServiceAccount>::namespaced(revoked.clone(), &ns)
            .list(&Default::default())
            .await;
        Ok(matches!(answer, Err(kube::Error::Api(status)) if status.code == 401).then_some(()))
    })
    .await?;
    let (hub, ()) = hub.restart(async { Ok(()) }).await?;
    let failed = wait_for("the account FAILED", || async {
        Ok(hub_account_state(&hub, &account)
            .await?
            .filter(|(state, _)| state == "FAILED"))
    })
    .await;
    let (_, reason) = failed.with_context(|| {
        format!(
            "the agent's view: {}",
            serde_json::to_string(&agent.view()).unwrap_or_default()
        )
    })?;
    assert!(
        reason.contains("refuses the account's credentials") && reason.contains("401"),
        "{reason}"
    );

    agent.shutdown();
    hub.hub.shutdown().await?;
    process::remove_at_exit(dir);
    Ok(())
}
