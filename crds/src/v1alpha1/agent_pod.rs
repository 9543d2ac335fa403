//! The fleet install knobs of a ScaleAgent's pods: where they may run (node selector,
//! tolerations, affinity, topology spread, priority), what they carry (labels, annotations,
//! environment, image pull Secrets) and the PodDisruptionBudget that guards them. Flattened
//! into [`ScaleAgentSpec`](super::ScaleAgentSpec), so each is a top-level `spec` field as in
//! a Deployment's pod template.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Affinity, EnvVar, LocalObjectReference, Toleration, TopologySpreadConstraint},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Pod labels the operator sets on every agent pod and selects them by; `spec.podLabels`
/// may not set them (the CRD refuses it, and the operator's values win if it is bypassed).
pub const RESERVED_POD_LABELS: &[&str] = &[
    crate::LABEL_NAME,
    crate::LABEL_INSTANCE,
    crate::LABEL_COMPONENT,
    crate::LABEL_MANAGED_BY,
    crate::LABEL_PART_OF,
];

/// Prefix of the label and annotation keys the operator keeps for itself.
pub const RESERVED_KEY_PREFIX: &str = "scaleagent.dev/";

/// Environment variables the operator sets on the agent container from the pod's own
/// metadata; `spec.env` may not set them.
pub const RESERVED_ENV: &[&str] = &["POD_NAME", "POD_NAMESPACE"];

/// Where the agent pods run and what they carry, beyond the image and resources.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentPod {
    /// Secrets in this namespace holding credentials for the registry of `image`
    /// (`kubernetes.io/dockerconfigjson`), e.g. `[{name: registry-credentials}]`: the private
    /// registry path. Default: none (the ServiceAccount's, if any, still apply).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Node labels an agent pod's node must have, e.g. `{kubernetes.io/os: linux,
    /// node-role.example.com/infra: "true"}`. A selector no node matches leaves the pods
    /// Pending. Default: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub node_selector: BTreeMap<String, String>,

    /// Taints of the nodes the agent pods tolerate, as in a pod spec, e.g. `[{key:
    /// dedicated, operator: Equal, value: infra, effect: NoSchedule}]`. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,

    /// Node and pod affinity and anti-affinity of the agent pods, as in a pod spec.
    /// Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// PriorityClass of the agent pods, e.g. `system-cluster-critical` or one of your own;
    /// it must exist when the pods are created. Default: none (the cluster's default
    /// priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,

    /// How the agent pods spread over topology domains, as in a pod spec. A constraint
    /// without `labelSelector` gets the agent pods' selector. Default (unset): spread over
    /// nodes (`kubernetes.io/hostname`, maxSkew 1, ScheduleAnyway); `[]` turns spreading off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// Extra labels on the agent pods, e.g. for network policies or cost allocation. The
    /// operator's own (`app.kubernetes.io/name`, `instance`, `component`, `managed-by`,
    /// `part-of`, and keys under `scaleagent.dev/`) cannot be set here. Default: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(k, !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance', 'app.kubernetes.io/component', 'app.kubernetes.io/managed-by', 'app.kubernetes.io/part-of']) && !k.startsWith('scaleagent.dev/'))",
        "message": "podLabels may not set app.kubernetes.io/name, instance, component, managed-by or part-of, nor keys under scaleagent.dev/: the operator sets them and selects its pods by them; use another key"
    }]))]
    pub pod_labels: BTreeMap<String, String>,

    /// Extra annotations on the agent pods, e.g. for a service mesh or a log shipper. Keys
    /// under `scaleagent.dev/` are the operator's and cannot be set here. Default: none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(k, !k.startsWith('scaleagent.dev/'))",
        "message": "podAnnotations may not set keys under scaleagent.dev/: the operator keeps them for itself; use another key"
    }]))]
    pub pod_annotations: BTreeMap<String, String>,

    /// Extra environment variables of the agent container, as in a container spec, after
    /// the operator's `POD_NAME` and `POD_NAMESPACE` (which cannot be set here). The egress
    /// proxy goes here: `[{name: HTTPS_PROXY, value: "http://proxy.example.com:3128"},
    /// {name: NO_PROXY, value: ".svc,.cluster.local,10.0.0.0/8"}]` (see the agent's README,
    /// "Egress proxy"). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(e, !(e.name in ['POD_NAME', 'POD_NAMESPACE']))",
        "message": "env may not set POD_NAME or POD_NAMESPACE: the operator sets them from the pod's metadata; use another name"
    }]))]
    pub env: Vec<EnvVar>,

    /// A PodDisruptionBudget for the agent pods, owned by this ScaleAgent (named like the
    /// Deployment), so node drains keep enough agents up: `{maxUnavailable: 1}` or
    /// `{minAvailable: 1}` (a number or a percentage), exactly one. Removing the field
    /// removes the budget. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<AgentDisruptionBudget>,
}

/// How many agent pods a voluntary disruption (a node drain) may take down at once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.minAvailable) != has(self.maxUnavailable)")
.message("podDisruptionBudget needs exactly one of minAvailable and maxUnavailable, e.g. {maxUnavailable: 1}")
.reason(Reason::FieldValueInvalid))]
#[serde(rename_all = "camelCase")]
pub struct AgentDisruptionBudget {
    /// Agent pods that must stay available during a disruption: a number (`1`) or a
    /// percentage of `replicas` (`"50%"`). Not together with `maxUnavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,

    /// Agent pods a disruption may take down at once: a number (`1`) or a percentage of
    /// `replicas` (`"50%"`). Not together with `minAvailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}
