//! The Kubernetes API proxy on a real control plane (with KWOK, so pods run, roll out and
//! have logs), with real clients: kubectl of three minors (the harness's own and the
//! 1.22 and 1.29 Clouddriver ships) and Helm, through `https://<hub>/clusters/<account>`:
//! the hub's TLS listener, the tunnel over the agent's existing stream, and the agent
//! replaying each request as its own ServiceAccount under real RBAC.
//!
//! The kubectl test runs every command form Clouddriver runs (`KubectlJobExecutor`, see
//! `../shared/reference/spinnaker-and-kubectl.md`) twice, in two fresh namespaces: directly
//! against the API server with the agent's own credentials, and through the proxy, and
//! compares exit codes, stdout and stderr once the namespace, uids, resourceVersions, times
//! and controller-written status are masked ([`scale_agent_e2e::kubectl::normalize`]).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Secret},
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions,
    fixtures::{self, TlsHub, temp_dir},
    kubectl::{self, Kubectl, Outcome},
    process::{self, ManagedProcess},
};
use serde_json::{Value, json};

const AGENT: &str = env!("CARGO_BIN_EXE_e2e-agent");
const HUB: &str = env!("CARGO_BIN_EXE_e2e-hub");
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
const WAIT: Duration = Duration::from_secs(60);

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_kwok().with_audit()
    })?)
}

fn init_logs() {
    scale_agent_e2e::fixtures::init_logs("warn,scale_agent_hub_proxy=info");
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A ServiceAccount with [`fixtures::admin_rules`], and a kubeconfig of it in `dir`.
async fn agent_identity(
    admin: &Client,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    fixtures::service_account_identity(
        control_plane()?,
        admin,
        namespace,
        name,
        fixtures::Scope::Cluster,
        fixtures::admin_rules(),
        dir.join(format!("{name}.kubeconfig")),
    )
    .await
}

/// An agent account entry: cluster-wide, streaming only ConfigMaps (the proxy does not need
/// the cache; fewer watches keep the tests light).
fn account_entry(name: &str, kubeconfig: &Path) -> Value {
    json!({
        "name": name,
        "kubeconfigFile": kubeconfig.display().to_string(),
        "kinds": ["configmaps"],
        // Helm keeps releases in Secrets: only accounts named helm-… opt in to Secret data
        // through the proxy, the others show the default.
        "allowSecretData": name.starts_with("helm-"),
    })
}

/// A unique account name for this test run.
fn account_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// The hub, and one in-process agent serving `accounts` with the agent's credentials.
struct Setup {
    admin: Client,
    dir: PathBuf,
    hub: TlsHub,
    /// The agent's own kubeconfig: "direct" commands use it, so both sides act as the same
    /// identity.
    direct: PathBuf,
    agent: Option<scale_agent::AgentHandle>,
}

impl Setup {
    async fn new(name: &str, accounts: &[&str]) -> anyhow::Result<Setup> {
        init_logs();
        let control_plane = control_plane()?;
        let admin = control_plane.client().await?;
        let home = control_plane
            .namespace(&admin, &format!("proxy-{name}"))
            .await?;
        let dir = temp_dir(&format!("proxy-{name}"))?;
        let direct = agent_identity(&admin, &home, "agent", &dir).await?;
        let hub = TlsHub::start(&dir, |_| {}).await?;
        let config = dir.join("agent.yaml");
        fixtures::write_plaintext_agent_config(
            &config,
            hub.hub.grpc_addr,
            Value::Array(accounts.iter().map(|a| account_entry(a, &direct)).collect()),
            2,
        )?;
        let agent = fixtures::start_agent_replica(&config, &format!("{name}-0")).await?;
        for account in accounts {
            hub.wait_connected(account, 1).await?;
        }
        Ok(Setup {
            admin,
            dir,
            hub,
            direct,
            agent: Some(agent),
        })
    }

    async fn kubeconfig(&self, account: &str, token_name: &str) -> anyhow::Result<PathBuf> {
        self.hub
            .kubeconfig(
                account,
                token_name,
                &self.dir.join(format!("{account}-{token_name}.kubeconfig")),
            )
            .await
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(agent) = self.agent.take() {
            agent.stop().await?;
        }
        self.hub.hub.shutdown().await?;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// Waits until every Deployment in `namespace` is observed and, unless paused, fully
/// rolled out (so the next command sees the same cluster on both sides).
async fn settle(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(admin.clone(), namespace);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let deployments = api.list(&ListParams::default()).await?;
        let unsettled: Vec<String> = deployments
            .items
            .iter()
            .filter(|d| {
                let generation = d.metadata.generation.unwrap_or(0);
                let wanted = d.spec.replicas.unwrap_or(1);
                let paused = d.spec.paused.unwrap_or(false);
                let status = d.status.clone().unwrap_or_default();
                let observed = status.observed_generation.unwrap_or(0) >= generation;
                let rolled_out = status.updated_replicas.unwrap_or(0) == wanted
                    && status.replicas.unwrap_or(0) == wanted
                    && status.available_replicas.unwrap_or(0) == wanted;
                !(observed && (paused || rolled_out))
            })
            .map(|d| d.metadata.name.clone().unwrap_or_default())
            .collect();
        if unsettled.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "deployments {unsettled:?} in {namespace} never settled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How a step's outcomes are compared.
#[derive(Clone, Debug)]
enum View {
    /// Exit code, normalized stdout and stderr messages.
    Exact,
    /// Events: exit code and the set of (reason, involved object) of the items.
    Events,
    /// A list of cluster-wide objects other tests change too: both must succeed and
    /// contain this object (`{ns}`: the namespace).
    Contains(String),
}

/// One command form, with `{ns}` standing for the namespace.
struct Step {
    what: &'static str,
    args: Vec<String>,
    stdin: Option<String>,
    view: View,
}

fn step(what: &'static str, list: &[&str]) -> Step {
    Step {
        what,
        args: args(list),
        stdin: None,
        view: View::Exact,
    }
}

fn with_stdin(mut step: Step, stdin: Value) -> Step {
    step.stdin = Some(stdin.to_string());
    step
}

fn viewed(mut step: Step, view: View) -> Step {
    step.view = view;
    step
}

fn deployment(image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "web", "labels": { "app": "web" } },
        "spec": {
            "replicas": 1,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": image }] },
            },
        },
    })
}

/// The forms of `KubectlJobExecutor`, in the order a pipeline would run them.
fn clouddriver_forms(crd_group: &str) -> Vec<Step> {
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "web", "labels": { "app": "web" } },
        "spec": { "selector": { "app": "web" }, "ports": [{ "port": 80 }] },
    });
    let config = |colour: &str| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "web-config", "labels": { "app": "web" } },
            "data": { "colour": colour },
        })
    };
    let generated = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "generateName": "web-run-", "labels": { "app": "web" } },
        "data": { "run": "1" },
    });
    let widget = json!({
        "apiVersion": format!("{crd_group}/v1"), "kind": "Widget",
        "metadata": { "name": "w1", "labels": { "app": "web" } },
        "spec": { "size": 3 },
    });
    let widget_get = format!("widget.{crd_group}");
    let widget_list = format!("widgets.{crd_group}");
    vec![
        with_stdin(
            step(
                "apply (client-side) a Deployment",
                &["apply", "-o", "json", "-f", "-"],
            ),
            deployment("registry.example/web:1.0"),
        ),
        with_stdin(
            step("apply a Service", &["apply", "-o", "json", "-f", "-"]),
            service,
        ),
        with_stdin(
            step("apply a ConfigMap", &["apply", "-o", "json", "-f", "-"]),
            config("blue"),
        ),
        with_stdin(
            step(
                "apply a custom resource (kind.group)",
                &["apply", "-o", "json", "-f", "-"],
            ),
            widget,
        ),
        step(
            "get one object",
            &["-o", "json", "get", "deployment", "web"],
        ),
        step(
            "get a custom resource by kind.group",
            &["-o", "json", "get", &widget_get, "w1"],
        ),
        step(
            "list several kinds with a label selector",
            &[
                "-o",
                "json",
                "get",
                "deployment,replicaset,service,configmap",
                "-l=app=web",
            ],
        ),
        viewed(
            step(
                "events of an object by field selector",
                &[
                    "-o",
                    "json",
                    "get",
                    "event",
                    "--field-selector",
                    "involvedObject.name=web,involvedObject.kind=Deployment",
                ],
            ),
            View::Events,
        ),
        with_stdin(
            step(
                "apply server-side, forcing conflicts",
                &[
                    "apply",
                    "--server-side=true",
                    "--force-conflicts=true",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
            ),
            deployment("registry.example/web:1.1"),
        ),
        with_stdin(
            step("replace", &["replace", "-o", "json", "-f", "-"]),
            config("green"),
        ),
        with_stdin(
            step(
                "create (generateName)",
                &["create", "-o", "json", "-f", "-"],
            ),
            generated,
        ),
        step(
            "patch: strategic merge",
            &[
                "patch",
                "deployment",
                "web",
                "--type",
                "strategic",
                "--patch",
                r#"{"spec":{"template":{"metadata":{"labels":{"tier":"front"}}}}}"#,
            ],
        ),
        step(
            "patch: merge",
            &[
                "patch",
                "deployment",
                "web",
                "--type",
                "merge",
                "--patch",
                r#"{"metadata":{"annotations":{"team":"a"}}}"#,
            ],
        ),
        step(
            "patch: json",
            &[
                "patch",
                "deployment",
                "web",
                "--type",
                "json",
                "--patch",
                r#"[{"op":"add","path":"/metadata/labels/z","value":"1"}]"#,
            ],
        ),
        step("scale", &["scale", "deployment/web", "--replicas=3"]),
        step("rollout history", &["rollout", "history", "deployment/web"]),
        step(
            "rollout undo to a revision",
            &["rollout", "undo", "deployment/web", "--to-revision=1"],
        ),
        step("rollout pause", &["rollout", "pause", "deployment/web"]),
        step("rollout resume", &["rollout", "resume", "deployment/web"]),
        step("rollout restart", &["rollout", "restart", "deployment/web"]),
        step(
            "rollout status",
            &["rollout", "status", "deployment/web", "--timeout=60s"],
        ),
        step(
            "logs of a pod's container",
            &["logs", "logger", "-c", "main"],
        ),
        step(
            "get the namespace",
            &["-o", "json", "get", "namespace", "{ns}"],
        ),
        viewed(
            step("list namespaces", &["-o", "json", "get", "namespace"]),
            View::Contains("{ns}".into()),
        ),
        viewed(
            step(
                "list CRDs",
                &["-o", "json", "get", "customresourcedefinition"],
            ),
            View::Contains(widget_list),
        ),
        step("top (no metrics API)", &["top", "pod", "--containers"]),
        step(
            "get a missing object (NotFound)",
            &["-o", "json", "get", "deployment", "nope"],
        ),
        step(
            "get an empty list (No resources found)",
            &["-o", "json", "get", "statefulset"],
        ),
        step(
            "delete by name, waiting",
            &[
                "delete",
                "deployment/web",
                "--ignore-not-found=true",
                "--cascade=background",
            ],
        ),
        step(
            "delete by label selector",
            &[
                "delete",
                "configmap",
                "-l=app=web",
                "--ignore-not-found=true",
            ],
        ),
        step(
            "delete a missing object",
            &["delete", "service/nope", "--ignore-not-found=true"],
        ),
    ]
}

/// What a step gave, in the form it is compared in.
fn view(step: &Step, outcome: &Outcome, namespace: &str) -> String {
    let code = outcome.code.unwrap_or(-1);
    match &step.view {
        View::Exact => {
            let clean = |text: &str| {
                kubectl::mask_generated(&kubectl::normalize(text, namespace), "web-run-")
            };
            format!(
                "exit {code}\nstdout:\n{}\nstderr:\n{}",
                clean(&outcome.stdout),
                clean(&outcome.messages())
            )
        }
        View::Events => {
            let list: Value = serde_json::from_str(&outcome.stdout).unwrap_or_default();
            let reasons: BTreeSet<String> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| format!("{} {}", e["reason"], e["involvedObject"]["name"]))
                .collect();
            format!("exit {code} {reasons:?}")
        }
        View::Contains(template) => {
            let name = template.replace("{ns}", namespace);
            let list: Value = serde_json::from_str(&outcome.stdout).unwrap_or_default();
            let found = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|i| i["metadata"]["name"] == name.as_str());
            format!("exit {code} contains {template:?}: {found}")
        }
    }
}

/// A CRD of a group of its own (cluster-scoped, shared by the test's namespaces).
async fn install_widget_crd(admin: &Client, group: &str) -> anyhow::Result<()> {
    let crd = scale_agent_e2e::crds::schemaless_crd(group, "Widget", "widgets");
    scale_agent_e2e::crds::install(admin, &[crd]).await?;
    Ok(())
}

/// A bare pod `logger` (container `main`) with a log line, so `kubectl logs` has something
/// to show; kwok runs it.
async fn logger_pod(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    let log = control_plane()?.pod_log(admin, namespace, "logger").await?;
    log.append("hello from the logger")?;
    run_logger(admin, namespace).await
}

/// Creates the bare pod `logger` and waits until kwok runs it (its log file, if any, was
/// made already).
async fn run_logger(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    Ok(scale_agent_e2e::kwok::run_logger(admin, namespace, WAIT).await?)
}

/// Runs the forms with `binary` directly and through the proxy and compares them; writes
/// the requests kubectl sent through the proxy (`-v=6`) to the test's temporary directory.
async fn forms_match(version: &str, binary: PathBuf) -> anyhow::Result<()> {
    let account = account_name(&format!("forms-{}", version.replace('.', "")));
    let setup = Setup::new(&format!("forms-{}", version.replace('.', "")), &[&account]).await?;
    let proxy = setup.kubeconfig(&account, "clouddriver-test").await?;
    let group = format!("proxy{}.example.com", rand::random::<u32>());
    install_widget_crd(&setup.admin, &group).await?;
    let control_plane = control_plane()?;
    let direct_ns = control_plane
        .namespace(
            &setup.admin,
            &format!("direct-{}", version.replace('.', "")),
        )
        .await?;
    let proxy_ns = control_plane
        .namespace(
            &setup.admin,
            &format!("proxied-{}", version.replace('.', "")),
        )
        .await?;
    logger_pod(&setup.admin, &direct_ns).await?;
    logger_pod(&setup.admin, &proxy_ns).await?;
    let direct_kubectl = Kubectl::new(binary.clone(), setup.dir.join("home-direct"));
    let proxy_kubectl = Kubectl::new(binary, setup.dir.join("home-proxy"));
    let server = format!("{}/clusters/{account}", setup.hub.url);
    let mut requests = BTreeSet::new();
    let mut mismatches = Vec::new();
    for step in clouddriver_forms(&group) {
        let mut outcomes = Vec::new();
        for (kubectl, kubeconfig, namespace) in [
            (&direct_kubectl, &setup.direct, &direct_ns),
            (&proxy_kubectl, &proxy, &proxy_ns),
        ] {
            let mut full = vec![format!("--namespace={namespace}"), "-v=6".to_string()];
            full.extend(step.args.iter().map(|a| a.replace("{ns}", namespace)));
            let outcome = kubectl
                .run(kubeconfig, &full, step.stdin.as_deref(), KUBECTL_TIMEOUT)
                .await?;
            if kubeconfig == &proxy {
                for r in kubectl::requests(&outcome.stderr, &server) {
                    requests.insert(format!(
                        "{} {} {}",
                        r.method,
                        kubectl::request_shape(&r.path, namespace),
                        r.status
                    ));
                }
            }
            settle(&setup.admin, namespace).await?;
            outcomes.push(view(&step, &outcome, namespace));
        }
        if outcomes[0] != outcomes[1] {
            mismatches.push(format!(
                "{} ({}):\n--- direct\n{}\n--- through the proxy\n{}",
                step.what,
                step.args.join(" "),
                outcomes[0],
                outcomes[1]
            ));
        }
    }
    let inventory = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("proxy-requests-kubectl-{version}.txt"));
    std::fs::write(
        &inventory,
        requests.iter().cloned().collect::<Vec<_>>().join("\n") + "\n",
    )?;
    eprintln!(
        "[proxy] kubectl {version}: {} distinct requests through the proxy, listed in {}",
        requests.len(),
        inventory.display()
    );
    anyhow::ensure!(
        mismatches.is_empty(),
        "kubectl {version}: {} of the forms differ through the proxy:\n{}",
        mismatches.len(),
        mismatches.join("\n\n")
    );
    // The proxy itself refused nothing: every answer came from the API server.
    let refused: Vec<&String> = requests
        .iter()
        .filter(|r| {
            r.ends_with(" 502") || r.ends_with(" 503") || r.ends_with(" 504") || r.ends_with(" 405")
        })
        .collect();
    anyhow::ensure!(
        refused.is_empty(),
        "requests the proxy refused: {refused:?}"
    );
    setup.stop().await
}

#[tokio::test]
async fn clouddriver_kubectl_forms_match_direct_with_the_current_kubectl() -> anyhow::Result<()> {
    let binaries = control_plane()?.binaries();
    forms_match(scale_agent_e2e::KUBERNETES_VERSION, binaries.kubectl()).await
}

#[tokio::test]
async fn clouddriver_kubectl_forms_match_direct_with_kubectl_1_29() -> anyhow::Result<()> {
    let binaries = control_plane()?.binaries();
    forms_match("v1.29", binaries.kubectl_client(29)).await
}

#[tokio::test]
async fn clouddriver_kubectl_forms_match_direct_with_kubectl_1_22() -> anyhow::Result<()> {
    let binaries = control_plane()?.binaries();
    forms_match("v1.22", binaries.kubectl_client(22)).await
}

/// A small chart: a Deployment and a Service whose image tag is a value.
fn write_chart(dir: &Path) -> anyhow::Result<PathBuf> {
    let chart = dir.join("web-chart");
    std::fs::create_dir_all(chart.join("templates"))?;
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: web\nversion: 0.1.0\n",
    )?;
    std::fs::write(chart.join("values.yaml"), "tag: \"1.0\"\nreplicas: 2\n")?;
    std::fs::write(
        chart.join("templates/deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}-web\n\
         spec:\n  replicas: {{ .Values.replicas }}\n  selector:\n    matchLabels: {app: {{ .Release.Name }}}\n\
         \x20 template:\n    metadata:\n      labels: {app: {{ .Release.Name }}}\n    spec:\n\
         \x20     containers:\n      - name: web\n        image: registry.example/web:{{ .Values.tag }}\n",
    )?;
    std::fs::write(
        chart.join("templates/service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}-web\nspec:\n\
         \x20 selector: {app: {{ .Release.Name }}}\n  ports:\n  - port: 80\n",
    )?;
    Ok(chart)
}

async fn helm(dir: &Path, kubeconfig: &Path, list: &[&str]) -> anyhow::Result<Outcome> {
    let binary = control_plane()?.binaries().helm();
    let output = tokio::process::Command::new(binary)
        .args(list)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("HELM_CACHE_HOME", dir.join("helm-cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm-config"))
        .env("HELM_DATA_HOME", dir.join("helm-data"))
        .env("HOME", dir)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(180), output).await??;
    Ok(Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

fn ensure_ok(what: &str, outcome: &Outcome) -> anyhow::Result<()> {
    anyhow::ensure!(
        outcome.success(),
        "{what} failed ({:?}):\n{}\n{}",
        outcome.code,
        outcome.stdout,
        outcome.stderr
    );
    Ok(())
}

#[tokio::test]
async fn helm_installs_upgrades_rolls_back_and_uninstalls_through_the_proxy() -> anyhow::Result<()>
{
    let account = account_name("helm");
    let plain = account_name("nohelm");
    let setup = Setup::new("helm", &[&account, &plain]).await?;
    let kubeconfig = setup.kubeconfig(&account, "helm").await?;
    let namespace = control_plane()?.namespace(&setup.admin, "helm").await?;
    let chart = write_chart(&setup.dir)?;
    let chart = chart.display().to_string();
    let ns = format!("--namespace={namespace}");

    // Without allowSecretData on its account, Helm cannot read or write its release
    // Secrets through the proxy, and says why.
    let refused = helm(
        &setup.dir,
        &setup.kubeconfig(&plain, "helm").await?,
        &["install", "rel", &chart, &ns, "--wait", "--timeout=1m"],
    )
    .await?;
    anyhow::ensure!(
        !refused.success() && refused.stderr.contains("allowSecretData"),
        "helm install without the opt-in: {refused:?}"
    );
    ensure_ok(
        "helm install --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &["install", "rel", &chart, &ns, "--wait", "--timeout=2m"],
        )
        .await?,
    )?;
    let deployments: Api<Deployment> = Api::namespaced(setup.admin.clone(), &namespace);
    let web = deployments.get("rel-web").await?;
    assert_eq!(
        web.status.and_then(|s| s.available_replicas),
        Some(2),
        "--wait returned before the Deployment was available"
    );
    ensure_ok(
        "helm upgrade --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &[
                "upgrade",
                "rel",
                &chart,
                &ns,
                "--set",
                "tag=1.1",
                "--wait",
                "--timeout=2m",
            ],
        )
        .await?,
    )?;
    let image = |d: &Deployment| {
        d.spec
            .template
            .spec
            .as_ref()
            .map(|s| s.containers[0].image.clone().unwrap_or_default())
            .unwrap_or_default()
    };
    assert_eq!(
        image(&deployments.get("rel-web").await?),
        "registry.example/web:1.1"
    );
    ensure_ok(
        "helm rollback --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &["rollback", "rel", "1", &ns, "--wait", "--timeout=2m"],
        )
        .await?,
    )?;
    assert_eq!(
        image(&deployments.get("rel-web").await?),
        "registry.example/web:1.0"
    );
    // The release records are where Helm keeps them: Secrets of type helm.sh/release.v1 in
    // the release's namespace, one per revision.
    let secrets: Api<Secret> = Api::namespaced(setup.admin.clone(), &namespace);
    let releases = secrets
        .list(&ListParams::default().labels("owner=helm,name=rel"))
        .await?;
    let mut names: Vec<String> = releases
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "sh.helm.release.v1.rel.v1",
            "sh.helm.release.v1.rel.v2",
            "sh.helm.release.v1.rel.v3"
        ]
    );
    assert!(
        releases
            .items
            .iter()
            .all(|s| s.type_.as_deref() == Some("helm.sh/release.v1"))
    );
    let history = helm(&setup.dir, &kubeconfig, &["history", "rel", &ns]).await?;
    ensure_ok("helm history", &history)?;
    assert!(
        history.stdout.contains("Rollback to 1"),
        "{}",
        history.stdout
    );
    ensure_ok(
        "helm uninstall --wait",
        &helm(
            &setup.dir,
            &kubeconfig,
            &["uninstall", "rel", &ns, "--wait"],
        )
        .await?,
    )?;
    assert!(deployments.get_opt("rel-web").await?.is_none());
    let left = secrets
        .list(&ListParams::default().labels("owner=helm,name=rel"))
        .await?;
    assert!(
        left.items.is_empty(),
        "release records left after uninstall"
    );
    setup.stop().await
}

/// A running kubectl whose stdout is read line by line.
struct Follower {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    stderr: tokio::task::JoinHandle<String>,
}

impl Follower {
    async fn start(kubectl: &Kubectl, kubeconfig: &Path, list: &[String]) -> anyhow::Result<Self> {
        use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
        std::fs::create_dir_all(&kubectl.home)?;
        let mut child = tokio::process::Command::new(&kubectl.binary)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(list)
            .env("HOME", &kubectl.home)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        Ok(Follower {
            child,
            lines,
            stderr,
        })
    }

    /// Waits for a line containing `needle`.
    async fn expect(&mut self, needle: &str) -> anyhow::Result<()> {
        self.line(needle).await.map(drop)
    }

    /// Waits for a line containing `needle` and returns it.
    async fn line(&mut self, needle: &str) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .map_err(|_| anyhow::anyhow!("no line with {needle:?} within {WAIT:?}"))?
                .ok_or_else(|| anyhow::anyhow!("the output ended before a line with {needle:?}"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    /// Waits for kubectl to exit; its exit code and stderr.
    async fn exited(mut self) -> anyhow::Result<(Option<i32>, String)> {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .map_err(|_| anyhow::anyhow!("kubectl did not exit within {WAIT:?}"))??;
        Ok((status.code(), self.stderr.await?))
    }
}

async fn create_configmap(admin: &Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), namespace);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm).await?;
    Ok(())
}

#[tokio::test]
async fn watches_and_logs_stream_and_end_cleanly_when_their_agent_dies() -> anyhow::Result<()> {
    // Accounts `doomed` (its own agent, a process killed with SIGKILL) and `steady` and
    // `sibling` (one in-process agent; they share its stream).
    let doomed = account_name("doomed");
    let steady = account_name("steady");
    let sibling = account_name("sibling");
    let setup = Setup::new("watch", &[&steady, &sibling]).await?;
    let config = setup.dir.join("doomed-agent.yaml");
    fixtures::write_plaintext_agent_config(
        &config,
        setup.hub.hub.grpc_addr,
        json!([account_entry(&doomed, &setup.direct)]),
        2,
    )?;
    let admin_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut doomed_agent = ManagedProcess::spawn(
        "e2e-agent",
        Path::new(AGENT),
        &[
            format!("--config={}", config.display()),
            "--replica=doomed-0".into(),
            format!("--admin-addr={admin_addr}"),
        ],
        setup.dir.join("doomed-agent.log"),
    )?;
    setup.hub.wait_connected(&doomed, 1).await?;

    let control_plane = control_plane()?;
    let namespace = control_plane.namespace(&setup.admin, "watched").await?;
    let kubectl = Kubectl::new(control_plane.binaries().kubectl(), setup.dir.join("home"));
    let ns = format!("--namespace={namespace}");
    let watch_args = args(&["get", "configmaps", "-w", "-o", "name", &ns]);
    let doomed_kubeconfig = setup.kubeconfig(&doomed, "watch").await?;
    let steady_kubeconfig = setup.kubeconfig(&steady, "watch").await?;
    let sibling_kubeconfig = setup.kubeconfig(&sibling, "watch").await?;
    let mut doomed_watch = Follower::start(&kubectl, &doomed_kubeconfig, &watch_args).await?;
    let mut steady_watch = Follower::start(&kubectl, &steady_kubeconfig, &watch_args).await?;
    let mut sibling_watch = Follower::start(&kubectl, &sibling_kubeconfig, &watch_args).await?;

    // A change reaches every watch.
    create_configmap(&setup.admin, &namespace, "first").await?;
    doomed_watch.expect("configmap/first").await?;
    steady_watch.expect("configmap/first").await?;
    sibling_watch.expect("configmap/first").await?;

    // A followed log streams what the pod writes after kubectl started.
    let log = control_plane
        .pod_log(&setup.admin, &namespace, "logger")
        .await?;
    run_logger(&setup.admin, &namespace).await?;
    let mut follow = Follower::start(
        &kubectl,
        &doomed_kubeconfig,
        &args(&["logs", "-f", "logger", "-c", "main", &ns]),
    )
    .await?;
    log.append("line one")?;
    follow.expect("line one").await?;
    log.append("line two, after the follower started")?;
    follow.expect("line two").await?;

    // Killing the agent ends its account's watch and log follow cleanly (kubectl sees the
    // stream end, as when the API server ends a watch), and the account answers 503.
    process::send_signal(doomed_agent.pid(), libc::SIGKILL);
    doomed_agent.stop(Duration::from_secs(5));
    // Exit 0 and nothing on stderr is what kubectl does when the API server ends a watch;
    // a broken stream gives "unexpected EOF" or "INTERNAL_ERROR" and a non-zero exit.
    let (code, stderr) = doomed_watch.exited().await?;
    assert_eq!(
        (code, stderr.trim()),
        (Some(0), ""),
        "the watch did not end cleanly"
    );
    let (code, stderr) = follow.exited().await?;
    assert_eq!(
        (code, stderr.trim()),
        (Some(0), ""),
        "the log follow did not end cleanly"
    );
    // A plain `kubectl get` (a Table) is printed from the cache the hub holds for the grace
    // period, flagged stale (issue 30: it used to be tunnelled, and failed); a write has
    // nobody to run it and answers 503.
    let after = kubectl
        .run(
            &doomed_kubeconfig,
            &args(&["get", "configmaps", &ns]),
            None,
            KUBECTL_TIMEOUT,
        )
        .await?;
    assert!(
        after.success() && after.stdout.contains("first") && after.stderr.contains("no agent"),
        "{}\n{}",
        after.stdout,
        after.stderr
    );
    let write = kubectl
        .run(
            &doomed_kubeconfig,
            &args(&["create", "configmap", "refused", &ns]),
            None,
            KUBECTL_TIMEOUT,
        )
        .await?;
    assert!(!write.success());
    assert!(
        write.stderr.contains("no agent") && write.stderr.contains("writes need a connected agent"),
        "{}",
        write.stderr
    );

    // The other accounts' watches go on, and one client going away on the shared stream
    // leaves its sibling's watch alone.
    create_configmap(&setup.admin, &namespace, "second").await?;
    steady_watch.expect("configmap/second").await?;
    sibling_watch.expect("configmap/second").await?;
    drop(steady_watch);
    create_configmap(&setup.admin, &namespace, "third").await?;
    sibling_watch.expect("configmap/third").await?;
    drop(sibling_watch);
    setup.stop().await
}

/// `scale-agent-hub <args>` (the admin commands) against the test's hub.
async fn hub_cli(hub: &TlsHub, list: &[&str]) -> anyhow::Result<Outcome> {
    let output = tokio::process::Command::new(HUB)
        .args(list)
        .arg(format!("--hub-url={}", hub.url))
        .arg(format!("--ca-file={}", hub.ca_file.display()))
        .arg(format!(
            "--admin-token-file={}",
            hub.admin_token_file.display()
        ))
        .kill_on_drop(true)
        .output()
        .await?;
    Ok(Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

#[tokio::test]
async fn tokens_are_checked_for_real_clients() -> anyhow::Result<()> {
    let prod = account_name("tok-prod");
    let staging = account_name("tok-staging");
    let setup = Setup::new("tokens", &[&prod, &staging]).await?;
    let kubectl = Kubectl::new(
        control_plane()?.binaries().kubectl(),
        setup.dir.join("home"),
    );
    let get = args(&["get", "namespaces", "-o", "name"]);

    // A kubeconfig from the command line works.
    let file = setup.dir.join("prod-cli.kubeconfig");
    let issued = hub_cli(
        &setup.hub,
        &[
            "kubeconfig",
            "--account",
            &prod,
            "--token-name",
            "alice",
            "-o",
            &file.display().to_string(),
        ],
    )
    .await?;
    ensure_ok("scale-agent-hub kubeconfig", &issued)?;
    ensure_ok(
        "kubectl with the CLI's kubeconfig",
        &kubectl.run(&file, &get, None, KUBECTL_TIMEOUT).await?,
    )?;

    // Another account's token: Forbidden, naming both accounts.
    let text = std::fs::read_to_string(&file)?;
    let other = setup.dir.join("wrong-account.kubeconfig");
    std::fs::write(
        &other,
        text.replace(
            &format!("/clusters/{prod}"),
            &format!("/clusters/{staging}"),
        ),
    )?;
    let refused = kubectl.run(&other, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(
        refused.stderr.contains("(Forbidden)")
            && refused.stderr.contains(&prod)
            && refused.stderr.contains(&staging),
        "{}",
        refused.stderr
    );

    // An account the hub does not know: NotFound.
    let unknown = setup.dir.join("unknown.kubeconfig");
    let issued = hub_cli(
        &setup.hub,
        &[
            "kubeconfig",
            "--account",
            "nobody-here",
            "-o",
            &unknown.display().to_string(),
        ],
    )
    .await?;
    ensure_ok("kubeconfig for an account with no agent", &issued)?;
    let refused = kubectl.run(&unknown, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(refused.stderr.contains("(NotFound)"), "{}", refused.stderr);

    // A wrong token and no token: Unauthorized.
    let wrong = setup.dir.join("wrong-token.kubeconfig");
    let token_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .ok_or_else(|| anyhow::anyhow!("no token in {text}"))?;
    std::fs::write(
        &wrong,
        text.replace(token_line, "    token: sat_not-a-token"),
    )?;
    let refused = kubectl.run(&wrong, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(
        refused
            .stderr
            .contains("You must be logged in to the server"),
        "{}",
        refused.stderr
    );
    // No token: kubectl would prompt for credentials, so ask over HTTP.
    let response = setup
        .hub
        .call("GET", &format!("/clusters/{prod}/api/v1/namespaces"))
        .send()
        .await?;
    assert_eq!(response.status, 401, "{}", response.body);
    assert_eq!(response.json_or_null()["reason"], "Unauthorized");
    assert!(
        response
            .body
            .contains("scale-agent-hub kubeconfig --account"),
        "{}",
        response.body
    );

    // Revoked: the CLI lists the token, revokes it, and kubectl is refused at once.
    let listed = hub_cli(&setup.hub, &["token", "list"]).await?;
    ensure_ok("scale-agent-hub token list", &listed)?;
    let id = listed
        .stdout
        .lines()
        .find(|l| l.contains(&prod) && l.contains("alice"))
        .and_then(|l| l.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("alice's token is not listed:\n{}", listed.stdout))?
        .to_string();
    ensure_ok(
        "scale-agent-hub token revoke",
        &hub_cli(&setup.hub, &["token", "revoke", &id]).await?,
    )?;
    let refused = kubectl.run(&file, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(
        refused
            .stderr
            .contains("You must be logged in to the server"),
        "{}",
        refused.stderr
    );

    // The admin commands need the admin token.
    let forged = setup.dir.join("forged-admin-token");
    std::fs::write(&forged, "sat_forged")?;
    let output = tokio::process::Command::new(HUB)
        .args(["token", "list"])
        .arg(format!("--hub-url={}", setup.hub.url))
        .arg(format!("--ca-file={}", setup.hub.ca_file.display()))
        .arg(format!("--admin-token-file={}", forged.display()))
        .output()
        .await?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("not an API token of this hub"),
        "{stderr}"
    );
    setup.stop().await
}

/// Discovery requests (`/api`, `/apis`) kubectl sent that the API server received, as the
/// agent's ServiceAccount.
fn discovery_seen_by_the_api_server(user: &str) -> anyhow::Result<usize> {
    Ok(control_plane()?
        .audit_events()?
        .iter()
        .filter(|e| e.user.username == user && e.user_agent.starts_with("kubectl/"))
        .filter(|e| {
            let path = e.request_uri.split('?').next().unwrap_or("");
            path == "/api" || path == "/apis"
        })
        .count())
}

#[tokio::test]
async fn discovery_is_answered_by_the_hub_not_the_api_server() -> anyhow::Result<()> {
    let account = account_name("discovery");
    let setup = Setup::new("discovery", &[&account]).await?;
    let proxied = setup.kubeconfig(&account, "discovery").await?;
    let namespace = control_plane()?
        .namespace(&setup.admin, "discovery")
        .await?;
    let user = {
        // The agent's identity, as the API server names it.
        let text = std::fs::read_to_string(&setup.direct)?;
        let home = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("namespace: "))
            .map(str::to_string);
        match home {
            Some(ns) => format!("system:serviceaccount:{ns}:agent"),
            None => {
                let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    Api::all(setup.admin.clone());
                let sa = accounts
                    .list(&ListParams::default().fields("metadata.name=agent"))
                    .await?
                    .items
                    .into_iter()
                    .find(|sa| {
                        sa.metadata
                            .namespace
                            .as_deref()
                            .is_some_and(|ns| ns.starts_with("proxy-discovery"))
                    })
                    .ok_or_else(|| anyhow::anyhow!("the agent's ServiceAccount is missing"))?;
                format!(
                    "system:serviceaccount:{}:agent",
                    sa.metadata.namespace.unwrap_or_default()
                )
            }
        }
    };
    let list = args(&[
        "get",
        "configmaps",
        "-o",
        "name",
        &format!("--namespace={namespace}"),
    ]);
    // A fresh HOME each time: kubectl's own discovery cache is empty, so every run asks.
    let run = |kubeconfig: PathBuf, i: usize, side: &'static str| {
        let kubectl = Kubectl::new(
            control_plane()
                .map(|c| c.binaries().kubectl())
                .unwrap_or_default(),
            setup.dir.join(format!("home-{side}-{i}")),
        );
        let list = list.clone();
        async move { kubectl.run(&kubeconfig, &list, None, KUBECTL_TIMEOUT).await }
    };

    // Control: straight to the API server, every run reaches it.
    let before = discovery_seen_by_the_api_server(&user)?;
    for i in 0..3 {
        ensure_ok(
            "kubectl direct",
            &run(setup.direct.clone(), i, "direct").await?,
        )?;
    }
    let direct = discovery_seen_by_the_api_server(&user)? - before;
    assert!(
        direct >= 6,
        "three direct runs sent {direct} discovery requests as {user}, not 3 x 2"
    );

    // Through the proxy, the first run fills the hub's cache; the API server sees nothing
    // of the next two.
    let before = discovery_seen_by_the_api_server(&user)?;
    for i in 0..3 {
        ensure_ok(
            "kubectl through the proxy",
            &run(proxied.clone(), i, "proxy").await?,
        )?;
    }
    let proxied_count = discovery_seen_by_the_api_server(&user)? - before;
    assert_eq!(
        proxied_count, 2,
        "three runs through the proxy: the API server should see /api and /apis once"
    );
    let hit = setup
        .hub
        .call("GET", &format!("/clusters/{account}/api"))
        .bearer(&proxy_token(&proxied)?)
        .header(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )
        // What Go's transport adds: the cached document is kept as the server encoded it.
        .header("accept-encoding", "gzip")
        .send()
        .await?;
    assert_eq!(hit.header("x-scale-agent-cache"), Some("hit"));
    setup.stop().await
}

/// The bearer token of a proxy kubeconfig.
fn proxy_token(kubeconfig: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(kubeconfig)?
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("no token in {}", kubeconfig.display()))
}

#[tokio::test]
async fn exec_and_port_forward_work_through_the_proxy() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let account = account_name("exec");
    let setup = Setup::new("exec", &[&account]).await?;
    let proxied = setup.kubeconfig(&account, "exec").await?;
    let control_plane = control_plane()?;
    let namespace = control_plane.namespace(&setup.admin, "exec").await?;
    run_logger(&setup.admin, &namespace).await?;
    let ns = format!("--namespace={namespace}");

    // exec: kubectl 1.37 speaks WebSocket (v5.channel.k8s.io), 1.29 SPDY; kwok runs the
    // command on this host.
    for (label, binary) in [
        ("current", control_plane.binaries().kubectl()),
        ("1.29", control_plane.binaries().kubectl_client(29)),
    ] {
        let kubectl = Kubectl::new(binary, setup.dir.join(format!("home-exec-{label}")));
        let exec = args(&[
            "exec",
            "logger",
            "-c",
            "main",
            &ns,
            "--",
            "echo",
            "hello-from-exec",
        ]);
        let direct = kubectl
            .run(&setup.direct, &exec, None, KUBECTL_TIMEOUT)
            .await?;
        ensure_ok(&format!("kubectl {label} exec directly"), &direct)?;
        let through = kubectl.run(&proxied, &exec, None, KUBECTL_TIMEOUT).await?;
        ensure_ok(&format!("kubectl {label} exec through the proxy"), &through)?;
        assert_eq!(through.stdout.trim(), "hello-from-exec");
        assert_eq!(through.stdout, direct.stdout);
        // stdin crosses too. (`head -n 1`, not `cat`: kwok's local exec does not pass on
        // the end of stdin, directly or not, so `cat` would never exit.)
        let head = args(&[
            "exec", "-i", "logger", "-c", "main", &ns, "--", "head", "-n", "1",
        ]);
        let direct = kubectl
            .run(
                &setup.direct,
                &head,
                Some("typed into stdin\n"),
                KUBECTL_TIMEOUT,
            )
            .await?;
        ensure_ok(&format!("kubectl {label} exec -i directly"), &direct)?;
        let echoed = kubectl
            .run(&proxied, &head, Some("typed into stdin\n"), KUBECTL_TIMEOUT)
            .await?;
        ensure_ok(
            &format!("kubectl {label} exec -i through the proxy"),
            &echoed,
        )?;
        assert_eq!(echoed.stdout, "typed into stdin\n");
        assert_eq!(echoed.stdout, direct.stdout);
    }

    // port-forward: kwok echoes every forwarded port.
    let kubectl = Kubectl::new(
        control_plane.binaries().kubectl(),
        setup.dir.join("home-pf"),
    );
    let mut forward = Follower::start(
        &kubectl,
        &proxied,
        &args(&["port-forward", "pod/logger", ":8080", &ns]),
    )
    .await?;
    // "Forwarding from 127.0.0.1:43211 -> 8080"
    let line = forward.line("Forwarding from 127.0.0.1:").await?;
    let port: u16 = line
        .trim_start_matches("Forwarding from 127.0.0.1:")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .parse()?;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(b"ping through the hub\n").await?;
    let mut echoed = vec![0u8; "ping through the hub\n".len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut echoed)).await??;
    assert_eq!(echoed, b"ping through the hub\n");
    drop(stream);
    drop(forward);
    setup.stop().await
}
