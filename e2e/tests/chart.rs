//! The Helm chart installs for real: `helm lint --strict` passes, the values schema refuses
//! wrong values with a message naming them, and the chart with non-default values (hub on,
//! monitoring on, a watched namespace) installs on the test control plane with the real
//! `helm`, creating its CRDs, Deployments running this release's images, the monitoring
//! objects, and printing NOTES that say what to do next.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use scale_agent_e2e::{Binaries, ControlPlane, fixtures::temp_dir};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/helm/scale-agent")
}

fn run(program: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(program).args(args).output()?)
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `kubectl get <what> -o json` in `namespace`.
fn get(kubectl: &Path, kubeconfig: &str, namespace: &str, what: &str) -> anyhow::Result<Value> {
    let output = run(
        kubectl,
        &[
            "--kubeconfig",
            kubeconfig,
            "-n",
            namespace,
            "get",
            what,
            "-o",
            "json",
        ],
    )?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl get {what}: {}",
        text(&output)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Several replicas registering in Clouddriver through its API (one at a time), over TLS to
/// PostgreSQL with its CA from a Secret.
const REPLICAS_REGISTERING_OVER_TLS: &[&str] = &[
    "--set=hub.enabled=true",
    "--set=hub.store=postgres",
    "--set=hub.replicas=3",
    "--set=hub.postgres.urlSecret=pg",
    "--set=hub.postgres.caSecret=pg-ca",
    "--set=hub.replicaSecret.name=replica",
    "--set=hub.agentCaSecret=agent-ca",
    "--set=hub.clouddriver.url=http://spin-clouddriver:7002",
];

/// The admission policy objects of a YAML stream: (kind, name) → the text from `spec:` on.
fn policy_specs(yaml: &str) -> std::collections::BTreeMap<(String, String), String> {
    let mut specs = std::collections::BTreeMap::new();
    for document in yaml.split("\n---") {
        let kind = document
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .unwrap_or_default();
        if !kind.starts_with("ValidatingAdmissionPolicy") {
            continue;
        }
        let name = document
            .lines()
            .find_map(|l| l.strip_prefix("  name: "))
            .unwrap_or_default();
        let spec = document
            .find("\nspec:")
            .map(|at| document[at..].trim_end().to_owned())
            .unwrap_or_default();
        specs.insert((kind.to_owned(), name.to_owned()), spec);
    }
    specs
}

/// The chart's admission policies are manifests/policy's, as v1 where the API server serves
/// it, as v1beta1 where only that is served (Kubernetes 1.28/1.29 with the beta API on), and
/// left out (NOTES then warn) where neither is (issue 28: the default install used to fail
/// below 1.30).
#[test]
fn the_chart_installs_the_admission_policies_of_manifests_on_any_api_version() -> anyhow::Result<()>
{
    let helm = Binaries::locate()?.helm();
    let chart = chart();
    let chart = chart.to_str().unwrap_or_default();
    let mut manifests = String::new();
    for file in ["scaleagent-privileges.yaml", "agentaccount-privileges.yaml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../manifests/policy")
            .join(file);
        manifests.push_str("\n---\n");
        manifests.push_str(&std::fs::read_to_string(path)?);
    }
    let expected = policy_specs(&manifests);
    assert_eq!(
        expected.len(),
        4,
        "two policies and their bindings: {expected:?}"
    );
    for version in ["v1", "v1beta1"] {
        let output = run(
            &helm,
            &[
                "template",
                "t",
                chart,
                &format!(
                    "--api-versions=admissionregistration.k8s.io/{version}/ValidatingAdmissionPolicy"
                ),
            ],
        )?;
        assert!(output.status.success(), "helm template: {}", text(&output));
        let rendered = String::from_utf8_lossy(&output.stdout);
        assert_eq!(policy_specs(&rendered), expected, "{version}");
        assert_eq!(
            rendered
                .matches(&format!(
                    "apiVersion: admissionregistration.k8s.io/{version}\n"
                ))
                .count(),
            4,
            "{version}"
        );
    }
    let output = run(&helm, &["template", "t", chart])?;
    assert!(output.status.success(), "helm template: {}", text(&output));
    assert!(
        policy_specs(&String::from_utf8_lossy(&output.stdout)).is_empty(),
        "no ValidatingAdmissionPolicy API: no policy"
    );
    // The NOTES warning of that case is not checked here: `helm install --dry-run` needs a
    // reachable cluster, and the test control plane serves v1.
    Ok(())
}

#[test]
fn the_chart_lints_clean_with_default_and_non_default_values() -> anyhow::Result<()> {
    let helm = Binaries::locate()?.helm();
    let chart = chart();
    let chart = chart.to_string_lossy();
    for extra in [
        &[][..],
        &[
            "--set=hub.enabled=true",
            "--set=monitoring.enabled=true",
            "--set=operator.watchNamespaces={a,b}",
            "--set=hub.oidcSecret=people-oidc",
            "--set=hub.tokenTtl=8h",
        ][..],
        &[
            "--set=hub.enabled=true",
            "--set=hub.store=postgres",
            "--set=hub.replicas=3",
            "--set=hub.postgres.urlSecret=pg",
            "--set=hub.replicaSecret.name=replica",
            "--set=hub.agentCaSecret=agent-ca",
        ][..],
        REPLICAS_REGISTERING_OVER_TLS,
        POD_KNOBS,
    ] {
        let mut args = vec!["lint", "--strict", chart.as_ref()];
        args.extend_from_slice(extra);
        let output = run(&helm, &args)?;
        let said = text(&output);
        assert!(output.status.success(), "helm lint {extra:?}: {said}");
        assert!(!said.contains("[WARNING]"), "{said}");
    }
    Ok(())
}

/// The fleet install knobs of the operator and hub pods.
const POD_KNOBS: &[&str] = &[
    "--set=hub.enabled=true",
    "--set=operator.imagePullSecrets[0].name=registry-credentials",
    "--set=operator.nodeSelector.pool=infra",
    "--set=operator.tolerations[0].key=dedicated",
    "--set=operator.tolerations[0].operator=Exists",
    "--set=operator.priorityClassName=infra-critical",
    "--set=operator.podLabels.team=platform",
    "--set=operator.podLabels.app\\.kubernetes\\.io/name=not-the-operator",
    "--set=operator.podAnnotations.example\\.com/scraped-by=prometheus",
    "--set=operator.env[0].name=HTTPS_PROXY",
    "--set=operator.env[0].value=http://proxy.example.com:3128",
    "--set=hub.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
    "--set=hub.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    "--set=hub.topologySpreadConstraints[0].maxSkew=1",
    "--set=hub.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
    "--set=hub.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    "--set=hub.env[0].name=NO_PROXY",
    "--set=hub.env[0].value=.svc",
];

#[test]
fn the_pod_knobs_reach_the_operator_and_hub_pods_and_the_selector_labels_win() -> anyhow::Result<()>
{
    let helm = Binaries::locate()?.helm();
    let chart = chart();
    let mut args = vec![
        "template",
        "scale-agent",
        chart.to_str().unwrap_or_default(),
    ];
    args.extend_from_slice(POD_KNOBS);
    let output = run(&helm, &args)?;
    assert!(output.status.success(), "{}", text(&output));
    let documents: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(output.stdout)?)?;
    let deployment = |name: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    let operator = deployment("scale-agent-operator");
    let template = &operator["spec"]["template"];
    let pod = &template["spec"];
    assert_eq!(pod["imagePullSecrets"][0]["name"], "registry-credentials");
    assert_eq!(pod["nodeSelector"]["pool"], "infra");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["priorityClassName"], "infra-critical");
    assert_eq!(template["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        template["metadata"]["labels"]["app.kubernetes.io/name"], "scale-agent-operator",
        "the selector label wins over podLabels"
    );
    assert_eq!(
        template["metadata"]["annotations"]["example.com/scraped-by"],
        "prometheus"
    );
    let env = pod["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        env.last().map(|e| e["name"].clone()),
        Some("HTTPS_PROXY".into())
    );
    let hub = deployment("scale-agent-hub");
    let pod = &hub["spec"]["template"]["spec"];
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "pool"
    );
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let env = pod["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(env.last().map(|e| e["value"].clone()), Some(".svc".into()));
    Ok(())
}

#[test]
fn the_values_schema_refuses_wrong_values_and_names_them() -> anyhow::Result<()> {
    let helm = Binaries::locate()?.helm();
    let chart = chart();
    for (set, names) in [
        ("--set=monitoring.enabled=maybe", "/monitoring/enabled"),
        ("--set=hub.grpcPort=0", "/hub/grpcPort"),
        ("--set=hub.publicUrl=http://hub:8443", "/hub/publicUrl"),
        ("--set=monitoring.intervall=30s", "intervall"),
        ("--set=hub.store=sqlite", "/hub/store"),
        ("--set=hub.replicas=0", "/hub/replicas"),
        (
            "--set=operator.nodeSelector=infra",
            "/operator/nodeSelector",
        ),
        ("--set=hub.env[0].value=x", "/hub/env/0"),
        ("--set=hub.tokenTtl=forever", "/hub/tokenTtl"),
    ] {
        let output = run(
            &helm,
            &["template", "scale-agent", &chart.to_string_lossy(), set],
        )?;
        let said = text(&output);
        assert!(!output.status.success(), "{set} was accepted");
        assert!(
            said.contains("values don't meet the specifications of the schema")
                && said.contains(names),
            "{set}: {said}"
        );
    }
    Ok(())
}

#[test]
fn the_chart_refuses_replicas_without_a_shared_store_and_says_what_to_set() -> anyhow::Result<()> {
    let helm = Binaries::locate()?.helm();
    let chart = chart();
    for (sets, says) in [
        (
            &["--set=hub.enabled=true", "--set=hub.replicas=3"][..],
            "hub.replicas > 1 needs hub.store=postgres",
        ),
        (
            &["--set=hub.enabled=true", "--set=hub.store=postgres"][..],
            "needs hub.postgres.urlSecret",
        ),
        (
            &[
                "--set=hub.enabled=true",
                "--set=hub.store=postgres",
                "--set=hub.postgres.urlSecret=pg",
                "--set=hub.replicaSecret.name=replica",
            ][..],
            "needs hub.agentCaSecret",
        ),
        (
            &[
                "--set=hub.enabled=true",
                "--set=hub.store=postgres",
                "--set=hub.replicas=2",
                "--set=hub.postgres.urlSecret=pg",
                "--set=hub.replicaSecret.name=replica",
                "--set=hub.agentCaSecret=agent-ca",
                "--set=hub.clouddriver.accountsFile=/clouddriver/accounts.yml",
            ][..],
            "hub.clouddriver.accountsFile with hub.replicas > 1",
        ),
    ] {
        let mut args = vec![
            "template",
            "scale-agent",
            chart.to_str().unwrap_or_default(),
        ];
        args.extend_from_slice(sets);
        let output = run(&helm, &args)?;
        let said = text(&output);
        assert!(!output.status.success(), "{sets:?} was accepted");
        assert!(said.contains(says), "{sets:?}: {said}");
    }
    Ok(())
}

#[test]
fn several_replicas_register_in_clouddriver_and_reach_postgres_over_tls() -> anyhow::Result<()> {
    let helm = Binaries::locate()?.helm();
    let chart = chart();
    let mut args = vec![
        "template",
        "scale-agent",
        chart.to_str().unwrap_or_default(),
    ];
    args.extend_from_slice(REPLICAS_REGISTERING_OVER_TLS);
    let output = run(&helm, &args)?;
    let rendered = text(&output);
    assert!(output.status.success(), "{rendered}");
    for wanted in [
        "replicas: 3",
        "- --clouddriver-url=http://spin-clouddriver:7002",
        "- --postgres-ca=/var/run/scale-agent-hub/postgres-ca/ca.pem",
        "mountPath: /var/run/scale-agent-hub/postgres-ca",
        "secretName: pg-ca",
        "- key: ca.crt",
    ] {
        assert!(rendered.contains(wanted), "no {wanted:?} in:\n{rendered}");
    }
    Ok(())
}

#[tokio::test]
async fn the_chart_installs_with_hub_and_monitoring_on() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace(&client, "chart").await?;
    let binaries = Binaries::locate()?;
    let (helm, kubectl) = (binaries.helm(), binaries.kubectl());
    let kubeconfig = control_plane
        .kubeconfig_path()
        .to_string_lossy()
        .into_owned();
    let dir = temp_dir("chart")?;

    let stand_ins =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prometheus-operator-crds.yaml");
    let output = run(
        &kubectl,
        &[
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "--server-side",
            "-f",
            &stand_ins.to_string_lossy(),
        ],
    )?;
    anyhow::ensure!(output.status.success(), "{}", text(&output));
    let output = run(
        &kubectl,
        &[
            "--kubeconfig",
            &kubeconfig,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
    )?;
    anyhow::ensure!(output.status.success(), "{}", text(&output));

    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        format!(
            "hub:\n  enabled: true\nmonitoring:\n  enabled: true\n  labels:\n    release: prometheus\n\
             operator:\n  watchNamespaces: [{namespace}]\n  logFormat: text\n"
        ),
    )?;
    let output = run(
        &helm,
        &[
            "install",
            "scale-agent",
            &chart().to_string_lossy(),
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            &namespace,
            "--values",
            &values.to_string_lossy(),
            "--timeout",
            "5m",
        ],
    )?;
    let said = text(&output);
    assert!(output.status.success(), "helm install: {said}");
    // NOTES.txt: what is installed and what to do next.
    for line in [
        format!("Scale Agent v{VERSION} is installed in namespace {namespace}."),
        format!("kubectl -n {namespace} rollout status deploy/scale-agent-operator"),
        "scale-agent-hub agent-token create".to_string(),
        "Secret scale-agent-hub-metrics-token (key token)".to_string(),
        "kubectl apply --server-side --force-conflicts -f <chart>/crds/".to_string(),
    ] {
        assert!(said.contains(&line), "NOTES lack {line:?}:\n{said}");
    }

    // The CRDs came with the chart (or were there already, from the same files).
    for crd in [
        "crd/scaleagents.scaleagent.dev",
        "crd/agentaccounts.scaleagent.dev",
    ] {
        let output = run(&kubectl, &["--kubeconfig", &kubeconfig, "get", crd])?;
        assert!(output.status.success(), "{}", text(&output));
    }

    for (deployment, image) in [
        ("scale-agent-operator", "operator"),
        ("scale-agent-hub", "hub"),
    ] {
        let object = get(
            &kubectl,
            &kubeconfig,
            &namespace,
            &format!("deployment/{deployment}"),
        )?;
        let container = &object["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["image"],
            format!("ghcr.io/scale-agent/{image}:v{VERSION}")
        );
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        if deployment == "scale-agent-operator" {
            // Two operators, one leading through a Lease, the other standing by.
            assert_eq!(object["spec"]["replicas"], 2, "{deployment}");
            let mut env = container["env"].as_array().into_iter().flatten();
            assert!(
                env.any(
                    |e| e["name"] == "SCALE_AGENT_OPERATOR_LEADER_ELECTION" && e["value"] == "true"
                ),
                "the operator runs without leader election: {container}"
            );
        }
    }

    let monitors = get(&kubectl, &kubeconfig, &namespace, "servicemonitors")?;
    let mut names: Vec<&str> = monitors["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["metadata"]["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["scale-agent-hub", "scale-agent-operator"]);
    for monitor in monitors["items"].as_array().into_iter().flatten() {
        assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    }
    let hub_monitor = get(
        &kubectl,
        &kubeconfig,
        &namespace,
        "servicemonitor/scale-agent-hub",
    )?;
    let endpoint = &hub_monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(
        endpoint["bearerTokenSecret"]["name"],
        "scale-agent-hub-metrics-token"
    );

    let agents = get(
        &kubectl,
        &kubeconfig,
        &namespace,
        "podmonitor/scale-agent-agents",
    )?;
    assert_eq!(
        agents["spec"]["namespaceSelector"]["matchNames"],
        serde_json::json!([namespace])
    );
    assert_eq!(agents["spec"]["podMetricsEndpoints"][0]["port"], "admin");

    let rule = get(
        &kubectl,
        &kubeconfig,
        &namespace,
        "prometheusrule/scale-agent",
    )?;
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(alerts.contains(&"ScaleAgentHubDown"), "{alerts:?}");
    for r in rule["spec"]["groups"][0]["rules"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert!(
            r["annotations"]["runbook_url"]
                .as_str()
                .is_some_and(|u| u.contains("docs/monitoring.md#")),
            "alert without a runbook: {r}"
        );
    }

    let dashboard = get(
        &kubectl,
        &kubeconfig,
        &namespace,
        "configmap/scale-agent-grafana-dashboard",
    )?;
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(
        dashboard["data"]["scale-agent.json"]
            .as_str()
            .unwrap_or_default(),
    )?;
    assert_eq!(json["uid"], "scale-agent");

    let output = run(
        &helm,
        &[
            "uninstall",
            "scale-agent",
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            &namespace,
            "--timeout",
            "2m",
        ],
    )?;
    assert!(output.status.success(), "helm uninstall: {}", text(&output));
    Ok(())
}
