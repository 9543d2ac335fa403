//! The product as it ships, on a real node (e2e/src/real_node): this build's images loaded
//! into containerd, the chart installed with `helm install` as the README says (operator and
//! hub, embedded store), a ScaleAgent and an AgentAccount applied with kubectl, and real agent
//! pods run by kubelet under the chart's and the operator's probes, security contexts and
//! resources, enrolling with the hub pod through its Service, until
//! `kubectl wait --for=condition=Connected` succeeds. These are the steps of the guide's
//! `docs/src/getting-started/real-cluster.md` (step 4 of
//! `docs/src/getting-started/walk-through.md`).
//!
//! What a bare node lacks, done the way a platform team would: the hub's volume claim is
//! bound to a hostPath PersistentVolume made for it (no provisioner), and there is no cluster
//! DNS, so the ScaleAgent dials the hub Service's ClusterIP with `tls.serverName` set to the
//! name in the hub's certificate.
//!
//! Then, as a platform team meets them on day one: an agent's log through kubelet; kubectl
//! through the hub's proxy over `kubectl port-forward`, listing and deploying;
//! `podMetrics: true` granting the metrics API's reads; a rolling update of the agents to a
//! pod template with the fleet knobs (nodeSelector, toleration of a tainted node, pull
//! secret, env, PodDisruptionBudget, all honoured by kubelet and the controllers) while
//! several clients send requests through the hub (the agents drain on SIGTERM: none fails,
//! none is missing after, and the standby resumes the watches without a LIST;
//! `real_node/rollout.rs`); the hub pod replaced on the same volume, resuming without the
//! agents listing again (the API server's audit log); `helm upgrade` with changed values
//! rolling the operator and hub pods, again without a LIST (`real_node/upgrade.rs`);
//! `kubectl top pod --containers` against the node's metrics-server, directly and through
//! the hub for the account, and the API server's 403 once `podMetrics` is off
//! (`real_node/pod_metrics.rs`); `kubectl top node` and `top pod -A` through a
//! Cluster-scoped agent, and the namespace-scoped account's refusal
//! (`real_node/cluster_metrics.rs`); no container restarted; and `helm uninstall` as the
//! chart's README documents it, leaving nothing of the release, its operator's Lease
//! included.
//!
//! The node is readied for the chart by `scale_agent_e2e::real_node::install::prepare`, the
//! same function `make demo-node` runs for a person to follow the guide on.
//!
//! Needs root; without it the test says why and passes without running.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use scale_agent_e2e::{
    fixtures::temp_dir,
    real_node::{
        self, RealNode,
        install::{self, HubTlsFiles, PreparedNode},
        user::{Cli, HubKubectl, PortForward},
    },
};

#[path = "real_node/cluster_metrics.rs"]
mod cluster_metrics;
#[path = "real_node/pod_metrics.rs"]
mod pod_metrics;
#[path = "real_node/rollout.rs"]
mod rollout;
#[path = "real_node/upgrade.rs"]
mod upgrade;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const NAMESPACE: &str = "scale-agent-system";
/// `e2e-hub` and its siblings, as this test's build made them.
fn test_binary(name: &str) -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(match name {
        "e2e-operator" => env!("CARGO_BIN_EXE_e2e-operator"),
        "e2e-agent" => env!("CARGO_BIN_EXE_e2e-agent"),
        "e2e-hub" => env!("CARGO_BIN_EXE_e2e-hub"),
        other => bail!("no binary {other} in this build"),
    }))
}

/// The hub's Secret `scale-agent-hub-tls` and the agents' `hub-ca` in `namespace`, from the
/// certificate files, with the guide's commands (steps 2 and 4).
fn hub_tls_secret(cli: &Cli, namespace: &str, tls: &HubTlsFiles) -> anyhow::Result<()> {
    let secrets = [
        (
            "scale-agent-hub-tls",
            vec![
                ("tls.crt", tls.cert()),
                ("tls.key", tls.key()),
                ("ca.crt", tls.ca()),
            ],
        ),
        ("hub-ca", vec![("ca.crt", tls.ca())]),
    ];
    for (secret, files) in secrets {
        let from_files: Vec<String> = files
            .iter()
            .map(|(key, path)| format!("--from-file={key}={}", path.display()))
            .collect();
        let mut args = vec!["-n", namespace, "create", "secret", "generic", secret];
        args.extend(from_files.iter().map(String::as_str));
        cli.kubectl(&args)?;
    }
    Ok(())
}

fn wait_rollout(cli: &Cli, deployment: &str) -> anyhow::Result<()> {
    wait_rollout_in(cli, NAMESPACE, deployment)
}

fn wait_rollout_in(cli: &Cli, namespace: &str, deployment: &str) -> anyhow::Result<()> {
    cli.kubectl(&[
        "-n",
        namespace,
        "rollout",
        "status",
        &format!("deployment/{deployment}"),
        "--timeout=240s",
    ])
    .with_context(|| cli.describe(NAMESPACE))?;
    Ok(())
}

/// A ConfigMap in team-a, applied through the hub (an operation) or directly.
fn config_map(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}
  namespace: team-a
data:
  written-by: real-node-test
"
    )
}

/// The agents' own LIST requests (their watches' initial lists and relists), as the API
/// server's audit log recorded them (URI, status, user agent).
///
/// The agents' ServiceAccount also makes the requests the hub tunnels to them: a kubectl
/// list through the hub's proxy while the hub's cache cannot answer it (right after the hub
/// pod's replacement, until the account streams again) reaches the API server as the agent's
/// list, with kubectl's User-Agent, which the tunnel replays. Those are the test's own
/// requests, not a relist, and are left out. Counted as a relist, that artefact
/// (`team-a/configmaps?limit=500` just after the hub pod's replacement, the test's own
/// `kubectl get configmaps`) failed this test in 1 run of 6 with the drain on, and is the
/// likely "ConfigMap relist" for which the operator had turned the agents' drain off.
fn agent_lists(node: &RealNode) -> anyhow::Result<Vec<String>> {
    let agent = format!("system:serviceaccount:{NAMESPACE}:real-node-agent");
    Ok(node
        .control_plane()
        .audit_events()?
        .into_iter()
        .filter(|event| {
            event.verb == "list"
                && event.user.username == agent
                && !event.user_agent.starts_with("kubectl")
        })
        .map(|event| {
            format!(
                "{} {} {}",
                event.request_uri,
                event.response_status.map_or(0, |s| s.code),
                event.user_agent
            )
        })
        .collect())
}

/// No container of the release or its agents has restarted: probes and limits held, and
/// nothing crashed.
fn no_restarts(cli: &Cli) -> anyhow::Result<()> {
    let restarts = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[*].restartCount}{\"\\n\"}{end}",
    ])?;
    let restarted: Vec<&str> = restarts
        .lines()
        .filter(|line| line.split_whitespace().skip(1).any(|count| count != "0"))
        .collect();
    ensure!(
        restarted.is_empty(),
        "containers restarted (name, restart counts): {restarted:?}\n{}",
        cli.describe(NAMESPACE)
    );
    Ok(())
}

/// Removes the test's directory (images, certificates, the hub's volume) when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn step(started: Instant, what: &str) {
    eprintln!(
        "[real-node test] {:6.1} s  {what}",
        started.elapsed().as_secs_f64()
    );
}

/// Secret `real-node-enrolment` with a one-time enrolment token from the hub's pod (exec
/// through kubelet) for identity `real-node` and accounts `real-node*`.
fn enrolment_secret(cli: &Cli) -> anyhow::Result<()> {
    enrolment_secret_for(cli, "real-node-enrolment", "real-node")
}

/// Secret `secret` with a one-time enrolment token from the hub's pod (exec through
/// kubelet) for `identity` and the accounts `<identity>*`.
fn enrolment_secret_for(cli: &Cli, secret: &str, identity: &str) -> anyhow::Result<()> {
    let accounts = format!("{identity}*");
    let token = cli
        .kubectl(&[
            "-n",
            NAMESPACE,
            "exec",
            "deploy/scale-agent-hub",
            "--",
            "scale-agent-hub",
            "agent-token",
            "create",
            "--identity",
            identity,
            "--accounts",
            &accounts,
            "--ttl",
            "1h",
            "--once",
        ])?
        .trim()
        .to_string();
    ensure!(!token.is_empty(), "agent-token create printed no token");
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "generic",
        secret,
        &format!("--from-literal=token={token}"),
    ])?;
    Ok(())
}

/// No cluster DNS: agents dial the hub Service's ClusterIP (with the name in its
/// certificate as `tls.serverName`).
fn hub_cluster_ip(cli: &Cli) -> anyhow::Result<String> {
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "service",
        "scale-agent-hub",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
}

/// ScaleAgent `real-node` (two enrolled agents dialling the hub at `hub_ip` with `access`
/// over `namespace`, watching `kinds`) and AgentAccount `real-node` (with `account_fields`,
/// YAML lines of its spec), in the release namespace.
fn real_node_agent(
    hub_ip: &str,
    access: &str,
    namespace: &str,
    kinds: &str,
    account_fields: &str,
) -> String {
    format!(
        "apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: real-node
  namespace: {NAMESPACE}
spec:
  mode: Agent
  hub:
    address: {hub_ip}:9091
    tls:
      serverName: scale-agent-hub
      caSecretRef:
        name: hub-ca
  enrolment:
    tokenSecretRef:
      name: real-node-enrolment
  replicas: 2
  access: {access}
  scope:
    type: Namespaces
    namespaces: [{namespace}]
  defaults:
    kinds: {kinds}
---
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: real-node
  namespace: {NAMESPACE}
spec:
  agentRef: real-node
{account_fields}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_agents_connect_on_a_real_node() -> anyhow::Result<()> {
    if let Some(reason) = real_node::unavailable() {
        eprintln!("skipping the real-node test: {reason}");
        return Ok(());
    }
    let started = Instant::now();
    let dir = temp_dir("real-node-test")?;
    // Declared before the node, so dropped after it (the hub's hostPath volume is in it),
    // also when the test fails.
    let _remove_dir = RemoveOnDrop(dir.clone());
    let PreparedNode {
        mut node,
        cli,
        hub_tls,
    } = install::prepare(&dir, test_binary, &mut |what| step(started, what)).await?;
    // Started now, so it has scraped the pods by the time `kubectl top` is tried.
    node.start_metrics_server().await?;
    step(started, "metrics-server serves metrics.k8s.io");

    // As the README installs it: the hub's Secret first, then the chart with the hub on.
    cli.kubectl(&["create", "namespace", NAMESPACE])?;
    // Before the chart: it binds the operator's grants in each grantable namespace.
    cli.kubectl(&["create", "namespace", "team-a"])?;
    hub_tls_secret(&cli, NAMESPACE, &hub_tls)?;
    let chart = scale_agent_e2e::repo_root().join("manifests/helm/scale-agent");
    let installed = cli.helm(&[
        "install",
        "scale-agent",
        &chart.to_string_lossy(),
        "-n",
        NAMESPACE,
        "--set",
        "hub.enabled=true",
        // The agents' ScaleAgent lives in the release namespace and reads team-a: the operator
        // grants Roles outside a ScaleAgent's own namespace only where it is told it may.
        "--set",
        "operator.grantableNamespaces={team-a}",
        // A ClusterRole for the Cluster-scoped agent of `kubectl top node`
        // (real_node/cluster_metrics.rs), as a cluster administrator allows it.
        "--set",
        &format!(
            "operator.clusterGrants={{{NAMESPACE}/{}}}",
            cluster_metrics::CLUSTER
        ),
        "--timeout",
        "5m",
    ])?;
    ensure!(
        installed.contains(&format!("Scale Agent v{VERSION} is installed")),
        "helm install said:\n{installed}"
    );
    step(started, "helm install done");
    wait_rollout(&cli, "scale-agent-operator")?;
    wait_rollout(&cli, "scale-agent-hub")?;
    step(started, "operator and hub pods Ready");

    // A hub-only second release on the same cluster (Spinnaker's namespace): the hand run
    // found it failing on the admission policy the first release owns.
    let spinnaker = "spinnaker";
    cli.kubectl(&["create", "namespace", spinnaker])?;
    hub_tls_secret(&cli, spinnaker, &hub_tls)?;
    cli.helm(&[
        "install",
        "scale-agent-hub",
        &chart.to_string_lossy(),
        "-n",
        spinnaker,
        "--set",
        "operator.enabled=false",
        "--set",
        "hub.enabled=true",
        "--timeout",
        "5m",
    ])?;
    wait_rollout_in(&cli, spinnaker, "scale-agent-hub")?;
    cli.helm(&["uninstall", "scale-agent-hub", "-n", spinnaker, "--wait"])?;
    let policy = cli.kubectl(&[
        "get",
        "validatingadmissionpolicy/scale-agent-scaleagent-privileges",
        "-o",
        "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name}",
    ])?;
    ensure!(
        policy == "scale-agent",
        "the first release's admission policy after the hub-only release came and went: owned by {policy:?}"
    );
    step(
        started,
        "a hub-only second release installed beside it and uninstalled",
    );

    enrolment_secret(&cli)?;
    let hub_ip = hub_cluster_ip(&cli)?;
    cli.apply(&real_node_agent(
        &hub_ip,
        "Deploy",
        "team-a",
        "[Deployment, ReplicaSet, Service, ConfigMap, Pod]",
        "  podMetrics: true\n",
    ))?;
    step(started, "ScaleAgent and AgentAccount applied");
    if let Err(error) = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Connected",
        "agentaccount/real-node",
        "--timeout=300s",
    ]) {
        bail!("{error}\n{}", cli.describe(NAMESPACE));
    }
    step(started, "agentaccount/real-node Connected");
    // podMetrics: the operator granted the agents the metrics API's reads in team-a (the API
    // server's own answer; `kubectl top` through the hub comes at the end, real_node/pod_metrics.rs).
    ensure!(
        pod_metrics::agents_may_read_pod_metrics(&cli)?,
        "the agents may not list pods.metrics.k8s.io in team-a with podMetrics on"
    );
    let agents = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=real-node",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.containers[0].image}{\"\\n\"}{end}",
    ])?;
    eprintln!("agent pods:\n{agents}");
    ensure!(
        agents.lines().filter(|l| l.contains(" Running ")).count() == 2,
        "two agent pods should run:\n{agents}"
    );

    // kubelet's logs API (through the API server, with its client certificate).
    let logs = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "logs",
        "deployment/real-node-agent",
        "--tail=20",
    ])?;
    ensure!(
        logs.contains("connected to the hub"),
        "the agent's log through kubelet:\n{logs}"
    );
    no_restarts(&cli)?;

    // kubectl through the hub's Kubernetes API proxy, reached by port-forward: it lists
    // and deploys (a Deployment of the pause image, whose pods kubelet runs).
    let forward = PortForward::start(&cli, NAMESPACE, "scale-agent-hub", 8443)?;
    let hub = HubKubectl::new(&cli, NAMESPACE, &dir, "real-node", "scale-agent-hub")?;
    let listed = hub.run(&cli, &forward, &["-n", "team-a", "get", "configmaps"], None)?;
    ensure!(
        listed.contains("kube-root-ca.crt"),
        "the hub's list of team-a's ConfigMaps:\n{listed}"
    );
    hub.run(
        &cli,
        &forward,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: team-a
spec:
  replicas: 1
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
        - name: web
          image: {pause}
          imagePullPolicy: Never
        # A second container, so `kubectl top pod --containers` (real_node/pod_metrics.rs)
        # has more than one line per pod to match.
        - name: sidecar
          image: {pause}
          imagePullPolicy: Never
",
            pause = real_node::PAUSE_IMAGE
        )),
    )?;
    hub.run(
        &cli,
        &forward,
        &[
            "-n",
            "team-a",
            "rollout",
            "status",
            "deployment/web",
            "--timeout=120s",
        ],
        None,
    )
    .with_context(|| cli.describe(NAMESPACE))?;
    step(
        started,
        "kubectl through the hub listed and deployed (deployment/web rolled out)",
    );

    // A rolling update of the agents (new resources in the ScaleAgent: a new pod template)
    // under load: the agents drain on SIGTERM, so no operation through the hub is cut.
    let rolled = rollout::roll_agents_under_load(&node, &cli, &hub, &forward, &dir)?;
    let template = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "deployment/real-node-agent",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].resources.requests.memory}",
    ])?;
    ensure!(
        template == "48Mi",
        "the agents' pod template after the patch: {template}"
    );
    step(
        started,
        &format!(
            "agents rolled under load (new knobs honoured): {} requests through the hub (applies, 4 s watches), none cut; the stopping pods had {} operations or tunnelled requests in flight at SIGTERM and sent {} operation results while draining; no LIST; every write in the hub's list",
            rolled.operations, rolled.in_flight_at_sigterm, rolled.results_sent_while_draining
        ),
    );

    // The hub pod deleted: its replacement (same volume) resumes, with the same tokens.
    let old_hub = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=hub",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    drop(forward);
    let lists_before = agent_lists(&node)?;
    ensure!(
        !lists_before.is_empty(),
        "the audit log holds no list request of the agents' ServiceAccount: the check below would prove nothing"
    );
    cli.kubectl(&["-n", NAMESPACE, "delete", "pod", &old_hub, "--wait=true"])?;
    wait_rollout(&cli, "scale-agent-hub")?;
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Ready",
        "pod",
        "-l",
        "app.kubernetes.io/component=hub",
        "--timeout=180s",
    ])?;
    step(started, "the hub's replacement pod is Ready");
    let forward = PortForward::start(&cli, NAMESPACE, "scale-agent-hub", 8443)?;
    cli.apply(&config_map("after-hub-restart"))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = hub.run(
            &cli,
            &forward,
            &["-n", "team-a", "get", "configmaps", "-o", "name"],
            None,
        );
        match listed {
            Ok(listed) if listed.contains("configmap/after-hub-restart\n") => break,
            other => ensure!(
                Instant::now() < deadline,
                "the new hub pod does not list team-a's ConfigMaps through the agents 2 min after it started: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "wait",
        "--for=condition=Connected",
        "agentaccount/real-node",
        "--timeout=120s",
    ])?;
    drop(forward);
    // From the API server's side: the agents resumed their watches where they were and
    // listed nothing again for the new hub pod.
    let lists_after = agent_lists(&node)?;
    if lists_after != lists_before {
        let mut logs = String::new();
        for selector in [
            "app.kubernetes.io/instance=real-node",
            "app.kubernetes.io/component=hub",
        ] {
            logs.push_str(
                &cli.kubectl(&[
                    "-n",
                    NAMESPACE,
                    "logs",
                    "-l",
                    selector,
                    "--tail=400",
                    "--prefix",
                    "--all-containers",
                ])
                .unwrap_or_else(|e| e.to_string()),
            );
        }
        bail!(
            "the agents listed again after the hub pod was replaced: {} list requests before, {} after: {:?}\n{logs}",
            lists_before.len(),
            lists_after.len(),
            &lists_after[lists_before.len().min(lists_after.len())..]
        );
    }
    step(
        started,
        "the agents resumed with the new hub pod (the old kubeconfig's token still works)",
    );

    upgrade::upgrade_release(&node, &cli, &hub, &chart)?;
    step(
        started,
        "helm upgrade rolled the operator and hub pods; the agents resumed without a LIST",
    );

    // Last of the agents' checks: turning podMetrics off changes the agents' config.
    let metrics = pod_metrics::top_through_the_hub(&node, &cli, &hub)?;
    step(
        started,
        &format!(
            "kubectl top pod --containers: {} containers directly and through the hub (kubectl 1.37 and 1.22), metrics {:.1} s after asking; refused with the API server's 403 without podMetrics",
            metrics.containers,
            metrics.first_metrics.as_secs_f64()
        ),
    );

    // `kubectl top node` for a Cluster-scoped agent, refused for a namespace-scoped one.
    let top = cluster_metrics::top_node_through_the_hub(&node, &cli, &dir, &hub_ip)?;
    step(
        started,
        &format!(
            "kubectl top node, top node NAME and top pod -A --containers through a Cluster-scoped agent equal in shape to directly ({top}); the namespace-scoped account's kubectl top node refused by its agent at once"
        ),
    );

    no_restarts(&cli)?;
    // For the record (a failing probe before a pod is Ready is a Warning too).
    let warnings = cli.kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector=type=Warning",
        "-o",
        "custom-columns=NAMESPACE:.metadata.namespace,OBJECT:.involvedObject.name,REASON:.reason,COUNT:.count,MESSAGE:.message",
    ])?;
    eprintln!("[real-node test] Warning events:\n{warnings}");

    // The operator's Lease, made at run time, is owned by its Deployment (so it goes below).
    let lease_owner = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "lease",
        "scale-agent-operator",
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    ])?;
    ensure!(
        lease_owner == "Deployment/scale-agent-operator",
        "the operator's Lease is owned by {lease_owner:?}"
    );

    // Uninstalled as documented: the accounts and agents first, then the release. Nothing
    // of the chart's or the operator's is left.
    cli.kubectl(&[
        "-n",
        NAMESPACE,
        "delete",
        "scaleagents,agentaccounts",
        "--all",
        "--wait=true",
        "--timeout=120s",
    ])?;
    cli.helm(&[
        "uninstall",
        "scale-agent",
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "3m",
    ])?;
    // The operator makes its leader-election Lease at run time, owned by its Deployment: the
    // garbage collector deletes it with the Deployment, as it deletes the pods.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = cli.kubectl(&["-n", NAMESPACE, "get", "pods,leases", "-o", "name"])?;
        if left.trim().is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "pods or the operator's Lease left 2 min after helm uninstall:\n{left}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let labelled = cli.kubectl(&[
        "get",
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,persistentvolumeclaims,leases,poddisruptionbudgets,validatingadmissionpolicies,validatingadmissionpolicybindings",
        "-A",
        "-l",
        "app.kubernetes.io/part-of=scale-agent",
        "-o",
        "name",
    ])?;
    ensure!(
        labelled.trim().is_empty(),
        "left behind by helm uninstall:\n{labelled}"
    );
    let left = cli.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,persistentvolumeclaims,leases",
        "-o",
        "name",
    ])?;
    let expected = [
        "configmap/kube-root-ca.crt",
        "secret/scale-agent-hub-tls",
        "secret/hub-ca",
        "secret/real-node-enrolment",
        "secret/cluster-metrics-enrolment",
        "secret/team-metrics-enrolment",
        "secret/registry-credentials",
        "serviceaccount/default",
    ];
    let unexpected: Vec<&str> = left
        .lines()
        .filter(|line| !expected.contains(line))
        .collect();
    ensure!(
        unexpected.is_empty(),
        "left in {NAMESPACE} after deleting the ScaleAgent and helm uninstall: {unexpected:?}"
    );
    step(started, "helm uninstall left nothing behind");

    drop(node);
    step(started, "done");
    Ok(())
}
