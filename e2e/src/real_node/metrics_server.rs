//! metrics-server on the real node, as a process on the host (a command of the control
//! plane's multi-call binary, `e2e/control-plane/metrics-server-version`): it scrapes the
//! node's kubelet (`/metrics/resource`, over TLS checked against the cluster's CA, with a
//! client certificate kubelet authenticates and authorizes by SubjectAccessReview) and serves
//! the aggregated `metrics.k8s.io` API that `kubectl top` reads. The API server reaches it
//! through the APIService `v1beta1.metrics.k8s.io`, the Service `kube-system/metrics-server`
//! and its Endpoints on the bridge address (`--enable-aggregator-routing`), checking its
//! serving certificate with the APIService's `caBundle` (upstream's manifest skips that
//! check), and authenticates to it as the front proxy
//! ([`crate::control_plane`]'s aggregation flags).
//!
//! Its RBAC is upstream's (`manifests/base/rbac.yaml` of the same release), bound to the user
//! of its client certificate instead of a ServiceAccount, including the
//! `system:aggregated-metrics-reader` ClusterRole that gives `view`, `edit` and `admin` the
//! metrics reads, as a cluster with metrics-server installed the usual way has it.

use std::{fs, time::Duration};

use base64::Engine as _;

use crate::{
    error::{Result, io_err},
    local_agent::free_port,
    process::ManagedProcess,
};

use super::{BRIDGE_ADDRESS, RealNode, host};

/// The user metrics-server authenticates as (its client certificate's common name).
pub const USER: &str = "system:metrics-server";
/// The aggregated API it serves.
pub const API_SERVICE: &str = "v1beta1.metrics.k8s.io";
/// How often it scrapes kubelet: its minimum, so a pod's first metrics (two scrapes, for a
/// CPU rate) come about 20 s after it starts.
const RESOLUTION: &str = "10s";

/// The objects that put metrics-server behind the API server, for `kubectl apply`.
fn manifest(port: u16, ca_bundle_base64: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:aggregated-metrics-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
    rbac.authorization.k8s.io/aggregate-to-admin: "true"
rules:
- apiGroups: ["metrics.k8s.io"]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: metrics-server-auth-reader
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {USER}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metrics-server:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {USER}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:metrics-server
rules:
- apiGroups: [""]
  resources: ["nodes/metrics"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:metrics-server
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:metrics-server
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {USER}
---
apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: kube-system
spec:
  ports:
  - name: https
    port: 443
    targetPort: {port}
---
apiVersion: v1
kind: Endpoints
metadata:
  name: metrics-server
  namespace: kube-system
subsets:
- addresses:
  - ip: {BRIDGE_ADDRESS}
  ports:
  - name: https
    port: {port}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {API_SERVICE}
spec:
  service:
    name: metrics-server
    namespace: kube-system
  group: metrics.k8s.io
  version: v1beta1
  caBundle: {ca_bundle_base64}
  groupPriorityMinimum: 100
  versionPriority: 100
"#
    )
}

impl RealNode {
    /// Starts metrics-server and registers its API, then waits until the API server reports
    /// the APIService Available (it reached metrics-server through the Service's endpoint
    /// with the front proxy's certificate). Pods' metrics come after its first two scrapes
    /// of kubelet, about 20 s later. Stopped with the node.
    pub async fn start_metrics_server(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        // A cache built before metrics-server joined the binary says to rebuild it.
        self.control_plane.binaries().require(&["metrics-server"])?;
        let dir = self.dir.join("metrics-server");
        fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        let write = |name: &str, contents: &str| -> Result<std::path::PathBuf> {
            let path = dir.join(name);
            fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))?;
            Ok(path)
        };
        let ca = self.control_plane.certificate_authority();
        let identity = ca.client(USER, &[])?;
        let client_cert = write("metrics-server-client.crt", &identity.cert_pem)?;
        let client_key = write("metrics-server-client.key", &identity.key_pem)?;
        // The name the aggregator checks: `<service>.<namespace>.svc`.
        let serving = ca.serving_with_ips(
            "metrics-server",
            &["metrics-server.kube-system.svc"],
            &[std::net::IpAddr::V4(BRIDGE_ADDRESS)],
        )?;
        let serving_cert = write("metrics-server.crt", &serving.cert_pem)?;
        let serving_key = write("metrics-server.key", &serving.key_pem)?;
        let kubeconfig = write(
            "metrics-server.kubeconfig",
            &self
                .control_plane
                .kubeconfig_for_certificate(&client_cert, &client_key),
        )?;
        let port = free_port()?;
        let ca_file = self.control_plane.run_dir().join("ca.crt");
        // Its RBAC first: it reads the front proxy's CA at start and exits without it.
        let manifest_path = write(
            "metrics-server.yaml",
            &manifest(
                port,
                &base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem),
            ),
        )?;
        let kubectl = self.control_plane.binaries().kubectl();
        let admin = self
            .control_plane
            .kubeconfig_path()
            .to_string_lossy()
            .into_owned();
        host::run(
            &kubectl,
            &[
                "--kubeconfig",
                &admin,
                "apply",
                "-f",
                &manifest_path.to_string_lossy(),
            ],
        )?;
        let binary = self.control_plane.binaries().path("metrics-server");
        self.processes.push(ManagedProcess::spawn(
            "metrics-server",
            &binary,
            &[
                // The API server, for its informers, and for TokenReviews and
                // SubjectAccessReviews of the callers that are not the front proxy.
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kubeconfig.display()),
                format!("--bind-address={BRIDGE_ADDRESS}"),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", serving_cert.display()),
                format!("--tls-private-key-file={}", serving_key.display()),
                // kubelet's serving certificate is checked (no --kubelet-insecure-tls); the
                // client certificate of the kubeconfig is the identity kubelet sees.
                format!("--kubelet-certificate-authority={}", ca_file.display()),
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--kubelet-use-node-status-port".into(),
                format!("--metric-resolution={RESOLUTION}"),
                // It must be shorter than the resolution (its default is 10 s).
                "--kubelet-request-timeout=5s".into(),
                "--v=1".into(),
            ],
            self.dir.join("metrics-server.log"),
        )?);
        self.wait_for("metrics-server", Duration::from_secs(90), || {
            let (kubectl, admin) = (kubectl.clone(), admin.clone());
            async move {
                host::run(
                    &kubectl,
                    &[
                        "--kubeconfig",
                        &admin,
                        "get",
                        "apiservice",
                        API_SERVICE,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
                    ],
                )
                .is_ok_and(|status| status.trim() == "True")
            }
        })
        .await?;
        eprintln!(
            "[real-node] metrics-server serves {API_SERVICE} (Available in {:.1} s)",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
