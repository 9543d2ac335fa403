//! `ScaleAgent`: one agent Deployment in this cluster, connected to one hub.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::agent_pod::AgentPod;
use super::common::{DNS1123_LABEL_PATTERN, is_false};
use crate::Error;

/// Image the operator runs when `spec.image` is unset: the agent built from the same release as
/// the operator, so upgrading the operator upgrades the agents it manages.
pub const DEFAULT_AGENT_IMAGE: &str =
    concat!("ghcr.io/scale-agent/agent:v", env!("CARGO_PKG_VERSION"));

/// The repository of [`DEFAULT_AGENT_IMAGE`]: the images the operator runs by default.
pub const DEFAULT_AGENT_REPOSITORY: &str = "ghcr.io/scale-agent/agent";

/// Default validity of an agent client certificate (90 days).
pub const DEFAULT_CERTIFICATE_LIFETIME: &str = "2160h";

/// Desired state of a Scale Agent: an agent Deployment in this namespace that streams this
/// cluster's objects (or, in `Infrastructure` and `SpinnakerService` modes, other clusters'
/// objects) to a hub over one outbound mTLS gRPC connection.
///
/// The operator turns it into a ServiceAccount, RBAC (a ClusterRole or per-namespace Roles), the
/// agent's config ConfigMap rendered from the AgentAccounts that name this ScaleAgent, a Secret
/// with the agent's client certificate, and the Deployment.
// Clippy reads the repeated `type_`/`priority` keys of separate `printcolumn(...)` entries as
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "scaleagent.dev",
    version = "v1alpha1",
    kind = "ScaleAgent",
    namespaced,
    status = "ScaleAgentStatus",
    derive = "PartialEq",
    shortname = "sca",
    category = "scale-agent",
    label("app.kubernetes.io/part-of", "scale-agent"),
    doc = "A Scale Agent: an agent Deployment in this cluster that streams Kubernetes objects to a Scale Agent hub over one outbound mTLS gRPC connection, and runs the hub's operations. The AgentAccounts that name it become its Spinnaker accounts.",
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Agent pods that are ready"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired agent pods"
    ),
    printcolumn(
        name = "Accounts",
        type_ = "integer",
        json_path = ".status.accounts",
        description = "Accepted AgentAccounts served by this agent"
    ),
    printcolumn(
        name = "Connected",
        type_ = "integer",
        json_path = ".status.connected",
        description = "Agent pods connected to the hub"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mode",
        priority = 1,
        description = "How the agent reaches the clusters it serves"
    ),
    printcolumn(
        name = "Hub",
        type_ = "string",
        json_path = ".spec.hub.address",
        priority = 1,
        description = "Hub gRPC address"
    )
)]
#[x_kube(validation = Rule::new(
    "(has(self.hub.tls) && has(self.hub.tls.insecurePlaintext) && self.hub.tls.insecurePlaintext) || has(self.enrolment) || has(self.clientCertificate)"
)
.message("spec.enrolment is required: set enrolment.tokenSecretRef.name to a Secret holding a one-time enrolment token from the hub (`scale-agent-hub agent-token create --once`); only spec.hub.tls.insecurePlaintext, a test setting, works without one")
.field_path(".enrolment")
.reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!(has(self.enrolment) && has(self.clientCertificate))")
.message("set either spec.enrolment (the hub issues the certificate, recommended) or spec.clientCertificate (the operator signs it, an opt-in), not both")
.field_path(".clientCertificate")
.reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct ScaleAgentSpec {
    /// How the agent reaches the clusters it serves. Default: `Agent`.
    ///
    /// - `Agent`: the agent serves the cluster it runs in, with its own ServiceAccount; the
    ///   operator grants that ServiceAccount what `scope` and `access` ask for. Its AgentAccounts
    ///   use `credentials.type: ServiceAccount`. Spinnaker never holds credentials for the cluster.
    /// - `Infrastructure`: the agent runs in a management cluster and serves other clusters
    ///   through kubeconfig Secrets in this namespace (AgentAccounts with
    ///   `credentials.type: Kubeconfig`); what it may do there is whatever those kubeconfigs
    ///   allow.
    /// - `SpinnakerService`: like `Infrastructure`, with the agent running in Spinnaker's own
    ///   cluster next to the hub.
    #[serde(default)]
    pub mode: Mode,

    /// The hub this agent connects to: its gRPC address and how to verify it.
    pub hub: Hub,

    /// How the agent gets its mTLS client certificate from the hub: the operator makes a key,
    /// presents a one-time enrolment token with a CSR to the hub, and writes the certificate
    /// the hub issues (for the identity the token was issued for) to the agent's Secret. The
    /// default and recommended way; set it or `clientCertificate`, not both (neither only
    /// with `hub.tls.insecurePlaintext`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolment: Option<Enrolment>,

    /// The operator-signed mode, an explicit opt-in: the operator signs the agent's client
    /// certificate with a CA key held in this cluster, for an identity chosen here. Only
    /// honoured when the operator runs with `--allow-operator-signed-certificates`, and the
    /// hub must trust that CA (`--client-ca`). Prefer `enrolment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertificate>,

    /// Number of agent pods. Default: 2, so one can take over immediately when the other is
    /// rescheduled: the hub streams each account from one replica and keeps the others ready.
    /// Minimum: 1.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1))]
    pub replicas: i32,

    /// Agent container image, e.g. `registry.example.com/scale-agent/agent:v0.1.0`. Default: the
    /// agent image released with the running operator, so upgrading the operator upgrades agents
    /// that do not pin an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// When the kubelet pulls `image`: `IfNotPresent` (default), `Always` or `Never`.
    #[serde(default)]
    pub image_pull_policy: ImagePullPolicy,

    /// CPU and memory requests and limits of the agent container. Default: none set. Memory
    /// grows with the number of objects the agent watches; see `listBudget` to flatten the
    /// start-up peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Where the agent pods run and what they carry: `imagePullSecrets`, `nodeSelector`,
    /// `tolerations`, `affinity`, `priorityClassName`, `topologySpreadConstraints`,
    /// `podLabels`, `podAnnotations`, `env` and `podDisruptionBudget`, each a `spec` field.
    #[serde(flatten)]
    pub pod: AgentPod,

    /// Where the agent's ServiceAccount may act (`Agent` mode only). Default:
    /// `{type: Cluster}`, a ClusterRole and ClusterRoleBinding. `{type: Namespaces, namespaces:
    /// [team-a, team-b]}` gives a Role and RoleBinding in each listed namespace instead, and
    /// AgentAccounts of this agent then see only those namespaces.
    #[serde(default)]
    pub scope: Scope,

    /// What the agent's ServiceAccount may do within `scope` (`Agent` mode only). `ReadOnly`
    /// (default) grants get, list and watch on the watched kinds (Secrets: list and watch)
    /// and what the read operations need besides (Events, a workload's pods and logs,
    /// ReplicaSets and ControllerRevisions for rollout history), enough to cache objects for
    /// Spinnaker; `Deploy` also grants create, update, patch and delete on each account's
    /// `deployKinds` (default: its watched kinds), their `scale` subresource, and exec,
    /// attach and port-forward when Pods are deployable, so Spinnaker pipelines can deploy
    /// through the agent. The full table is in the user
    /// guide's Operator reference (docs/src/reference/operator.md).
    #[serde(default)]
    pub access: Access,

    /// Kinds every AgentAccount of this agent watches unless the account sets its own `kinds`
    /// or `omitKinds`.
    #[serde(default)]
    pub defaults: AccountDefaults,

    /// Caps on concurrent initial LISTs, which bound the agent's memory peak at start-up and
    /// after a relist. Watches that follow a LIST are not counted.
    #[serde(default)]
    pub list_budget: ListBudget,

    /// Caps on the hub's operations (apply, delete, scale, ...) running at once in one agent
    /// pod: per account, so one account's slow operations (a `delete` waiting on a
    /// finalizer) never hold the slots of another account, under a ceiling for the pod.
    #[serde(default)]
    pub operation_budget: OperationBudget,

    /// Application heartbeats on the hub connection.
    #[serde(default)]
    pub heartbeat: Heartbeat,

    /// Reconnect backoff after the hub connection drops: delay = min(capSeconds, baseSeconds ×
    /// factor^attempt), randomised by ± jitter.
    #[serde(default)]
    pub backoff: Backoff,

    /// Serve the accounts the hub pushes (its dynamic accounts API). Each names a kubeconfig
    /// Secret the agent reads with its own ServiceAccount and then acts with, which may reach
    /// far beyond this agent's rights (another cluster's admin): off by default, and then
    /// only for the Secrets listed. Reserved to the admin group by the admission policy. The
    /// agent's ServiceAccount also needs `get` on those Secrets; the operator does not grant
    /// it.
    #[serde(default, skip_serializing_if = "DynamicAccounts::is_off")]
    pub dynamic_accounts: DynamicAccounts,
}

/// Rendered into the agent config's `dynamicAccounts.*`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DynamicAccounts {
    /// Serve the accounts the hub pushes. Off: each is reported to the hub as `FAILED`, with
    /// the reason.
    #[serde(default, skip_serializing_if = "is_false")]
    pub enabled: bool,

    /// The kubeconfig Secrets pushed accounts may name: `<namespace>/<name>`,
    /// `<namespace>/*`, or `<name>` (this namespace). Others are refused before they are read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 256),
        inner(
            length(min = 1, max = 317),
            pattern(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[*]$")
        )
    )]
    pub kubeconfig_secrets: Vec<String>,
}

impl DynamicAccounts {
    /// Off and with no Secrets: left out.
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }
}

fn default_replicas() -> i32 {
    2
}

impl ScaleAgentSpec {
    /// The image to run: `spec.image`, or [`DEFAULT_AGENT_IMAGE`].
    pub fn image_or_default(&self) -> &str {
        self.image.as_deref().unwrap_or(DEFAULT_AGENT_IMAGE)
    }
}

impl ScaleAgent {
    /// The identity written into the agent's client certificate:
    /// `spec.clientCertificate.identity`, or `<name>.<namespace>` of this ScaleAgent.
    /// `None` when neither is known (an object not yet named).
    pub fn client_identity(&self) -> Option<String> {
        if let Some(identity) = self
            .spec
            .client_certificate
            .as_ref()
            .and_then(|c| c.identity.clone())
        {
            return Some(identity);
        }
        let name = self.metadata.name.as_deref()?;
        let namespace = self.metadata.namespace.as_deref()?;
        Some(format!("{name}.{namespace}"))
    }
}

/// How the agent reaches the clusters it serves.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// In-cluster, with the agent's own ServiceAccount.
    #[default]
    Agent,
    /// Remote clusters through kubeconfig Secrets, from a management cluster.
    Infrastructure,
    /// Remote clusters through kubeconfig Secrets, from Spinnaker's cluster.
    SpinnakerService,
}

/// The hub the agent connects to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hub {
    /// The hub's gRPC endpoint as host:port, without a scheme, e.g.
    /// `scale-agent-hub.spinnaker.example.com:9091` or `[2001:db8::1]:9091`. The agent dials
    /// out to it; nothing connects into this cluster. Required.
    #[schemars(length(min = 3, max = 300))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\\\\[[0-9A-Fa-f:.]+\\\\]):[0-9]{1,5}$')",
        "message": "hub.address must be host:port without a scheme or path, e.g. scale-agent-hub.spinnaker.example.com:9091"
    }]))]
    pub address: String,

    /// How the agent verifies the hub. Default: TLS, verified against the CA in
    /// `tls.caSecretRef`.
    #[serde(default)]
    pub tls: HubTls,
}

/// TLS settings for the hub connection.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HubTls {
    /// Secret in this namespace holding the CA certificate (PEM) that signed the hub's server
    /// certificate. When unset the agent trusts the public CA roots in its image, which suits
    /// a hub behind a publicly trusted load balancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<CaSecretRef>,

    /// Name to verify in the hub's certificate (and send as SNI), when it differs from the host
    /// in `hub.address`, e.g. when dialling through a TCP proxy or by IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub server_name: Option<String>,

    /// Connect without TLS, neither verifying the hub nor presenting a client certificate.
    /// For tests against a hub started with plaintext explicitly enabled; never in
    /// production, where anyone on the path could read the stream and impersonate either
    /// side. Default: false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub insecure_plaintext: bool,
}

/// A key of a Secret holding a CA certificate.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CaSecretRef {
    /// Name of the Secret, in the ScaleAgent's namespace. Required.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key in the Secret whose value is the PEM CA certificate (bundle). Default: `ca.crt`.
    #[serde(default = "default_ca_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

/// Enrolment with the hub.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Enrolment {
    /// Secret in this namespace holding a one-time enrolment token the hub's admin issued
    /// (`scale-agent-hub agent-token create --identity <id> --accounts <pattern> --ttl 1h
    /// --once`). The operator presents each version of it once; put a new token in the
    /// Secret to enrol again. Required.
    pub token_secret_ref: TokenSecretRef,
}

/// A key of a Secret holding an enrolment token.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TokenSecretRef {
    /// Name of the Secret, in the ScaleAgent's namespace. Required.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key in the Secret whose value is the token. Default: `token`.
    #[serde(default = "default_token_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_token_key() -> String {
    "token".into()
}

/// How the operator issues the agent's client certificate.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificate {
    /// Secret in this namespace with the CA certificate and private key the operator signs the
    /// agent's client certificate with; the hub must trust this CA for client certificates.
    /// A `kubernetes.io/tls` Secret (as cert-manager writes for a CA Issuer) fits the default
    /// keys. Required.
    pub issuer_secret_ref: IssuerSecretRef,

    /// Validity of each issued certificate, as a duration in hours, minutes and seconds, e.g.
    /// `720h` (30 days) or `2160h` (default, 90 days). At least `1h`. The operator renews the
    /// certificate well before it expires; agents reload it without restarting.
    #[serde(default = "default_lifetime")]
    #[schemars(length(min = 2, max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^([0-9]+h)?([0-9]+m)?([0-9]+s)?$') && duration(self) >= duration('1h')",
        "message": "clientCertificate.lifetime must be a duration of at least 1h written with h, m and s units, e.g. 720h or 2160h"
    }]))]
    pub lifetime: String,

    /// Identity in the certificate (its common name and DNS name), which the hub uses to tell
    /// agents apart and to decide which accounts an agent may register. Default:
    /// `<ScaleAgent name>.<namespace>`. Set it when clusters share a ScaleAgent name and
    /// namespace, e.g. `prod-eu-west-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",
        "message": "clientCertificate.identity must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, e.g. prod-eu-west-1"
    }]))]
    pub identity: Option<String>,
}

fn default_lifetime() -> String {
    DEFAULT_CERTIFICATE_LIFETIME.into()
}

impl ClientCertificate {
    /// `lifetime` as a [`std::time::Duration`].
    pub fn lifetime(&self) -> Result<std::time::Duration, Error> {
        let parsed: kube::core::Duration =
            self.lifetime
                .parse()
                .map_err(|source| Error::InvalidDuration {
                    field: "spec.clientCertificate.lifetime",
                    value: self.lifetime.clone(),
                    source,
                })?;
        if parsed.is_negative() {
            return Err(Error::NegativeDuration {
                field: "spec.clientCertificate.lifetime",
                value: self.lifetime.clone(),
            });
        }
        Ok(parsed.into())
    }
}

/// The Secret holding the CA that signs agent client certificates.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IssuerSecretRef {
    /// Name of the Secret, in the ScaleAgent's namespace. Required.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key holding the PEM CA certificate. Default: `tls.crt`.
    #[serde(default = "default_cert_key")]
    #[schemars(length(min = 1, max = 253))]
    pub cert_key: String,

    /// Key holding the CA's PEM private key. Default: `tls.key`.
    #[serde(default = "default_key_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key_key: String,
}

fn default_cert_key() -> String {
    "tls.crt".into()
}

fn default_key_key() -> String {
    "tls.key".into()
}

/// `imagePullPolicy` of the agent container.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImagePullPolicy {
    /// Pull on every pod start.
    Always,
    /// Pull only when the image is missing on the node.
    #[default]
    IfNotPresent,
    /// Never pull; the image must be on the node.
    Never,
}

impl ImagePullPolicy {
    /// The value as Kubernetes spells it in a container spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Where the agent's ServiceAccount may act.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new(
    "self.type != 'Namespaces' || (has(self.namespaces) && size(self.namespaces) > 0)"
)
.message("scope.namespaces must list at least one namespace when scope.type is Namespaces: list the namespaces the agent may use, or set scope.type to Cluster")
.field_path(".namespaces")
.reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new(
    "self.type != 'Cluster' || !has(self.namespaces) || size(self.namespaces) == 0"
)
.message("scope.namespaces is only used when scope.type is Namespaces: set scope.type to Namespaces to restrict the agent to them, or remove scope.namespaces")
.field_path(".namespaces")
.reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    /// `Cluster` (default): a ClusterRole and ClusterRoleBinding, the agent may act in every
    /// namespace. `Namespaces`: a Role and RoleBinding in each namespace of `namespaces`, and
    /// nowhere else.
    #[serde(rename = "type", default)]
    pub type_: ScopeType,

    /// Namespaces the agent may act in, e.g. `[team-a, team-b]`. Required, and only allowed,
    /// when `type` is `Namespaces`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 1024),
        inner(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))
    )]
    pub namespaces: Vec<String>,
}

impl Scope {
    /// Cluster-wide scope.
    pub fn cluster() -> Self {
        Self::default()
    }

    /// Scope limited to the given namespaces.
    pub fn namespaces<I, S>(namespaces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            type_: ScopeType::Namespaces,
            namespaces: namespaces.into_iter().map(Into::into).collect(),
        }
    }

    /// Whether the agent gets cluster-wide RBAC.
    pub fn is_cluster(&self) -> bool {
        self.type_ == ScopeType::Cluster
    }
}

/// Kind of RBAC scope.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScopeType {
    /// ClusterRole + ClusterRoleBinding.
    #[default]
    Cluster,
    /// Role + RoleBinding per listed namespace.
    Namespaces,
}

/// What the agent's ServiceAccount may do.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// get, list, watch (Secrets: list, watch).
    #[default]
    ReadOnly,
    /// Also create, update, patch, delete on the deployable kinds.
    Deploy,
}

/// Defaults for the AgentAccounts of a ScaleAgent.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new(
    "!(has(self.kinds) && size(self.kinds) > 0 && has(self.omitKinds) && size(self.omitKinds) > 0)"
)
.message("set either defaults.kinds (watch only these) or defaults.omitKinds (watch all but these), not both")
.field_path(".omitKinds")
.reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct AccountDefaults {
    /// Watch only these kinds, written as a kind (`Deployment`) or as resource.group
    /// (`deployments.apps`), e.g. `[Deployment, Service, Ingress, ConfigMap]`; `["*"]` is every
    /// kind the agent may list and watch. Default: the agent's default kinds (Deployment,
    /// ReplicaSet, StatefulSet, DaemonSet, Pod, Service, Ingress, Job, CronJob, ConfigMap,
    /// Secret, NetworkPolicy, HorizontalPodAutoscaler, Namespace). Not together with
    /// `omitKinds`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub kinds: Vec<String>,

    /// Watch every kind the agent may list and watch except these, e.g. `[Event, Lease]`. Not
    /// together with `kinds`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub omit_kinds: Vec<String>,
}

/// Caps on concurrent initial LISTs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("self.perAccount <= self.total")
    .message("listBudget.perAccount must not exceed listBudget.total: lower perAccount or raise total")
    .field_path(".perAccount"))]
#[serde(rename_all = "camelCase")]
pub struct ListBudget {
    /// Most LISTs in flight across all accounts of one agent pod. Default: 20. Minimum: 1.
    #[serde(default = "default_list_total")]
    #[schemars(range(min = 1))]
    pub total: i32,

    /// Most LISTs in flight for one account. Default: 5. Minimum: 1.
    #[serde(default = "default_list_per_account")]
    #[schemars(range(min = 1))]
    pub per_account: i32,
}

fn default_list_total() -> i32 {
    20
}

fn default_list_per_account() -> i32 {
    5
}

impl Default for ListBudget {
    fn default() -> Self {
        Self {
            total: default_list_total(),
            per_account: default_list_per_account(),
        }
    }
}

/// Caps on the hub's operations running at once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("self.perAccount <= self.total")
    .message("operationBudget.perAccount must not exceed operationBudget.total: lower perAccount or raise total")
    .field_path(".perAccount"))]
#[serde(rename_all = "camelCase")]
pub struct OperationBudget {
    /// Most operations running at once for one account; more wait for a slot within their
    /// deadline. Default: 16. Minimum: 1.
    #[serde(default = "default_operations_per_account")]
    #[schemars(range(min = 1))]
    pub per_account: i32,

    /// Most operations running at once across all accounts of one agent pod. Default: 256.
    /// Minimum: 1.
    #[serde(default = "default_operations_total")]
    #[schemars(range(min = 1))]
    pub total: i32,
}

fn default_operations_per_account() -> i32 {
    crate::agent_config::OPERATIONS_PER_ACCOUNT as i32
}

fn default_operations_total() -> i32 {
    crate::agent_config::OPERATIONS_TOTAL as i32
}

impl Default for OperationBudget {
    fn default() -> Self {
        Self {
            per_account: default_operations_per_account(),
            total: default_operations_total(),
        }
    }
}

/// Application heartbeats on the hub connection.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// Seconds between heartbeats, both ways; a side that hears nothing for two periods
    /// ends the connection. The agent asks the hub for this period, and the hub grants it
    /// within its --min-heartbeat-period and --max-heartbeat-period (default 1 to 300 s);
    /// the granted period is the agent's /accounts heartbeatPeriodSeconds. Default: 15.
    /// Between 1 and 300.
    #[serde(default = "default_heartbeat_period")]
    #[schemars(range(min = 1, max = 300))]
    pub period_seconds: i32,
}

fn default_heartbeat_period() -> i32 {
    15
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            period_seconds: default_heartbeat_period(),
        }
    }
}

/// Reconnect backoff, in the style of gRPC's connection backoff.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.capSeconds >= self.baseSeconds")
    .message("backoff.capSeconds must be at least backoff.baseSeconds: raise capSeconds or lower baseSeconds")
    .field_path(".capSeconds"))]
#[serde(rename_all = "camelCase")]
pub struct Backoff {
    /// Delay before the first reconnect attempt, in seconds. Default: 1. Minimum: 1.
    #[serde(default = "default_backoff_base")]
    #[schemars(range(min = 1))]
    pub base_seconds: i32,

    /// Multiplier applied to the delay after each failed attempt. Default: 1.6. Minimum: 1.
    #[serde(default = "default_backoff_factor")]
    #[schemars(range(min = 1.0, max = 10.0))]
    pub factor: f64,

    /// Fraction by which each delay is randomly lengthened or shortened, so agents that lost
    /// the hub together do not reconnect together. Default: 0.2. Between 0 and 1.
    #[serde(default = "default_backoff_jitter")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub jitter: f64,

    /// Longest delay between attempts, in seconds. Default: 120.
    #[serde(default = "default_backoff_cap")]
    #[schemars(range(min = 1))]
    pub cap_seconds: i32,
}

fn default_backoff_base() -> i32 {
    1
}

fn default_backoff_factor() -> f64 {
    1.6
}

fn default_backoff_jitter() -> f64 {
    0.2
}

fn default_backoff_cap() -> i32 {
    120
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_seconds: default_backoff_base(),
            factor: default_backoff_factor(),
            jitter: default_backoff_jitter(),
            cap_seconds: default_backoff_cap(),
        }
    }
}

impl ScaleAgentStatus {
    /// The part the operator writes: without the agent's condition, `connected` and
    /// `connectedReplicas`.
    pub fn operator_part(&self) -> Self {
        Self {
            conditions: super::agent_account::operator_conditions(&self.conditions),
            connected: None,
            connected_replicas: Vec::new(),
            ..self.clone()
        }
    }
}

/// Observed state of a ScaleAgent, written by the operator (and, for the `Connected`
/// condition, `connected` and `connectedReplicas`, by the agent).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleAgentStatus {
    /// Current state: `Ready` (the agent Deployment is available with a valid certificate),
    /// `Progressing` (a rollout or certificate rotation is under way), `Degraded` (something
    /// needs a change; the message says what) and `CertificateReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status describes; older than `metadata.generation`
    /// means the operator has not yet acted on the latest spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Agent pods that exist.
    #[serde(default)]
    pub replicas: i32,

    /// Agent pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,

    /// AgentAccounts accepted into this agent's config.
    #[serde(default)]
    pub accounts: i32,

    /// Agent pods connected to the hub, as the agents report it (written by the agent, field
    /// manager `scale-agent-agent`). Unset when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected: Option<i32>,

    /// The agent pods connected to the hub, as the hub told the agents (written by the
    /// agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connected_replicas: Vec<String>,

    /// When the current client certificate expires (RFC 3339, e.g. `2026-01-31T12:00:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_expiry: Option<String>,

    /// The identity in the agent's current client certificate, as the hub (with `enrolment`)
    /// or the operator (with `clientCertificate`) issued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,

    /// The enrolment token Secret version (`<uid>/<resourceVersion>`) the operator last
    /// presented to the hub. That version is never presented again, whether the hub accepted
    /// it or not: put a new token in the Secret to enrol again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolment_token_version: Option<String>,
}
