//! The `certificates.k8s.io` kinds besides CertificateSigningRequests (printed in
//! [`super::control_plane`]): ClusterTrustBundles and PodCertificateRequests, ported from
//! Kubernetes 1.37's `pkg/printers/internalversion/printers.go` (sans-IO).

use serde_json::{Value, json};

use super::{
    Column,
    columns::{NAME_DOC, col},
    format::{self, string},
};

/// A certificates kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Certificates {
    ClusterTrustBundle,
    PodCertificateRequest,
}

/// `clusterTrustBundleColumnDefinitions` (no age).
#[rustfmt::skip]
const CLUSTER_TRUST_BUNDLE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("SignerName", "string", "", 0, "signerName indicates the associated signer, if any.\n\nIn order to create or update a ClusterTrustBundle that sets signerName, you must have the following cluster-scoped permission: group=certificates.k8s.io resource=signers resourceName=<the signer name> verb=attest.\n\nIf signerName is not empty, then the ClusterTrustBundle object must be named with the signer name as a prefix (translating slashes to colons). For example, for the signer name `example.com/foo`, valid ClusterTrustBundle object names include `example.com:foo:abc` and `example.com:foo:v1`.\n\nIf signerName is empty, then the ClusterTrustBundle object's name must not have such a prefix.\n\nList/watch requests for ClusterTrustBundles can filter on this field using a `spec.signerName=NAME` field selector."),
];

/// `podCertificateRequestColumnDefinitions` (no age; all priority 0, the last cell written
/// only when wide, which the API server's Tables are).
#[rustfmt::skip]
const POD_CERTIFICATE_REQUEST: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("PodName", "string", "", 0, "podName is the name of the pod into which the certificate will be mounted."),
    col("ServiceAccountName", "string", "", 0, "serviceAccountName is the name of the service account the pod is running as."),
    col("NodeName", "string", "", 0, "nodeName is the name of the node the pod is assigned to."),
    col("SignerName", "string", "", 0, "signerName indicates the requested signer.\n\nAll signer names beginning with `kubernetes.io` are reserved for use by the Kubernetes project.  There is currently one well-known signer documented by the Kubernetes project, `kubernetes.io/kube-apiserver-client-pod`, which will issue client certificates understood by kube-apiserver.  It is currently unimplemented."),
    col("State", "string", "", 0, "Is the request Pending, Issued, Denied, or Failed?"),
    col("UnverifiedUserAnnotations", "string", "", 0, "unverifiedUserAnnotations allow pod authors to pass additional information to the signer implementation.  Kubernetes does not restrict or validate this metadata in any way.\n\nEntries are subject to the same validation as object metadata annotations, with the addition that all keys must be domain-prefixed. No restrictions are placed on values, except an overall size limitation on the entire field.\n\nSigners should document the keys and values they support.  Signers should deny requests that contain keys they do not recognize."),
];

impl Certificates {
    /// The kind of a resource of `certificates.k8s.io`, among these two.
    pub fn of(resource: &str) -> Option<Certificates> {
        match resource {
            "clustertrustbundles" => Some(Certificates::ClusterTrustBundle),
            "podcertificaterequests" => Some(Certificates::PodCertificateRequest),
            _ => None,
        }
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            Certificates::ClusterTrustBundle => CLUSTER_TRUST_BUNDLE,
            Certificates::PodCertificateRequest => POD_CERTIFICATE_REQUEST,
        }
    }

    /// `printClusterTrustBundle`: the signer, `<none>` for none; `printPodCertificateRequest`:
    /// the pod, its ServiceAccount and node, the signer, the state (the last of the
    /// Issued/Denied/Failed conditions, whatever its status; Pending without), and the
    /// user's annotations as `k=v,...`.
    pub fn cells(self, o: &Value, name: Value) -> Vec<Value> {
        let spec = |f: &str| json!(string(o.pointer(&format!("/spec/{f}"))));
        match self {
            Certificates::ClusterTrustBundle => {
                let signer = match string(o.pointer("/spec/signerName")) {
                    "" => "<none>",
                    s => s,
                };
                vec![name, json!(signer)]
            }
            Certificates::PodCertificateRequest => {
                let mut state = "Pending";
                for c in o
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match string(c.get("type")) {
                        "Issued" => state = "Issued",
                        "Denied" => state = "Denied",
                        "Failed" => state = "Failed",
                        _ => {}
                    }
                }
                vec![
                    name,
                    spec("podName"),
                    spec("serviceAccountName"),
                    spec("nodeName"),
                    spec("signerName"),
                    json!(state),
                    json!(format::labels(o.pointer("/spec/unverifiedUserAnnotations"))),
                ]
            }
        }
    }
}
