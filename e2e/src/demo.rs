//! `make demo`: a local Scale Agent system on a real control plane, explained as it starts.
//!
//! It starts the control plane and installs the CRDs; creates the CAs; starts the hub and
//! the operator as processes; applies a sample `ScaleAgent` and `AgentAccount`; runs the agent
//! pods the operator's Deployment asks for as local processes (there is no kubelet, see
//! [`crate::local_agent`]); prints the hub's view of the cluster as a scripted change
//! happens; deploys, scales, rolls back and deletes a sample application through the hub's
//! operations API; and stops everything in order (agents, operator, hub, control plane).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Pod, Service},
};
use kube::{Api, Client, api::ListParams};
use scale_agent_crds::{
    ScaleAgent,
    conditions::{CERTIFICATE_READY, is_true},
};
use serde_json::{Value, json};

use crate::{
    ControlPlane, ControlPlaneOptions, KUBERNETES_VERSION,
    binaries::product_binary,
    crds,
    error::{Error, Result, io_err},
    http::{self, get_json, post_json},
    local_agent::{LocalAgent, LocalAgentOptions, free_port},
    pki::CertificateAuthority,
    process::ManagedProcess,
};

/// What the demo does and where.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Where the demo keeps its cluster (certificates, kubeconfig, logs, etcd data).
    pub run_dir: PathBuf,
    /// Stop everything right after setting up, instead of waiting for Ctrl-C.
    pub once: bool,
}

/// The default place for the demo's cluster: tmpfs, so etcd writes to memory.
pub fn default_run_dir() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm/scale-agent-demo")
    } else {
        std::env::temp_dir().join("scale-agent-demo")
    }
}

/// Runs the demo, narrating to `out`.
pub async fn run(options: DemoOptions, out: &mut impl Write) -> Result<()> {
    let say = |out: &mut dyn Write, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(
        out,
        format!(
            "==> Starting a Kubernetes {KUBERNETES_VERSION} control plane in {}",
            options.run_dir.display()
        ),
    );
    let control_plane = ControlPlane::start(ControlPlaneOptions {
        run_dir: Some(options.run_dir.clone()),
        ..ControlPlaneOptions::default().with_controller_manager()
    })
    .await?;
    say(out, format!("    {}", control_plane.startup()));
    for (name, pid) in control_plane.pids() {
        say(out, format!("    {name:<24} pid {pid}"));
    }
    say(out, format!("    API server: {}", control_plane.server()));

    say(
        out,
        "==> Installing the Scale Agent CRDs from manifests/crds".into(),
    );
    let client = control_plane.client().await?;
    let definitions = crds::read_crds(&crds::manifests_dir())?;
    for name in crds::install(&client, &definitions).await? {
        say(
            out,
            format!("    customresourcedefinition/{name} established"),
        );
    }

    let kubectl = control_plane.binaries().kubectl();
    let kubeconfig = control_plane.kubeconfig_path();
    say(
        out,
        "==> kubectl get crds (the real kubectl, built with the control plane)".into(),
    );
    let listing = Command::new(&kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["get", "crds"])
        .output()
        .map_err(io_err(format!("run {}", kubectl.display())))?;
    for line in String::from_utf8_lossy(&listing.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&listing.stderr).lines())
    {
        say(out, format!("    {line}"));
    }

    let mut system = System::default();
    let result = run_system(&control_plane, &client, &options, out, &mut system).await;
    if let Err(e) = &result {
        say(out, format!("==> Failed: {e}"));
    }
    system.stop(out);
    say(
        out,
        "==> Stopping kube-controller-manager, kube-apiserver and etcd".into(),
    );
    drop(control_plane);
    say(out, "    stopped; nothing left running.".into());
    result
}

/// Namespace of the sample ScaleAgent and AgentAccount.
pub const NAMESPACE: &str = "scale-agent";
/// The sample ScaleAgent; its Deployment is `<name>-agent`.
pub const SCALE_AGENT: &str = "demo";
/// The Spinnaker account name of the sample AgentAccount.
pub const ACCOUNT: &str = "demo-cluster";
/// Namespace of the scripted change.
pub const APPS_NAMESPACE: &str = "demo-apps";

const WAIT: Duration = Duration::from_secs(90);

/// The processes the demo starts after the control plane, stopped in reverse order.
#[derive(Default)]
struct System {
    hub: Option<ManagedProcess>,
    operator: Option<ManagedProcess>,
    agents: Vec<LocalAgent>,
}

impl System {
    fn stop(&mut self, out: &mut impl Write) {
        if !self.agents.is_empty() {
            let pids: Vec<String> = self.agents.iter().map(|a| a.pid().to_string()).collect();
            line(
                out,
                format!("==> Stopping the agents (pids {})", pids.join(", ")),
            );
            for agent in &mut self.agents {
                agent.stop();
            }
            self.agents.clear();
        }
        for (what, process) in [
            ("the operator", self.operator.take()),
            ("the hub", self.hub.take()),
        ] {
            if let Some(mut process) = process {
                line(out, format!("==> Stopping {what} (pid {})", process.pid()));
                process.stop(Duration::from_secs(10));
            }
        }
    }
}

fn line(out: &mut dyn Write, text: String) {
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// Everything after the CRDs; processes go into `system` as they start, so the caller
/// stops them whatever happens here.
async fn run_system(
    control_plane: &ControlPlane,
    client: &Client,
    options: &DemoOptions,
    out: &mut impl Write,
    system: &mut System,
) -> Result<()> {
    let run_dir = control_plane.run_dir().to_path_buf();
    let kubectl = control_plane.binaries().kubectl();
    let kubeconfig = control_plane.kubeconfig_path().to_path_buf();
    let run_kubectl = |out: &mut dyn Write, args: &[&str]| -> Result<()> {
        line(out, format!("==> kubectl {}", args.join(" ")));
        let output = Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .output()
            .map_err(io_err(format!("run {}", kubectl.display())))?;
        for text in String::from_utf8_lossy(&output.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&output.stderr).lines())
        {
            line(out, format!("    {text}"));
        }
        Ok(())
    };

    // Certificates.
    line(
        out,
        format!("==> Creating namespace {NAMESPACE}, the agents' CA and the hub's certificates"),
    );
    create_namespace(client, NAMESPACE).await?;
    let agents_ca = CertificateAuthority::new("scale-agent-demo-agents-ca")?;
    let hub_ca = CertificateAuthority::new("scale-agent-demo-hub-ca")?;
    let serving = hub_ca.serving("scale-agent-hub", &["scale-agent-hub"])?;
    create_secret(
        client,
        "agent-ca",
        &[
            ("tls.crt", &agents_ca.cert_pem),
            ("tls.key", &agents_ca.key_pem),
        ],
    )
    .await?;
    line(
        out,
        format!(
            "    secret/agent-ca in {NAMESPACE}: the CA the operator signs agent client certificates with (the hub trusts it)"
        ),
    );
    create_secret(client, "hub-ca", &[("ca.crt", &hub_ca.cert_pem)]).await?;
    line(
        out,
        format!(
            "    secret/hub-ca in {NAMESPACE}: the CA of the hub's serving certificate (agents verify the hub with it)"
        ),
    );
    let hub_dir = run_dir.join("hub");
    let write = |name: &str, contents: &str| -> Result<PathBuf> {
        let path = hub_dir.join(name);
        std::fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))?;
        Ok(path)
    };
    std::fs::create_dir_all(hub_dir.join("data"))
        .map_err(io_err(format!("create {}", hub_dir.display())))?;
    let hub_cert = write("tls.crt", &serving.cert_pem)?;
    let hub_key = write("tls.key", &serving.key_pem)?;
    let client_ca = write("client-ca.crt", &agents_ca.cert_pem)?;
    line(
        out,
        format!(
            "    {}: the hub's serving certificate (localhost, 127.0.0.1) and key, and client-ca.crt",
            hub_dir.display()
        ),
    );

    // The hub.
    let grpc_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let hub_http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    line(out, "==> Starting the hub (mutual TLS)".into());
    let hub_args = vec![
        format!("--grpc-addr={grpc_addr}"),
        format!("--http-addr={hub_http}"),
        format!("--tls-cert={}", hub_cert.display()),
        format!("--tls-key={}", hub_key.display()),
        format!("--client-ca={}", client_ca.display()),
        format!("--data-dir={}", hub_dir.join("data").display()),
    ];
    let mut hub_command = Command::new(product_binary("e2e-hub")?);
    hub_command.args(&hub_args).env("RUST_LOG", "info");
    let hub = system.hub.insert(ManagedProcess::spawn_command(
        "scale-agent-hub",
        hub_command,
        run_dir.join("hub.log"),
    )?);
    wait_http_ok(hub, hub_http, "/readyz").await?;
    line(
        out,
        format!("    scale-agent-hub          pid {}", hub.pid()),
    );
    line(
        out,
        format!("    agents connect to {grpc_addr} (gRPC); HTTP API on http://{hub_http}"),
    );

    // The operator.
    line(out, "==> Starting the operator".into());
    let operator_metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut operator_command = Command::new(product_binary("e2e-operator")?);
    operator_command
        .arg(format!("--metrics-address={operator_metrics}"))
        .arg("--retry-max-seconds=10")
        .env("KUBECONFIG", control_plane.kubeconfig_path())
        .env("RUST_LOG", "info");
    let operator = system.operator.insert(ManagedProcess::spawn_command(
        "scale-agent-operator",
        operator_command,
        run_dir.join("operator.log"),
    )?);
    wait_http_ok(operator, operator_metrics, "/readyz").await?;
    line(
        out,
        format!("    scale-agent-operator     pid {}", operator.pid()),
    );
    line(
        out,
        "    it runs as the admin (KUBECONFIG=admin.kubeconfig), so its own RBAC from manifests/operator is not applied here".into(),
    );
    line(
        out,
        format!("    metrics: http://{operator_metrics}/metrics"),
    );

    // The sample resources.
    let sample = run_dir.join("sample.yaml");
    std::fs::write(&sample, sample_yaml(grpc_addr.port()))
        .map_err(io_err(format!("write {}", sample.display())))?;
    line(
        out,
        format!(
            "==> Applying a sample ScaleAgent ({SCALE_AGENT}, mode Agent, access Deploy, 2 replicas, hub localhost:{}) and AgentAccount ({ACCOUNT}) from {}",
            grpc_addr.port(),
            sample.display()
        ),
    );
    line(
        out,
        "    access: Deploy, not the default ReadOnly: the agent's RBAC then also allows create, update, patch and delete, which the deployments through the hub below need".into(),
    );
    run_kubectl(
        out,
        &["apply", "--server-side", "-f", &sample.to_string_lossy()],
    )?;

    line(
        out,
        "==> Waiting for the operator: ServiceAccount, RBAC, ConfigMap, certificate Secret, Deployment".into(),
    );
    let started = Instant::now();
    let deployment = format!("{SCALE_AGENT}-agent");
    let replicas = wait_for("the operator's objects", || async {
        let agent = Api::<ScaleAgent>::namespaced(client.clone(), NAMESPACE)
            .get(SCALE_AGENT)
            .await?;
        let status_ok = agent
            .status
            .as_ref()
            .is_some_and(|s| s.accounts == 1 && is_true(&s.conditions, CERTIFICATE_READY));
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(MANAGED_BY_SELECTOR))
            .await?;
        let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
            .get_opt(&deployment)
            .await?;
        Ok((status_ok && !replica_sets.items.is_empty())
            .then_some(deployment.and_then(|d| d.spec.replicas))
            .flatten())
    })
    .await?;
    line(
        out,
        format!("    reconciled in {:.1} s", started.elapsed().as_secs_f64()),
    );
    run_kubectl(out, &["get", "scaleagents,agentaccounts", "-n", NAMESPACE])?;
    line(
        out,
        "    (READY stays 0: no kubelet runs the Deployment's pods; they run as local processes below)"
            .into(),
    );
    run_kubectl(
        out,
        &[
            "get",
            "sa,cm,secret,deploy,rs",
            "-n",
            NAMESPACE,
            "-l",
            MANAGED_BY_SELECTOR,
        ],
    )?;

    // The agent pods, run as local processes.
    line(
        out,
        format!(
            "==> Starting the {replicas} agent pod(s) of Deployment {deployment} as local processes (no kubelet here: the ConfigMap, the certificate Secret and a TokenRequest token for ServiceAccount {deployment} are written where the pod would mount them)"
        ),
    );
    for replica in 0..usize::try_from(replicas).unwrap_or(1) {
        let pod_dir = run_dir
            .join("agents")
            .join(format!("{deployment}-local-{replica}"));
        let mut options = LocalAgentOptions::new(NAMESPACE, &deployment, pod_dir).replica(replica);
        options.env.push(("RUST_LOG".into(), "info".into()));
        let agent = LocalAgent::start(control_plane, client, options).await?;
        line(
            out,
            format!(
                "    {:<24} pid {}   admin {}   log {}",
                agent.pod_name(),
                agent.pid(),
                agent.admin_url(),
                agent.log().display()
            ),
        );
        system.agents.push(agent);
    }
    for agent in &mut system.agents {
        agent.wait_ready(WAIT).await?;
    }
    line(out, "    ready: connected to the hub".into());

    // The hub's view.
    let view = wait_for("the account in the hub with its kinds watched", || async {
        let view = get_json(hub_http, &format!("/api/v1/accounts/{ACCOUNT}")).await?;
        Ok(view.filter(|v| {
            let kinds = v["kinds"].as_array().cloned().unwrap_or_default();
            v["state"] == "connected"
                && v["objects"].as_u64().unwrap_or(0) > 0
                && !kinds.is_empty()
                && kinds
                    .iter()
                    .all(|k| k["state"] == "WATCHING" || k["state"] == "FORBIDDEN")
        }))
    })
    .await?;
    line(
        out,
        format!("==> The hub's view (curl http://{hub_http}/api/v1/agents and /api/v1/accounts)"),
    );
    if let Some(agents) = get_json(hub_http, "/api/v1/agents").await? {
        for agent in agents.as_array().cloned().unwrap_or_default() {
            let accounts: Vec<String> = agent["accounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|a| format!("{} {}", text(&a["name"]), text(&a["role"])))
                .collect();
            line(
                out,
                format!(
                    "    agent {} replica {}: {}",
                    text(&agent["identity"]),
                    text(&agent["replica"]),
                    accounts.join(", ")
                ),
            );
        }
    }
    print_account(out, &view);

    // A scripted change.
    line(
        out,
        format!(
            "==> A change in the cluster: namespace {APPS_NAMESPACE}, Deployment web (2 replicas) and 3 ConfigMaps; the hub is polled every 0.1 s"
        ),
    );
    create_namespace(client, APPS_NAMESPACE).await?;
    let mut counts = object_counts(&view);
    let steps: Vec<(String, Value)> = std::iter::once((
        "deployment/web".to_string(),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "web", "namespace": APPS_NAMESPACE },
            "spec": {
                "replicas": 2,
                "selector": { "matchLabels": { "app": "web" } },
                "template": {
                    "metadata": { "labels": { "app": "web" } },
                    "spec": { "containers": [{ "name": "web", "image": "nginx:1.27" }] },
                },
            },
        }),
    ))
    .chain((1..=3).map(|i| {
        (
            format!("configmap/settings-{i}"),
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": format!("settings-{i}"), "namespace": APPS_NAMESPACE },
                "data": { "greeting": format!("hello {i}") },
            }),
        )
    }))
    .collect();
    for (what, object) in steps {
        apply_object(client, &object).await?;
        let changed_at = Instant::now();
        line(out, format!("    created {what} in {APPS_NAMESPACE}"));
        // Wait until the hub's counts change and then settle (the Deployment brings a
        // ReplicaSet and Pods after it).
        let mut latest = counts.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut first_change = None;
        let mut last_change = None;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = get_json(hub_http, &format!("/api/v1/accounts/{ACCOUNT}"))
                .await?
                .map(|v| object_counts(&v))
                .unwrap_or_default();
            if now != latest {
                latest = now;
                first_change.get_or_insert_with(|| changed_at.elapsed());
                last_change = Some(Instant::now());
            } else if last_change.is_some_and(|t| t.elapsed() > Duration::from_millis(1500)) {
                break;
            }
        }
        let changes: Vec<String> = latest
            .iter()
            .filter(|(kind, n)| counts.get(*kind) != Some(n))
            .map(|(kind, n)| format!("{kind} {} -> {n}", counts.get(kind).copied().unwrap_or(0)))
            .collect();
        line(
            out,
            match first_change {
                Some(after) => format!(
                    "    hub: {} (first change seen after {:.2} s)",
                    changes.join(", "),
                    after.as_secs_f64()
                ),
                None => "    hub: no change within 20 s".into(),
            },
        );
        counts = latest;
    }
    if let Some(view) = get_json(hub_http, &format!("/api/v1/accounts/{ACCOUNT}")).await? {
        print_account(out, &view);
    }

    let last_operation = deploy_through_hub(client, hub_http, out).await?;

    line(out, "==> Ready. In another terminal:".into());
    line(
        out,
        format!(
            "    export KUBECONFIG={}",
            control_plane.kubeconfig_path().display()
        ),
    );
    line(
        out,
        format!(
            "    export PATH={}:$PATH   # kubectl {KUBERNETES_VERSION}",
            control_plane.binaries().dir().display()
        ),
    );
    line(out, "    kubectl get crds".into());
    line(out, "    kubectl explain scaleagent.spec".into());
    line(
        out,
        format!("    kubectl get scaleagents,agentaccounts -n {NAMESPACE}"),
    );
    line(
        out,
        format!("    kubectl -n {APPS_NAMESPACE} create configmap another --from-literal=a=b"),
    );
    line(out, format!("    curl http://{hub_http}/api/v1/accounts"));
    line(
        out,
        format!("    curl http://{hub_http}/api/v1/accounts/{ACCOUNT}"),
    );
    line(
        out,
        format!(
            "    curl 'http://{hub_http}/api/v1/accounts/{ACCOUNT}/objects?kind=configmaps&namespace={APPS_NAMESPACE}'"
        ),
    );
    line(out, format!("    curl http://{hub_http}/api/v1/agents"));
    line(
        out,
        format!("    curl http://{hub_http}/api/v1/operations/{last_operation}   # kept 15 min"),
    );
    for agent in &system.agents {
        line(
            out,
            format!(
                "    curl {}/accounts   # agent {}",
                agent.admin_url(),
                agent.pod_name()
            ),
        );
    }
    line(
        out,
        format!(
            "    logs: {}/*.log, {}/agents/*/*.log",
            run_dir.display(),
            run_dir.display()
        ),
    );

    if !options.once {
        line(out, "==> Press Ctrl-C to stop everything.".into());
        wait_for_shutdown_signal().await;
    }
    Ok(())
}

const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=scale-agent-operator";

/// The sample application deployed through the hub, in [`APPS_NAMESPACE`].
pub const APP: &str = "hello";
/// Its image, without the tag.
pub const APP_IMAGE: &str = "registry.example/hello";

/// The sample application's Deployment: strategy Recreate, since no kubelet runs its pods
/// here (they stay Pending), so a rolling update would never finish.
fn app_deployment(tag: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": APP, "namespace": APPS_NAMESPACE, "labels": { "app": APP } },
        "spec": {
            "replicas": 1,
            "strategy": { "type": "Recreate" },
            "selector": { "matchLabels": { "app": APP } },
            "template": {
                "metadata": { "labels": { "app": APP } },
                "spec": { "containers": [{
                    "name": APP,
                    "image": format!("{APP_IMAGE}:{tag}"),
                    "ports": [{ "containerPort": 8080 }],
                }] },
            },
        },
    })
}

fn app_service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": APP, "namespace": APPS_NAMESPACE, "labels": { "app": APP } },
        "spec": { "selector": { "app": APP }, "ports": [{ "port": 80, "targetPort": 8080 }] },
    })
}

/// Submits operations to the hub's HTTP API for [`ACCOUNT`], one narrated line each.
struct Operations {
    hub: SocketAddr,
    /// Operation types whose curl command was shown.
    shown: BTreeSet<String>,
    /// The id of the latest operation.
    last_id: String,
}

impl Operations {
    fn path() -> String {
        format!("/api/v1/accounts/{ACCOUNT}/operations")
    }

    /// Submits `body`; prints `label`, the HTTP status, the state, who ran it and
    /// `summary(response)`, plus the curl command the first time of each operation type.
    /// Anything but a success is an error.
    async fn submit(
        &mut self,
        out: &mut dyn Write,
        label: &str,
        body: Value,
        summary: impl FnOnce(&Value) -> String,
    ) -> Result<Value> {
        let path = Self::path();
        let (status, response) = post_json(self.hub, &path, &body, Duration::from_secs(60)).await?;
        let state = text(&response["state"]);
        if !(200..300).contains(&status) || state != "succeeded" {
            line(
                out,
                format!(
                    "    {label}: HTTP {status} {state}: {}",
                    response["status"]["message"]
                        .as_str()
                        .or(response["message"].as_str())
                        .unwrap_or_default()
                ),
            );
            return Err(Error::Http {
                method: "POST".into(),
                url: format!("http://{}{path}", self.hub),
                message: format!("{label}: HTTP {status} {state}: {response}"),
            });
        }
        self.last_id = text(&response["id"]);
        line(
            out,
            format!(
                "    {label}: HTTP {status} {state} (agent {}); {}",
                text(&response["replica"]),
                summary(&response)
            ),
        );
        let kind = match body["action"].as_str() {
            Some(action) => format!("{} {action}", text(&body["type"])),
            None => text(&body["type"]),
        };
        if self.shown.insert(kind) {
            line(
                out,
                format!(
                    "      curl -sS -X POST http://{}{path} -H 'Content-Type: application/json' -d '{}'",
                    self.hub,
                    body.to_string().replace('\'', "'\\''")
                ),
            );
        }
        Ok(response)
    }
}

/// The result object of `kind` in an operation's answer.
fn result_object<'a>(response: &'a Value, kind: &str) -> &'a Value {
    response["objects"]
        .as_array()
        .and_then(|objects| objects.iter().find(|o| o["kind"] == kind))
        .unwrap_or(&Value::Null)
}

fn deployment_image(deployment: &Deployment) -> String {
    deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn replica_set_image(replica_set: &ReplicaSet) -> String {
    replica_set
        .spec
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn revision_of(deployment: &Deployment) -> String {
    deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("deployment.kubernetes.io/revision"))
        .cloned()
        .unwrap_or_default()
}

/// Waits until the Deployment is at `revision`, its ReplicaSet running `image` wants
/// `replicas` and has created them, and its other ReplicaSets are scaled to 0 (strategy
/// Recreate); returns that ReplicaSet's name.
async fn wait_for_revision(
    client: &Client,
    revision: &str,
    image: &str,
    replicas: i32,
) -> Result<String> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE);
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), APPS_NAMESPACE);
    wait_for(
        &format!("Deployment {APP} revision {revision} with {replicas} replica(s) of {image}"),
        || async {
            let deployment = deployments.get(APP).await?;
            if revision_of(&deployment) != revision || deployment_image(&deployment) != image {
                return Ok(None);
            }
            let list = replica_sets
                .list(&ListParams::default().labels(&format!("app={APP}")))
                .await?;
            let (current, old): (Vec<&ReplicaSet>, Vec<&ReplicaSet>) = list
                .items
                .iter()
                .partition(|rs| replica_set_image(rs) == image);
            let created = |rs: &ReplicaSet, n: i32| {
                rs.spec.replicas == Some(n) && rs.status.as_ref().map(|s| s.replicas) == Some(n)
            };
            Ok(match current.as_slice() {
                [rs] if created(rs, replicas) && old.iter().all(|rs| created(rs, 0)) => {
                    rs.metadata.name.clone()
                }
                _ => None,
            })
        },
    )
    .await
}

/// The "Deploying through the hub" step: apply, apply a change, scale, rollout history and
/// undo, delete, each a `POST` to the hub's operations API; the cluster's side is read with
/// the admin client. Returns the id of the last operation.
async fn deploy_through_hub(
    client: &Client,
    hub: SocketAddr,
    out: &mut dyn Write,
) -> Result<String> {
    let v1 = format!("{APP_IMAGE}:1.0");
    let v2 = format!("{APP_IMAGE}:1.1");
    line(
        out,
        format!(
            "==> Deploying through the hub (what Spinnaker does): each operation is a POST to http://{hub}{}; the hub hands it to a connected agent, which runs it as ServiceAccount {SCALE_AGENT}-agent (ScaleAgent access Deploy; with ReadOnly these would answer 403 Forbidden)",
            Operations::path()
        ),
    );
    let mut ops = Operations {
        hub,
        shown: BTreeSet::new(),
        last_id: String::new(),
    };
    let resource_version = |object: &Value| text(&object["metadata"]["resourceVersion"]);

    // (1) Server-side apply of the Deployment and its Service.
    ops.submit(
        out,
        &format!("apply (server-side) Deployment {APP} ({v1}, 1 replica, strategy Recreate) and Service {APP} in {APPS_NAMESPACE}"),
        json!({
            "type": "apply", "serverSide": true, "fieldManager": "spinnaker",
            "manifests": [app_deployment("1.0"), app_service()],
        }),
        |r| {
            format!(
                "resourceVersion {} (Deployment), {} (Service)",
                resource_version(result_object(r, "Deployment")),
                resource_version(result_object(r, "Service"))
            )
        },
    )
    .await?;
    let first = wait_for_revision(client, "1", &v1, 1).await?;
    line(
        out,
        format!(
            "      revision 1: ReplicaSet {first} runs {v1} (its Pod stays Pending: no scheduler or kubelet here)"
        ),
    );

    // (2) A change: a second revision.
    ops.submit(
        out,
        &format!("apply (server-side) Deployment {APP} with image {v2}"),
        json!({
            "type": "apply", "serverSide": true, "fieldManager": "spinnaker",
            "manifest": app_deployment("1.1"),
        }),
        |r| {
            let deployment = result_object(r, "Deployment");
            format!(
                "resourceVersion {}, image {}",
                resource_version(deployment),
                text(&deployment["spec"]["template"]["spec"]["containers"][0]["image"])
            )
        },
    )
    .await?;
    let second = wait_for_revision(client, "2", &v2, 1).await?;
    line(
        out,
        format!("      revision 2: ReplicaSet {second} runs {v2}; {first} scaled to 0"),
    );

    // (3) Scale; the ReplicaSet follows.
    ops.submit(
        out,
        &format!("scale Deployment {APP} to 3"),
        json!({
            "type": "scale", "kind": "deployment", "namespace": APPS_NAMESPACE,
            "name": APP, "replicas": 3,
        }),
        |r| {
            format!(
                "replicas {}",
                text(&result_object(r, "Deployment")["spec"]["replicas"])
            )
        },
    )
    .await?;
    let scaled = wait_for_revision(client, "2", &v2, 3).await?;
    line(
        out,
        format!(
            "      ReplicaSet {scaled} follows: replicas 3, 3 Pods created (kube-controller-manager)"
        ),
    );

    // (4) Rollout history, and undo to revision 1.
    ops.submit(
        out,
        &format!("rollout history Deployment {APP}"),
        json!({
            "type": "rollout", "action": "history", "kind": "deployment",
            "namespace": APPS_NAMESPACE, "name": APP,
        }),
        |r| {
            let revisions: Vec<&str> = r["text"]
                .as_str()
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|w| w.parse::<u64>().is_ok())
                .collect();
            format!("revisions {}", revisions.join(", "))
        },
    )
    .await?;
    ops.submit(
        out,
        &format!("rollout undo Deployment {APP} to revision 1"),
        json!({
            "type": "rollout", "action": "undo", "kind": "deployment",
            "namespace": APPS_NAMESPACE, "name": APP, "toRevision": 1,
        }),
        |r| {
            format!(
                "{}, image {}",
                text(&r["text"]),
                text(&result_object(r, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"])
            )
        },
    )
    .await?;
    let back = wait_for_revision(client, "3", &v1, 3).await?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE)
        .get(APP)
        .await?;
    line(
        out,
        format!(
            "      the API server: Deployment {APP} image {}, revision {} (revision 1's template again), ReplicaSet {back} back at 3 replicas",
            deployment_image(&deployment),
            revision_of(&deployment)
        ),
    );

    // (5) Delete, waiting for the foreground deletion to finish.
    let deleted = |r: &Value| {
        let names: Vec<String> = r["deleted"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(text)
            .collect();
        format!("deleted {}", names.join(", "))
    };
    ops.submit(
        out,
        &format!("delete Deployment {APP} (propagation Foreground, wait)"),
        json!({
            "type": "delete", "kind": "deployment", "namespace": APPS_NAMESPACE, "name": APP,
            "propagationPolicy": "Foreground", "wait": true, "timeoutSeconds": 45,
        }),
        deleted,
    )
    .await?;
    ops.submit(
        out,
        &format!("delete Service {APP} (wait)"),
        json!({
            "type": "delete", "kind": "service", "namespace": APPS_NAMESPACE, "name": APP,
            "wait": true,
        }),
        deleted,
    )
    .await?;
    let selector = ListParams::default().labels(&format!("app={APP}"));
    wait_for("the sample application's objects to be gone", || async {
        let deployments = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        let pods = Api::<Pod>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        let services = Api::<Service>::namespaced(client.clone(), APPS_NAMESPACE)
            .list(&selector)
            .await?
            .items
            .len();
        Ok((deployments + replica_sets + pods + services == 0).then_some(()))
    })
    .await?;
    line(
        out,
        format!(
            "      the API server: no Deployment, ReplicaSet, Pod or Service app={APP} left in {APPS_NAMESPACE}"
        ),
    );
    Ok(ops.last_id)
}

/// The sample ScaleAgent and AgentAccount, pointing at the local hub.
fn sample_yaml(hub_port: u16) -> String {
    format!(
        "# The demo's ScaleAgent: two agent replicas streaming the whole cluster to the local hub.
apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: {SCALE_AGENT}
  namespace: {NAMESPACE}
spec:
  mode: Agent
  hub:
    address: localhost:{hub_port}
    tls:
      caSecretRef:
        name: hub-ca
  clientCertificate:
    issuerSecretRef:
      name: agent-ca
  replicas: 2
  # Deploy (not the default ReadOnly): the agent may also write, for operations through the hub.
  access: Deploy
  scope:
    type: Cluster
  defaults:
    kinds: [Namespace, Deployment, ReplicaSet, Pod, ConfigMap, Service]
---
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: {ACCOUNT}
  namespace: {NAMESPACE}
spec:
  agentRef: {SCALE_AGENT}
  permissions:
    read: [everyone]
"
    )
}

fn text(value: &Value) -> String {
    value
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| value.to_string())
}

fn object_counts(view: &Value) -> BTreeMap<String, u64> {
    view["objectCounts"]
        .as_object()
        .map(|counts| {
            counts
                .iter()
                .map(|(kind, n)| (kind.clone(), n.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

fn print_account(out: &mut dyn Write, view: &Value) {
    line(
        out,
        format!(
            "    account {}: {}, streamed by {} ({}), {} objects; cluster {} {}",
            text(&view["name"]),
            text(&view["state"]),
            text(&view["streaming"]["replica"]),
            text(&view["streaming"]["identity"]),
            view["objects"].as_u64().unwrap_or(0),
            text(&view["cluster"]["apiServerHost"]),
            text(&view["cluster"]["kubernetesVersion"]),
        ),
    );
    for kind in view["kinds"].as_array().cloned().unwrap_or_default() {
        let group = text(&kind["group"]);
        let name = if group.is_empty() {
            text(&kind["kind"])
        } else {
            format!("{}/{}", group, text(&kind["kind"]))
        };
        line(
            out,
            format!(
                "      {name:<20} {:>5} objects  {}",
                kind["objects"].as_u64().unwrap_or(0),
                text(&kind["state"])
            ),
        );
    }
}

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    apply_object(
        client,
        &json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } }),
    )
    .await
}

async fn create_secret(client: &Client, name: &str, data: &[(&str, &str)]) -> Result<()> {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    apply_object(
        client,
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": NAMESPACE },
            "stringData": data,
        }),
    )
    .await
}

/// Server-side applies one object (built-in kinds only).
async fn apply_object(client: &Client, object: &Value) -> Result<()> {
    use kube::{
        api::{DynamicObject, Patch, PatchParams},
        core::{ApiResource, GroupVersionKind},
    };
    let (group, version) = match object["apiVersion"]
        .as_str()
        .unwrap_or("v1")
        .split_once('/')
    {
        Some((group, version)) => (group.to_owned(), version.to_owned()),
        None => (
            String::new(),
            object["apiVersion"].as_str().unwrap_or("v1").to_owned(),
        ),
    };
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, kind));
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(crds::FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

/// Polls `probe` every 250 ms until it answers 200, failing early when the process exits.
async fn wait_http_ok(process: &mut ManagedProcess, addr: SocketAddr, path: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        process.ensure_running()?;
        if http::get(addr, path).await.is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        if started.elapsed() > WAIT {
            return Err(Error::NotReady {
                component: process.name(),
                waited_secs: WAIT.as_secs(),
                log: process.log().to_path_buf(),
                log_tail: crate::process::tail(process.log(), 20),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `check` until it returns `Some`, or fails after [`WAIT`] naming `what`.
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                secs: WAIT.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
