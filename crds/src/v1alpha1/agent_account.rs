//! `AgentAccount`: one Spinnaker account served by a `ScaleAgent`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{DNS1123_LABEL_PATTERN, is_false};

/// One Spinnaker Kubernetes account, served by the ScaleAgent `agentRef` in the same
/// namespace.
///
/// The operator renders the accepted AgentAccounts of a ScaleAgent into that agent's config
/// (the `kubernetes.accounts[]` list Armory agent users know); the agent registers each account
/// with the hub, which makes it available to Spinnaker.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "scaleagent.dev",
    version = "v1alpha1",
    kind = "AgentAccount",
    namespaced,
    status = "AgentAccountStatus",
    derive = "PartialEq",
    shortname = "aa",
    category = "scale-agent",
    label("app.kubernetes.io/part-of", "scale-agent"),
    doc = "A Spinnaker Kubernetes account served by a ScaleAgent in the same namespace: which cluster credentials it uses, what the agent watches for it, and who may use it in Spinnaker.",
    validation = Rule::new(
        "has(self.spec.accountName) || (size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))"
    )
    .message("metadata.name is the Spinnaker account name when spec.accountName is unset, so it must then be a lowercase DNS label (a-z, 0-9 and '-', at most 63 characters, starting and ending with a letter or digit): set spec.accountName, or rename the AgentAccount")
    .field_path(".spec.accountName")
    .reason(Reason::FieldValueRequired),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".spec.agentRef",
        description = "ScaleAgent serving this account"
    ),
    printcolumn(
        name = "Account",
        type_ = "string",
        json_path = ".status.accountName",
        description = "Spinnaker account name"
    ),
    printcolumn(
        name = "Accepted",
        type_ = "boolean",
        json_path = ".status.accepted",
        description = "Whether the operator accepted the account into the agent's config"
    ),
    printcolumn(
        name = "Connected",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Connected\")].status",
        description = "Whether the hub accepted the account and a replica streams it (written by the agent)"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Connected\")].reason",
        description = "Streaming, Rejected or HubUnreachable"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Credentials",
        type_ = "string",
        json_path = ".spec.credentials.type",
        priority = 1,
        description = "How the agent authenticates to the account's cluster"
    )
)]
#[x_kube(validation = Rule::new(
    "!(has(self.kinds) && size(self.kinds) > 0 && has(self.omitKinds) && size(self.omitKinds) > 0)"
)
.message("set either kinds (watch only these) or omitKinds (watch all but these), not both")
.field_path(".omitKinds")
.reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new(
    "!(has(self.namespaces) && size(self.namespaces) > 0 && has(self.omitNamespaces) && size(self.omitNamespaces) > 0)"
)
.message("set either namespaces (watch only these) or omitNamespaces (watch all but these), not both")
.field_path(".omitNamespaces")
.reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new(
    "!has(self.callers) || self.callers != 'impersonate' || (has(self.callerUsers) && size(self.callerUsers) > 0) || (has(self.callerGroups) && size(self.callerGroups) > 0)"
)
.message("callers: impersonate needs callerUsers or callerGroups: the people admitted, by user (or [\"*\"] for every person) or by group")
.field_path(".callerUsers")
.reason(Reason::FieldValueRequired))]
#[serde(rename_all = "camelCase")]
pub struct AgentAccountSpec {
    /// Name of the ScaleAgent, in this namespace, that serves this account. Required.
    #[schemars(length(min = 1, max = 253))]
    pub agent_ref: String,

    /// Spinnaker account name, unique across every cluster connected to the hub, e.g.
    /// `prod-eu-west-1`. A lowercase DNS label: a-z, 0-9 and '-', at most 63 characters.
    /// Default: this AgentAccount's `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
        "message": "accountName must be a lowercase DNS label: a-z, 0-9 and '-', starting and ending with a letter or digit, e.g. prod-eu-west-1"
    }]))]
    pub account_name: Option<String>,

    /// How the agent authenticates to this account's cluster. Default: `{type: ServiceAccount}`,
    /// the agent's own ServiceAccount in this cluster (ScaleAgent mode `Agent`). For
    /// `Infrastructure` and `SpinnakerService` modes use `{type: Kubeconfig,
    /// kubeconfigSecretRef: {name: prod-kubeconfig}}`.
    #[serde(default)]
    pub credentials: Credentials,

    /// Watch only these namespaces, e.g. `[team-a, team-b]`. Default: every namespace the
    /// credentials may read (with ScaleAgent `scope.type: Namespaces`, only those). Each listed
    /// namespace costs one watch per kind. Not together with `omitNamespaces`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN)))]
    pub namespaces: Vec<String>,

    /// Watch every namespace the credentials may read except these, e.g. `[kube-system]`. Not
    /// together with `namespaces`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN)))]
    pub omit_namespaces: Vec<String>,

    /// Watch only these kinds, written as a kind (`Deployment`) or as resource.group
    /// (`deployments.apps`), e.g. `[Deployment, Service, Ingress]`; `["*"]` is every kind the
    /// credentials may list and watch. Default: the ScaleAgent's `defaults`, else the agent's
    /// default kinds (Deployment, ReplicaSet, StatefulSet, DaemonSet, Pod, Service, Ingress,
    /// Job, CronJob, ConfigMap, Secret, NetworkPolicy, HorizontalPodAutoscaler, Namespace,
    /// and the `customResources`). Spinnaker can still
    /// deploy other kinds only when `deployKinds` names them. Not together with `omitKinds`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub kinds: Vec<String>,

    /// Watch every kind the credentials may list and watch except these, e.g. `[Event]`. Not
    /// together with `kinds`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub omit_kinds: Vec<String>,

    /// Kinds Spinnaker may create, change and delete through this account (with ScaleAgent
    /// `access: Deploy`), written like `kinds`, e.g. `[Deployment, Service, Job]`; they need
    /// not be watched (a Job can be deployed without caching Jobs). Default: the watched kinds
    /// (`kinds`/`omitKinds`, the ScaleAgent's `defaults`, and `customResources`). `[]` makes
    /// the account read-only under a Deploy agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub deploy_kinds: Option<Vec<String>>,

    /// Custom resource kinds to expose to Spinnaker, e.g. `[{kind: ServiceMonitor, group:
    /// monitoring.coreos.com}]`. Needed with `onlyNamespacedResources`, where the agent does
    /// not discover CRDs itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_resources: Vec<CustomResourceKind>,

    /// Ignore cluster-scoped kinds (Namespaces, ClusterRoles, CRDs, ...), for credentials that
    /// may only read some namespaces. List the namespaces in `namespaces` and the custom
    /// resources in `customResources`. Default: false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub only_namespaced_resources: bool,

    /// Spinnaker (Fiat) roles allowed to use the account. Default: none, which lets every
    /// Spinnaker user read and deploy.
    #[serde(default, skip_serializing_if = "Permissions::is_empty")]
    pub permissions: Permissions,

    /// Let Spinnaker show pod CPU and memory usage (Armory's `metrics: true`): Clouddriver's
    /// `kubectl top pod --containers` reaches the cluster's metrics API (metrics-server must
    /// be installed) through the hub, tunnelled; the agent itself sends nothing. The operator
    /// grants the agent get and list on `metrics.k8s.io` pods; with the Cluster scope also on
    /// `metrics.k8s.io` nodes and core Nodes, which `kubectl top node` reads. Default: false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pod_metrics: bool,

    /// Let Secret data through the hub's Kubernetes API proxy for this account: full reads,
    /// lists and watches of Secrets (every form: `-o json`, tables, field selectors) and
    /// writes of Secrets, which answer with the object. Helm (release Secrets) and `kubectl
    /// apply` of Secrets through the proxy need it. Without it the proxy serves Secrets as
    /// the hub caches them (metadata only, no `data`) and refuses the rest with 403. Grants
    /// every holder of the account's tokens the Secrets the agent may read: reserved to
    /// cluster administrators by the shipped admission policy. Default: false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_secret_data: bool,

    /// Run this account's operations and the writes proxied to it (every method but GET,
    /// HEAD and OPTIONS, and exec, attach and port-forward) as this ServiceAccount, e.g.
    /// `{namespace: team-a, name: spinnaker-deployer}`, so what Spinnaker may change is what
    /// that ServiceAccount may change; the agent still watches and reads as itself. With
    /// `credentials.type: ServiceAccount` the operator grants the agent `impersonate` on
    /// exactly this ServiceAccount; with a kubeconfig, its identity must already hold it.
    /// Default: unset, everything runs as the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impersonate_service_account: Option<ServiceAccountRef>,

    /// Who this account's cluster sees for requests through the hub's Kubernetes API proxy.
    /// `agent` (default): every caller acts as the agent (its writes as
    /// `impersonateServiceAccount` when set). `impersonate`: a person's request (signed in
    /// through the hub's identity provider, or with a token issued by `scale-agent-hub
    /// kubeconfig --token-name <person>`) is replayed impersonating `<callerPrefix><user>`
    /// and `<callerPrefix><group>` for each of the person's groups listed in `callerGroups`,
    /// so the cluster's own RBAC decides (RoleBindings to those prefixed names) and its audit
    /// log names the person; Clouddriver's own token keeps acting as the agent. A person whose
    /// user is not in `callerUsers` and who is in none of `callerGroups` is refused. The
    /// operator grants the agent `impersonate` on exactly the prefixed users and groups
    /// listed (on every user name when `callerUsers` is `["*"]` or `callerGroups` is set).
    #[serde(default, skip_serializing_if = "Callers::is_agent")]
    pub callers: Callers,

    /// Put before every user and group name the agent impersonates for `callers: impersonate`,
    /// so a person can never be mistaken for one of the cluster's own users or groups. It
    /// must start with `scale-agent` and end with `:` (e.g. `scale-agent-prod:`, one per
    /// account when the same name may mean different people on different accounts): any
    /// other prefix could make the agent impersonate the cluster's own groups (`system:` +
    /// `masters`). Default: `scale-agent:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 12, max = 63), pattern(CALLER_PREFIX_PATTERN))]
    pub caller_prefix: Option<String>,

    /// `callers: impersonate`: the people admitted, by user name as the hub knows them
    /// (without `callerPrefix`), e.g. `[alice, bob]`; `["*"]` admits every person the hub
    /// authenticates, and then the operator grants `impersonate` on every user name (RBAC
    /// cannot grant a prefix), so only list `*` when that is acceptable. With
    /// `callers: impersonate`, this or `callerGroups` must be non-empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caller_users: Vec<String>,

    /// `callers: impersonate`: the groups whose members are admitted (whatever their user
    /// name) and passed on (without `callerPrefix`), e.g. `[team-a]`; a person's other groups
    /// are left out. The operator then grants the agent `impersonate` on these groups and on
    /// every user name (a group's members are not known in advance, and RBAC cannot grant a
    /// prefix); the agent still only sends `<callerPrefix><user>` of a person it admits.
    /// Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caller_groups: Vec<String>,
}

/// Who the target cluster sees for a request through the hub's proxy
/// ([`AgentAccountSpec::callers`]).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Callers {
    /// Every caller acts as the agent (today's behaviour).
    #[default]
    Agent,
    /// A person is impersonated (prefixed); Clouddriver's token acts as the agent.
    Impersonate,
}

impl Callers {
    pub fn is_agent(&self) -> bool {
        *self == Callers::Agent
    }
}

/// What an [`AgentAccountSpec::caller_prefix`] looks like: `scale-agent`, then lowercase
/// letters, digits, `-` or `.`, then `:`.
pub const CALLER_PREFIX_PATTERN: &str = "^scale-agent[a-z0-9.-]*:$";

/// The default [`AgentAccountSpec::caller_prefix`].
pub const DEFAULT_CALLER_PREFIX: &str = "scale-agent:";

/// A `callerUsers` entry admitting every person.
pub const ANY_CALLER: &str = "*";

/// A ServiceAccount, by namespace and name.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountRef {
    /// Namespace of the ServiceAccount. Required.
    #[schemars(length(min = 1, max = 63), pattern(DNS1123_LABEL_PATTERN))]
    pub namespace: String,

    /// Name of the ServiceAccount. Required.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl ServiceAccountRef {
    /// The user name the API server gives the ServiceAccount, which `Impersonate-User`
    /// carries: `system:serviceaccount:<namespace>:<name>`.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl AgentAccount {
    /// The Spinnaker account name: `spec.accountName`, or `metadata.name`.
    pub fn account_name(&self) -> Option<&str> {
        self.spec
            .account_name
            .as_deref()
            .or(self.metadata.name.as_deref())
    }
}

/// How the agent authenticates to the account's cluster.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.type != 'Kubeconfig' || has(self.kubeconfigSecretRef)")
    .message("credentials.kubeconfigSecretRef is required when credentials.type is Kubeconfig: name the Secret in this namespace that holds the kubeconfig")
    .field_path(".kubeconfigSecretRef")
    .reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("self.type != 'ServiceAccount' || !has(self.kubeconfigSecretRef)")
    .message("credentials.kubeconfigSecretRef is only used when credentials.type is Kubeconfig: set credentials.type to Kubeconfig, or remove kubeconfigSecretRef")
    .field_path(".kubeconfigSecretRef")
    .reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// `ServiceAccount` (default): the agent's own ServiceAccount, with the RBAC the operator
    /// grants from the ScaleAgent's `scope` and `access`; for ScaleAgent mode `Agent`.
    /// `Kubeconfig`: the kubeconfig in `kubeconfigSecretRef`, for a remote cluster; for modes
    /// `Infrastructure` and `SpinnakerService`.
    #[serde(rename = "type", default)]
    pub type_: CredentialsType,

    /// The Secret holding the kubeconfig. Required, and only allowed, when `type` is
    /// `Kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<KubeconfigSecretRef>,
}

impl Credentials {
    /// Credentials from the given kubeconfig Secret.
    pub fn kubeconfig(secret_ref: KubeconfigSecretRef) -> Self {
        Self {
            type_: CredentialsType::Kubeconfig,
            kubeconfig_secret_ref: Some(secret_ref),
        }
    }
}

/// Source of an account's cluster credentials.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CredentialsType {
    /// The agent's own ServiceAccount.
    #[default]
    ServiceAccount,
    /// A kubeconfig from a Secret.
    Kubeconfig,
}

/// A kubeconfig in a Secret.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSecretRef {
    /// Name of the Secret, in the AgentAccount's namespace. Required. The operator mounts it
    /// into the agent; its contents never leave the cluster.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Key of the Secret holding the kubeconfig. Default: `kubeconfig`. The kubeconfig must
    /// carry its credentials (token or client certificate); exec plugins are not run.
    #[serde(default = "default_kubeconfig_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,

    /// kubeconfig context to use. Default: the kubeconfig's `current-context`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub context: Option<String>,
}

fn default_kubeconfig_key() -> String {
    "kubeconfig".into()
}

/// A custom resource kind exposed to Spinnaker.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CustomResourceKind {
    /// The kind, as in the CRD's `spec.names.kind`, e.g. `ServiceMonitor`. Required.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,

    /// The API group, e.g. `monitoring.coreos.com`. Required.
    #[schemars(length(min = 1, max = 253))]
    pub group: String,

    /// The API version, e.g. `v1`. Default: the version the API server prefers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub version: Option<String>,

    /// Whether objects of the kind live in namespaces. Default: true.
    #[serde(default = "default_true")]
    pub namespaced: bool,
}

fn default_true() -> bool {
    true
}

/// Spinnaker roles per permission, as in Clouddriver's account `permissions`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Permissions {
    /// Roles that may see the account and its objects, e.g. `[dev-team, sre]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 253), pattern(ROLE_PATTERN)))]
    pub read: Vec<String>,

    /// Roles that may deploy to the account, e.g. `[sre]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1, max = 253), pattern(ROLE_PATTERN)))]
    pub write: Vec<String>,
}

// Surrounding whitespace in role names silently turned permissions off in Armory's agent,
// opening the account to everyone; reject it at admission instead.
const ROLE_PATTERN: &str = r"^\S(.*\S)?$";

impl Permissions {
    /// Whether no role is listed (every Spinnaker user may use the account).
    pub fn is_empty(&self) -> bool {
        self.read.is_empty() && self.write.is_empty()
    }
}

/// Observed state of an AgentAccount, written by the operator.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentAccountStatus {
    /// Current state: `Accepted` (the account passed the checks a schema cannot do: the
    /// ScaleAgent exists, the name is unique, the credentials fit the agent's mode; the message
    /// says what to change otherwise) and `Ready` (an agent serves it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Mirror of the `Accepted` condition, for `kubectl get`.
    #[serde(default)]
    pub accepted: bool,

    /// The Spinnaker account name in effect: `spec.accountName` or `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_name: Option<String>,

    /// The hub's view of the account, written by the agent (field manager
    /// `scale-agent-agent`) together with the `Connected` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<AccountHubStatus>,
}

impl AgentAccountStatus {
    /// The part the operator writes: without the agent's condition and `hub`.
    pub fn operator_part(&self) -> Self {
        Self {
            conditions: operator_conditions(&self.conditions),
            hub: None,
            ..self.clone()
        }
    }
}

/// The conditions of the types the operator writes.
pub fn operator_conditions(conditions: &[Condition]) -> Vec<Condition> {
    conditions
        .iter()
        .filter(|c| crate::conditions::OPERATOR_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect()
}

/// What the agent reports about an account.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AccountHubStatus {
    /// The agent pod that wrote this.
    #[serde(default)]
    pub replica: String,

    /// The account's state in the hub: `ACTIVE`, `INACTIVE`, `FAILED` or `ORPHANED`; `Unknown`
    /// while the writing replica cannot reach the hub (`Connected=False`, `HubUnreachable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,

    /// Why the account entered `state`, as the hub says it (for `Unknown`: why the replica
    /// cannot reach the hub).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,

    /// Kinds being watched, as `plural.group` (`plural` for the core group).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds_watched: Vec<String>,

    /// Kinds RBAC forbids or the API server fails for, with its message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds_forbidden: Vec<ForbiddenKind>,

    /// Objects sent to the hub by the writing replica since it started streaming.
    #[serde(default)]
    pub objects_streamed: i64,

    /// When the writing replica last sent an object (RFC 3339, to within the agent's status
    /// interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_time: Option<String>,
}

/// A kind the agent does not stream.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForbiddenKind {
    /// `plural.group` (`plural` for the core group).
    pub kind: String,
    /// The watch namespace; empty for a cluster-wide watch.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `Forbidden` (RBAC) or `Failing` (the API server failed; retried).
    pub state: String,
    /// The API server's message.
    pub message: String,
}
