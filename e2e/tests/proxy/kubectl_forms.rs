//! Clouddriver's kubectl command forms through the proxy and directly, with kubectl 1.37, 1.29
//! and 1.22: the same outcomes.

use super::*;

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
