//! The fleet install knobs of a ScaleAgent (`spec.nodeSelector`, `tolerations`, `env`, ...,
//! `crds::v1alpha1::AgentPod`) on the agent Deployment's pod template, and the
//! PodDisruptionBudget of `spec.podDisruptionBudget`.
//!
//! The operator's own labels, annotations and variables always win: the CRD refuses them in
//! the user's fields (CEL), and should a ScaleAgent get past an older CRD, the values here
//! drop the user's reserved keys and put the operator's on top.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{EnvVar, PodSpec, TopologySpreadConstraint},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use scale_agent_crds::{
    ScaleAgent,
    v1alpha1::{RESERVED_ENV, RESERVED_KEY_PREFIX, RESERVED_POD_LABELS},
};

use super::{agent_name, labels, owned_meta, selector_labels};
use crate::error::Result;

fn reserved_label(key: &str) -> bool {
    RESERVED_POD_LABELS.contains(&key) || key.starts_with(RESERVED_KEY_PREFIX)
}

/// The agent pods' labels: `spec.podLabels` without the operator's keys, then the
/// operator's labels (which the Deployment's selector and the PodDisruptionBudget use).
pub fn pod_labels(agent: &ScaleAgent) -> BTreeMap<String, String> {
    let mut pod_labels: BTreeMap<String, String> = agent
        .spec
        .pod
        .pod_labels
        .iter()
        .filter(|(key, _)| !reserved_label(key))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    pod_labels.extend(labels(agent));
    pod_labels
}

/// The agent pods' annotations: `spec.podAnnotations` without keys under
/// `scaleagent.dev/`; `None` when there are none.
pub fn pod_annotations(agent: &ScaleAgent) -> Option<BTreeMap<String, String>> {
    let annotations: BTreeMap<String, String> = agent
        .spec
        .pod
        .pod_annotations
        .iter()
        .filter(|(key, _)| !key.starts_with(RESERVED_KEY_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!annotations.is_empty()).then_some(annotations)
}

/// `spec.env` without the variables the operator sets (`POD_NAME`, `POD_NAMESPACE`), to go
/// after them: Kubernetes lets a later duplicate win, so a reserved name must not get here.
pub fn extra_env(agent: &ScaleAgent) -> Vec<EnvVar> {
    agent
        .spec
        .pod
        .env
        .iter()
        .filter(|var| !RESERVED_ENV.contains(&var.name.as_str()))
        .cloned()
        .collect()
}

/// `spec.topologySpreadConstraints`, each without a `labelSelector` given the agent pods'
/// selector; unset: spread over nodes, as soon as the scheduler can.
pub fn topology_spread(agent: &ScaleAgent) -> Vec<TopologySpreadConstraint> {
    let selector = || LabelSelector {
        match_labels: Some(selector_labels(agent)),
        ..Default::default()
    };
    match &agent.spec.pod.topology_spread_constraints {
        Some(constraints) => constraints
            .iter()
            .cloned()
            .map(|mut constraint| {
                constraint.label_selector.get_or_insert_with(selector);
                constraint
            })
            .collect(),
        None => vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: "kubernetes.io/hostname".into(),
            when_unsatisfiable: "ScheduleAnyway".into(),
            label_selector: Some(selector()),
            ..Default::default()
        }],
    }
}

/// Puts where the agent pods run and what they pull with into `pod`: image pull Secrets,
/// node selector, tolerations, affinity and priority class.
pub fn place(agent: &ScaleAgent, pod: &mut PodSpec) {
    let knobs = &agent.spec.pod;
    pod.image_pull_secrets =
        (!knobs.image_pull_secrets.is_empty()).then(|| knobs.image_pull_secrets.clone());
    pod.node_selector = (!knobs.node_selector.is_empty()).then(|| knobs.node_selector.clone());
    pod.tolerations = (!knobs.tolerations.is_empty()).then(|| knobs.tolerations.clone());
    pod.affinity = knobs.affinity.clone();
    pod.priority_class_name = knobs.priority_class_name.clone();
}

/// Name of the agent pods' PodDisruptionBudget: the Deployment's, `<scaleagent>-agent`.
pub fn pod_disruption_budget_name(agent: &ScaleAgent) -> String {
    agent_name(agent)
}

/// The PodDisruptionBudget of `spec.podDisruptionBudget`, selecting the agent pods by the
/// Deployment's selector and owned by the ScaleAgent; `None` when the field is unset (the
/// operator then deletes the one it made).
pub fn pod_disruption_budget(agent: &ScaleAgent) -> Result<Option<PodDisruptionBudget>> {
    let Some(budget) = &agent.spec.pod.pod_disruption_budget else {
        return Ok(None);
    };
    Ok(Some(PodDisruptionBudget {
        metadata: owned_meta(agent, pod_disruption_budget_name(agent))?,
        spec: Some(PodDisruptionBudgetSpec {
            min_available: budget.min_available.clone(),
            max_unavailable: budget.max_unavailable.clone(),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(agent)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use scale_agent_crds::{LABEL_INSTANCE, LABEL_MANAGED_BY};
    use serde_json::json;

    use super::*;
    use crate::desired::{deployment, tests::agent};

    fn knobs(spec: serde_json::Value) -> ScaleAgent {
        let mut agent = agent("prod");
        agent.spec.pod = serde_json::from_value(spec).unwrap();
        agent
    }

    #[test]
    fn every_knob_reaches_the_pod_template() {
        let agent = knobs(json!({
            "imagePullSecrets": [{ "name": "registry-credentials" }],
            "nodeSelector": { "node-role.example.com/infra": "true" },
            "tolerations": [{ "key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule" }],
            "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchExpressions": [{ "key": "kubernetes.io/os", "operator": "In", "values": ["linux"] }] }]
            } } },
            "priorityClassName": "infra-critical",
            "podLabels": { "team": "platform" },
            "podAnnotations": { "sidecar.istio.io/inject": "false" },
            "env": [
                { "name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128" },
                { "name": "NO_PROXY", "value": ".svc,.cluster.local" },
            ],
        }));
        let deployment = deployment(&agent, &BTreeSet::new()).unwrap();
        let template = deployment.spec.template;
        let meta = template.metadata.unwrap();
        let pod = template.spec.unwrap();
        assert_eq!(
            pod.image_pull_secrets.unwrap()[0].name,
            "registry-credentials"
        );
        assert_eq!(
            pod.node_selector.unwrap()["node-role.example.com/infra"],
            "true"
        );
        assert_eq!(pod.tolerations.unwrap()[0].value.as_deref(), Some("infra"));
        assert!(pod.affinity.unwrap().node_affinity.is_some());
        assert_eq!(pod.priority_class_name.as_deref(), Some("infra-critical"));
        let labels = meta.labels.unwrap();
        assert_eq!(labels["team"], "platform");
        assert_eq!(labels[LABEL_INSTANCE], "prod");
        assert_eq!(
            meta.annotations.unwrap()["sidecar.istio.io/inject"],
            "false"
        );
        let env: Vec<(String, Option<String>)> = pod.containers[0]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect();
        assert_eq!(
            env,
            [
                ("POD_NAME".to_string(), None),
                ("POD_NAMESPACE".to_string(), None),
                // The operator's own: the agent's drain on SIGTERM.
                (
                    "SCALE_AGENT_DRAIN_TIMEOUT_SECONDS".to_string(),
                    Some("25".to_string())
                ),
                (
                    "HTTPS_PROXY".to_string(),
                    Some("http://proxy.example.com:3128".to_string())
                ),
                (
                    "NO_PROXY".to_string(),
                    Some(".svc,.cluster.local".to_string())
                ),
            ]
        );
    }

    #[test]
    fn without_knobs_the_pod_template_is_as_before() {
        let deployment = deployment(&agent("prod"), &BTreeSet::new()).unwrap();
        let template = deployment.spec.template;
        assert!(template.metadata.unwrap().annotations.is_none());
        let pod = template.spec.unwrap();
        assert!(pod.image_pull_secrets.is_none());
        assert!(pod.node_selector.is_none());
        assert!(pod.tolerations.is_none());
        assert!(pod.affinity.is_none());
        assert!(pod.priority_class_name.is_none());
        // POD_NAME, POD_NAMESPACE and the drain's timeout: the operator's own variables.
        assert_eq!(pod.containers[0].env.as_ref().unwrap().len(), 3);
    }

    #[test]
    fn the_operators_labels_annotations_and_variables_cannot_be_overridden() {
        // What the CRD refuses, in case a ScaleAgent got past an older CRD.
        let agent = knobs(json!({
            "podLabels": {
                "app.kubernetes.io/instance": "someone-else",
                "app.kubernetes.io/managed-by": "helm",
                "scaleagent.dev/owner-namespace": "x",
                "team": "platform",
            },
            "podAnnotations": { "scaleagent.dev/desired-hash": "0", "team": "platform" },
            "env": [{ "name": "POD_NAME", "value": "forged" }, { "name": "LOG", "value": "1" }],
        }));
        let labels = pod_labels(&agent);
        assert_eq!(labels[LABEL_INSTANCE], "prod");
        assert_eq!(labels[LABEL_MANAGED_BY], "scale-agent-operator");
        assert!(!labels.contains_key("scaleagent.dev/owner-namespace"));
        assert_eq!(labels["team"], "platform");
        let annotations = pod_annotations(&agent).unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["team"]);
        let env: Vec<_> = extra_env(&agent).into_iter().map(|e| e.name).collect();
        assert_eq!(env, ["LOG"]);
        // The selector still matches the pods.
        let deployment = deployment(&agent, &BTreeSet::new()).unwrap();
        let spec = deployment.spec;
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (key, value) in spec.selector.match_labels.unwrap() {
            assert_eq!(pod_labels.get(&key), Some(&value), "{key}");
        }
    }

    #[test]
    fn topology_spread_defaults_to_nodes_and_constraints_get_the_agent_selector() {
        let default = topology_spread(&agent("prod"));
        assert_eq!(default.len(), 1);
        assert_eq!(default[0].topology_key, "kubernetes.io/hostname");
        let agent = knobs(json!({ "topologySpreadConstraints": [
            { "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule" },
            { "maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": { "matchLabels": { "team": "platform" } } },
        ] }));
        let constraints = topology_spread(&agent);
        assert_eq!(constraints[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(
            constraints[0]
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref(),
            Some(&selector_labels(&agent))
        );
        assert_eq!(
            constraints[1].label_selector.as_ref().unwrap().match_labels,
            Some([("team".to_string(), "platform".to_string())].into())
        );
        let off = knobs(json!({ "topologySpreadConstraints": [] }));
        assert!(topology_spread(&off).is_empty());
    }

    #[test]
    fn the_disruption_budget_selects_the_agent_pods_and_is_owned() {
        assert!(pod_disruption_budget(&agent("prod")).unwrap().is_none());
        let agent = knobs(json!({ "podDisruptionBudget": { "maxUnavailable": 1 } }));
        let budget = pod_disruption_budget(&agent).unwrap().unwrap();
        assert_eq!(budget.metadata.name.as_deref(), Some("prod-agent"));
        assert_eq!(budget.metadata.owner_references.unwrap()[0].uid, "uid-1");
        let spec = budget.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(spec.min_available, None);
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(selector_labels(&agent))
        );
        let percent = knobs(json!({ "podDisruptionBudget": { "minAvailable": "50%" } }));
        let spec = pod_disruption_budget(&percent)
            .unwrap()
            .unwrap()
            .spec
            .unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::String("50%".into())));
    }
}
