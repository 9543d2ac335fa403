//! Pods that run: KWOK (`sigs.k8s.io/kwok`) plays the kubelet of fake nodes, so pods that
//! kube-scheduler binds to them become Running and Ready, Deployments become Available and
//! `kubectl rollout status` finishes; and it serves the kubelet's container-logs API, so
//! `kubectl logs [-f]` streams a file a test appends to ([`PodLog`]).
//!
//! Started by [`ControlPlane::start`](crate::ControlPlane::start) when
//! [`ControlPlaneOptions::with_kwok`](crate::ControlPlaneOptions::with_kwok) is set.
//!
//! How the pieces meet:
//! - each fake node in [`NODES`] is annotated [`NODE_ANNOTATION`]` = fake`, which is what
//!   kwok is told to manage; kwok reports it Ready with address `127.0.0.1` and kubelet port
//!   = kwok's own server port, where the apiserver sends `pods/log` requests (over TLS, with
//!   the run's CA as `--kubelet-certificate-authority`);
//! - kwok answers a container-logs request from the file named by a `Logs` object
//!   (kwok.x-k8s.io/v1alpha1, namespaced, named after the pod); [`pod_log`] makes both. Every
//!   other pod falls back to a `ClusterLogs` in kwok's configuration naming an empty file, so
//!   its log is empty, as a quiet container's is: `kubectl logs` prints nothing and exits 0,
//!   `kubectl logs -f` waits. (Without that fallback kwok answers
//!   `no logs found for container "app" in pod "ns/name"`, which `kubectl logs -f` keeps
//!   printing as it retries.) A pod not yet bound to a node has an empty log too: the
//!   apiserver answers so itself.
//! - `exec` runs the command on this host (a `ClusterExec` with a local target, in the run's
//!   directory): `kubectl exec pod -- echo hi` prints `hi`. `port-forward` connects every
//!   port to a `cat` process (a `ClusterPortForward` with a command), so what a client sends
//!   through a forwarded port comes back: an echo server.

use std::{
    fs::OpenOptions,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Container, Node, Pod, PodSpec},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Client,
    api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    core::ObjectMeta,
};
use serde_json::json;

use crate::{
    binaries::Binaries,
    crds::{self, FIELD_MANAGER},
    error::{Error, Result, io_err},
};

/// The annotation kwok selects the nodes it manages by (value `fake`).
pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// The fake nodes every kwok control plane has. Two, so a Deployment's pods can spread.
pub const NODES: &[&str] = &["kwok-node-0", "kwok-node-1"];

/// Pod IPs kwok hands out; apart from the Service range (10.0.0.0/24).
pub const POD_CIDR: &str = "10.244.0.0/16";

/// How long [`pod_log`] waits for kwok to see a new `Logs` object.
const LOGS_PICKUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A container name no test uses: every `Logs` object [`pod_log`] makes gives it
/// [`PROBE_LINE`], so the harness can tell when kwok has seen the object (before that, the
/// empty fallback log answers).
const PROBE_CONTAINER: &str = "scale-agent-e2e-probe";
const PROBE_LINE: &str = "kwok has this pod's Logs";

/// Files of the pod logs, in the directory `logs_dir` that [`write_logs_config`] fills.
fn empty_log(logs_dir: &Path) -> PathBuf {
    logs_dir.join("empty.log")
}

fn probe_log(logs_dir: &Path) -> PathBuf {
    logs_dir.join("probe.log")
}

/// Writes kwok's configuration into `logs_dir` (created): a `ClusterLogs` that gives every
/// pod an empty log (and the probe log of [`PROBE_CONTAINER`]), a `ClusterExec` that runs
/// `exec` commands on this host, and a `ClusterPortForward` that echoes forwarded ports.
/// Returns the configuration file, for `--config`.
pub(crate) fn write_logs_config(logs_dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(logs_dir).map_err(io_err(format!("create {}", logs_dir.display())))?;
    let write = |path: PathBuf, contents: String| {
        std::fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))
    };
    write(empty_log(logs_dir), String::new())?;
    write(probe_log(logs_dir), cri_records(PROBE_LINE))?;
    // JSON is YAML, which kwok's --config reads.
    let documents = [
        json!({
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterLogs",
            "metadata": { "name": "empty-by-default" },
            "spec": { "logs": [ { "logsFile": empty_log(logs_dir).display().to_string() } ] },
        }),
        json!({
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterExec",
            "metadata": { "name": "local" },
            "spec": { "execs": [ { "local": { "workDir": logs_dir.display().to_string() } } ] },
        }),
        json!({
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterPortForward",
            "metadata": { "name": "echo" },
            "spec": { "forwards": [ { "command": ["cat"] } ] },
        }),
    ];
    // JSON documents are YAML documents; kwok reads the stream of them.
    let text = documents
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n---\n");
    let path = logs_dir.join("kwok-config.yaml");
    write(path.clone(), text)?;
    Ok(path)
}

/// `text` as CRI log records (`<RFC 3339 time> stdout F <line>`), one per line, stamped now.
fn cri_records(text: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    text.lines()
        .map(|l| format!("{now} stdout F {l}\n"))
        .collect()
}

fn logs_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", "Logs"),
        "logs",
    )
}

/// Arguments of the `kwok` process: out of cluster, managing only annotated nodes, serving
/// the kubelet API (TLS and plain HTTP on one port) at `127.0.0.1:<kubelet_port>`.
pub(crate) fn args(
    binaries: &Binaries,
    kubeconfig: &Path,
    logs_config: &Path,
    kubelet_port: u16,
    tls_cert: &Path,
    tls_key: &Path,
) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        // The binary has no built-in stages; these are kwokctl's defaults.
        format!("--config={}", binaries.kwok_stages().display()),
        format!("--config={}", logs_config.display()),
        "--manage-all-nodes=false".into(),
        format!("--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake"),
        "--manage-nodes-with-label-selector=".into(),
        "--manage-single-node=".into(),
        format!("--cidr={POD_CIDR}"),
        // What the fake nodes report as their address and kubelet port: the apiserver
        // reaches "the kubelet" there for logs.
        "--node-ip=127.0.0.1".into(),
        format!("--node-port={kubelet_port}"),
        format!("--server-address=127.0.0.1:{kubelet_port}"),
        format!("--tls-cert-file={}", tls_cert.display()),
        format!("--tls-private-key-file={}", tls_key.display()),
        "--node-lease-duration-seconds=40".into(),
        // Per-pod log files come from `Logs` objects, made by tests while kwok runs.
        "--enable-crds=Logs".into(),
    ]
}

/// Installs the `Logs` CRD kwok watches (it exits when the resource is not served).
pub(crate) async fn install_logs_crd(client: &Client, binaries: &Binaries) -> Result<()> {
    let path = binaries.kwok_logs_crd();
    let text =
        std::fs::read_to_string(&path).map_err(io_err(format!("read {}", path.display())))?;
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&text).map_err(|e| Error::Manifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
    crds::install(client, &[crd]).await?;
    Ok(())
}

/// Creates the fake nodes of [`NODES`] (kept if they exist). No taints, so pods need no
/// tolerations; kwok fills the status in (Ready, capacity, address, kubelet port).
pub(crate) async fn create_nodes(client: &Client) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    for name in NODES {
        let label = |key: &str, value: &str| (key.to_string(), value.to_string());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations: Some([label(NODE_ANNOTATION, "fake")].into()),
                labels: Some(
                    [
                        label("kubernetes.io/hostname", name),
                        label("kubernetes.io/os", "linux"),
                        label("kubernetes.io/arch", "amd64"),
                        label("type", "kwok"),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether every fake node reports Ready and the kubelet port kwok serves on: the scheduler
/// only places pods on a node whose allocatable resources kwok has filled in.
pub(crate) async fn nodes_ready(client: &Client, kubelet_port: u16) -> bool {
    let api = Api::<Node>::all(client.clone());
    for name in NODES {
        let Ok(node) = api.get(name).await else {
            return false;
        };
        let status = node.status.unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let port = status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port);
        if !ready || port != Some(i32::from(kubelet_port)) {
            return false;
        }
    }
    true
}

/// The container log of one pod that kwok runs: a file in the control plane's run
/// directory, served by kwok to `kubectl logs` (every container of the pod shows it).
/// Lines appended while `kubectl logs -f` runs are streamed to it.
#[derive(Clone, Debug)]
pub struct PodLog {
    namespace: String,
    pod: String,
    path: PathBuf,
}

impl PodLog {
    /// The file kwok reads (CRI log format: `<RFC 3339 time> stdout F <line>`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pod as `namespace/name`.
    pub fn pod(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }

    /// Appends `line` (one log line per line of it) to the pod's stdout, stamped now.
    pub fn append(&self, line: &str) -> Result<()> {
        let record = cri_records(line);
        // One write of whole lines to a file opened for appending, so a follower never
        // sees half a line.
        OpenOptions::new()
            .append(true)
            .open(&self.path)
            .and_then(|mut file| file.write_all(record.as_bytes()))
            .map_err(io_err(format!("append to {}", self.path.display())))
    }
}

/// Gives pod `namespace/pod` a log file of its own (empty) and waits until kwok serves it.
/// The pod need not exist yet. `logs_dir` is the one [`write_logs_config`] filled.
pub(crate) async fn pod_log(
    client: &Client,
    logs_dir: &Path,
    kubelet_port: u16,
    namespace: &str,
    pod: &str,
) -> Result<PodLog> {
    let path = logs_dir.join(format!("{namespace}_{pod}.log"));
    std::fs::write(&path, "").map_err(io_err(format!("create {}", path.display())))?;

    let logs = DynamicObject {
        types: Some(kube::core::TypeMeta {
            api_version: "kwok.x-k8s.io/v1alpha1".into(),
            kind: "Logs".into(),
        }),
        metadata: ObjectMeta {
            name: Some(pod.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        data: json!({
            "spec": { "logs": [
                {
                    "containers": [PROBE_CONTAINER],
                    "logsFile": probe_log(logs_dir).display().to_string(),
                },
                // No containers: every other container of the pod.
                { "logsFile": path.display().to_string(), "follow": true },
            ] },
        }),
    };
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &logs_resource())
        .patch(
            pod,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&logs),
        )
        .await?;

    // kwok learns of the object through a watch; until then the empty fallback answers for
    // the probe container too. Asked straight (its kubelet API serves plain HTTP on the
    // same port), so the pod need not be bound yet.
    let started = Instant::now();
    let probe = format!("/containerLogs/{namespace}/{pod}/{PROBE_CONTAINER}");
    loop {
        let answer = crate::http::request(
            "GET",
            format!("127.0.0.1:{kubelet_port}"),
            &probe,
            None,
            Duration::from_secs(5),
        )
        .await;
        if matches!(&answer, Ok(response) if response.status == 200 && response.body.trim() == PROBE_LINE)
        {
            return Ok(PodLog {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                path,
            });
        }
        if started.elapsed() > LOGS_PICKUP_TIMEOUT {
            return Err(Error::Timeout {
                what: format!(
                    "kwok to serve the log of pod {namespace}/{pod} (last answer: {answer:?})"
                ),
                secs: LOGS_PICKUP_TIMEOUT.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the bare pod `logger` (container `main`, an image that need not exist: kwok runs
/// it, and answers exec and port-forward into it) in `namespace`, and waits up to `timeout`
/// until it runs.
pub async fn run_logger(client: &Client, namespace: &str, timeout: Duration) -> Result<()> {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("logger".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.example/logger:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &pod).await?;
    let running = kube::runtime::wait::await_condition(
        api,
        "logger",
        kube::runtime::wait::conditions::is_pod_running(),
    );
    let timed_out = || Error::Timeout {
        what: format!("pod {namespace}/logger to run"),
        secs: timeout.as_secs(),
    };
    tokio::time::timeout(timeout, running)
        .await
        .map_err(|_| timed_out())?
        .map_err(|_| timed_out())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_lines_are_cri_log_records() {
        let dir = std::env::temp_dir().join(format!("pod-log-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = PodLog {
            namespace: "ns".into(),
            pod: "p".into(),
            path: dir.join("ns_p.log"),
        };
        std::fs::write(log.path(), "").unwrap();
        log.append("hello").unwrap();
        log.append("two\nlines").unwrap();
        let text = std::fs::read_to_string(log.path()).unwrap();
        let records: Vec<&str> = text.lines().collect();
        assert_eq!(records.len(), 3, "{text}");
        for (record, message) in records.iter().zip(["hello", "two", "lines"]) {
            let mut fields = record.splitn(4, ' ');
            let time = fields.next().unwrap();
            assert!(
                time.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
                "{record}"
            );
            assert!(time.ends_with('Z'), "{record}");
            assert_eq!(fields.next(), Some("stdout"));
            assert_eq!(fields.next(), Some("F"));
            assert_eq!(fields.next(), Some(message));
        }
        assert_eq!(log.pod(), "ns/p");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kwok_serves_the_kubelet_api_where_the_nodes_say() {
        let binaries = Binaries::unchecked(PathBuf::from("/bin-dir"));
        let args = args(
            &binaries,
            Path::new("/run/admin.kubeconfig"),
            Path::new("/run/pod-logs/cluster-logs.yaml"),
            10250,
            Path::new("/run/apiserver.crt"),
            Path::new("/run/apiserver.key"),
        );
        for expected in [
            "--node-port=10250",
            "--server-address=127.0.0.1:10250",
            "--node-ip=127.0.0.1",
            "--config=/bin-dir/kwok-config/stages.yaml",
            "--config=/run/pod-logs/cluster-logs.yaml",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
        }
    }
}
