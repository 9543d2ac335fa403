//! Which kinds an account watches, chosen from discovery results (pure; see the tests).
//!
//! Rules, in order:
//! - the kind must support both `list` and `watch`;
//! - cluster-scoped kinds are skipped when the account sets `onlyNamespacedResources` or
//!   `namespaces` (a namespace-limited account has no cluster-wide view);
//! - the group's preferred version is used, unless a `customResourceDefinitions` entry names
//!   a version;
//! - with `kinds` set, only the kinds it (or `customResourceDefinitions`) names; a pattern
//!   matches the Kind, the plural, `Kind.group` or `plural.group`, case-insensitively, and
//!   `*` names every kind;
//! - with neither `kinds` nor `omitKinds`, the [`DEFAULT_KINDS`] (and the custom resources
//!   `customResourceDefinitions` names): Armory's recommended set plus what Clouddriver's
//!   classic UI reads, not everything listable, which would bound nothing;
//! - with only `omitKinds`, every kind but those;
//! - `omitKinds` removes kinds, with the same matching;
//! - Events (`v1` and `events.k8s.io`) and coordination Leases are omitted by default: they
//!   churn constantly and Spinnaker does not deploy them. Name them in `kinds` to cache them.

use std::collections::BTreeSet;

use scale_agent_crds::agent_config::AccountConfig;
use scale_agent_proto::v1;

/// Kinds an account watches when it sets neither `kinds` nor `omitKinds`, as `(group, Kind)`:
/// Armory's recommended set (Deployment, ReplicaSet, StatefulSet, DaemonSet, Pod, Service,
/// Ingress, Job, CronJob) and what Clouddriver's classic UI shows besides: ConfigMaps and
/// Secrets (versioned artifacts; Secrets as metadata only), NetworkPolicies (firewalls),
/// HorizontalPodAutoscalers (server group autoscaling) and Namespaces.
pub const DEFAULT_KINDS: &[(&str, &str)] = &[
    ("apps", "Deployment"),
    ("apps", "ReplicaSet"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("", "Pod"),
    ("", "Service"),
    ("networking.k8s.io", "Ingress"),
    ("batch", "Job"),
    ("batch", "CronJob"),
    ("", "ConfigMap"),
    ("", "Secret"),
    ("networking.k8s.io", "NetworkPolicy"),
    ("autoscaling", "HorizontalPodAutoscaler"),
    ("", "Namespace"),
];

/// The `kinds` entry that names every kind.
pub const ALL_KINDS: &str = "*";

/// Kinds left out unless `kinds` names them: `(group, Kind)`.
pub const DEFAULT_OMITTED: &[(&str, &str)] = &[
    ("", "Event"),
    ("events.k8s.io", "Event"),
    ("coordination.k8s.io", "Lease"),
];

/// A kind as discovery names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KindRef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
}

impl KindRef {
    /// `plural` for the core group, else `plural.group`: the label used in metrics and logs.
    pub fn label(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Core Secrets are watched as metadata only.
    pub fn is_secret(&self) -> bool {
        self.group.is_empty() && self.kind == "Secret"
    }

    pub fn to_proto(&self) -> v1::Kind {
        v1::Kind {
            group: self.group.clone(),
            version: self.version.clone(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
            namespaced: self.namespaced,
        }
    }

    pub fn api_resource(&self) -> kube::discovery::ApiResource {
        kube::discovery::ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }

    /// Whether a hub `Kind` (from a resume point) is this kind: same group and plural, any
    /// version (resourceVersions are shared by all versions of a resource).
    pub fn same_resource(&self, other: &v1::Kind) -> bool {
        self.group == other.group && self.plural == other.plural
    }
}

/// One resource of one version, as discovery lists it.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub kind: KindRef,
    pub verbs: Vec<String>,
    /// In the group's preferred (or only) version.
    pub preferred: bool,
}

/// Whether `pattern` names `kind`: its Kind, plural, `Kind.group` or `plural.group`,
/// case-insensitively.
pub fn matches(pattern: &str, kind: &KindRef) -> bool {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return false;
    }
    let eq = |candidate: &str| candidate.eq_ignore_ascii_case(pattern);
    if eq(&kind.kind) || eq(&kind.plural) {
        return true;
    }
    if kind.group.is_empty() {
        return false;
    }
    eq(&format!("{}.{}", kind.kind, kind.group)) || eq(&format!("{}.{}", kind.plural, kind.group))
}

fn default_omitted(kind: &KindRef) -> bool {
    DEFAULT_OMITTED
        .iter()
        .any(|(group, name)| kind.group == *group && kind.kind == *name)
}

fn default_kind(kind: &KindRef) -> bool {
    DEFAULT_KINDS
        .iter()
        .any(|(group, name)| kind.group == *group && kind.kind == *name)
}

/// The kinds `account` watches among the discovered `candidates`, sorted, one version each.
pub fn select_kinds(account: &AccountConfig, candidates: &[Candidate]) -> Vec<KindRef> {
    let namespace_limited = account.only_namespaced_resources || !account.namespaces.is_empty();
    let every_kind = account.kinds.iter().any(|k| k.trim() == ALL_KINDS);
    let defaults = account.kinds.is_empty() && account.omit_kinds.is_empty();
    let mut chosen: Vec<KindRef> = Vec::new();
    let mut seen = BTreeSet::new();
    for candidate in candidates {
        let kind = &candidate.kind;
        let has = |verb: &str| candidate.verbs.iter().any(|v| v == verb);
        if !has("list") || !has("watch") {
            continue;
        }
        if namespace_limited && !kind.namespaced {
            continue;
        }
        let custom = account
            .custom_resource_definitions
            .iter()
            .find(|crd| matches(&crd.kind, kind));
        let version_ok = match custom.and_then(|crd| crd.version.as_deref()) {
            Some(version) => kind.version == version,
            None => candidate.preferred,
        };
        if !version_ok {
            continue;
        }
        let named = custom.is_some() || account.kinds.iter().any(|k| matches(k, kind));
        let wanted = if every_kind || (account.kinds.is_empty() && !defaults) {
            true
        } else if defaults {
            named || default_kind(kind)
        } else {
            named
        };
        if !wanted {
            continue;
        }
        if account.omit_kinds.iter().any(|k| matches(k, kind)) {
            continue;
        }
        if default_omitted(kind) && !named {
            continue;
        }
        if seen.insert((kind.group.clone(), kind.plural.clone())) {
            chosen.push(kind.clone());
        }
    }
    chosen.sort();
    chosen
}

/// The watches a kind needs: one per listed namespace (minus `omitNamespaces`) for a
/// namespaced kind of a namespace-limited account, else one cluster-wide watch (`None`).
pub fn watch_namespaces(account: &AccountConfig, kind: &KindRef) -> Vec<Option<String>> {
    if kind.namespaced && !account.namespaces.is_empty() {
        let mut namespaces: Vec<Option<String>> = account
            .namespaces
            .iter()
            .filter(|ns| !account.omit_namespaces.contains(ns))
            .map(|ns| Some(ns.clone()))
            .collect();
        namespaces.sort();
        namespaces.dedup();
        namespaces
    } else {
        vec![None]
    }
}

#[cfg(test)]
mod tests {
    use scale_agent_crds::agent_config::CustomResourceConfig;

    use super::*;

    fn kind(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> KindRef {
        KindRef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        }
    }

    fn candidate(k: KindRef) -> Candidate {
        Candidate {
            kind: k,
            verbs: ["get", "list", "watch"].map(String::from).to_vec(),
            preferred: true,
        }
    }

    fn discovered() -> Vec<Candidate> {
        let mut all = vec![
            candidate(kind("", "v1", "ConfigMap", "configmaps", true)),
            candidate(kind("", "v1", "Secret", "secrets", true)),
            candidate(kind("", "v1", "Namespace", "namespaces", false)),
            candidate(kind("", "v1", "Event", "events", true)),
            candidate(kind("events.k8s.io", "v1", "Event", "events", true)),
            candidate(kind("coordination.k8s.io", "v1", "Lease", "leases", true)),
            candidate(kind("apps", "v1", "Deployment", "deployments", true)),
            candidate(kind(
                "monitoring.coreos.com",
                "v1",
                "ServiceMonitor",
                "servicemonitors",
                true,
            )),
        ];
        let mut old = candidate(kind(
            "monitoring.coreos.com",
            "v1beta1",
            "ServiceMonitor",
            "servicemonitors",
            true,
        ));
        old.preferred = false;
        all.push(old);
        let mut create_only = candidate(kind("", "v1", "Binding", "bindings", true));
        create_only.verbs = vec!["create".into()];
        all.push(create_only);
        all
    }

    fn labels(kinds: &[KindRef]) -> Vec<String> {
        kinds.iter().map(KindRef::label).collect()
    }

    #[test]
    fn patterns_match_kind_plural_and_group_forms_case_insensitively() {
        let deployment = kind("apps", "v1", "Deployment", "deployments", true);
        for pattern in [
            "Deployment",
            "deployment",
            "deployments",
            "Deployment.apps",
            "DEPLOYMENTS.APPS",
        ] {
            assert!(matches(pattern, &deployment), "{pattern}");
        }
        for pattern in ["Deployment.extensions", "deploy", "", "apps"] {
            assert!(!matches(pattern, &deployment), "{pattern}");
        }
        let configmap = kind("", "v1", "ConfigMap", "configmaps", true);
        assert!(matches("configMap", &configmap));
        assert!(!matches("configmaps.", &configmap));
    }

    #[test]
    fn by_default_the_default_kinds_and_named_custom_resources() {
        let mut all = discovered();
        // A same-named kind of another group is not a default kind.
        all.push(candidate(kind("example.com", "v1", "Job", "jobs", true)));
        let account = AccountConfig::default();
        let chosen = select_kinds(&account, &all);
        assert_eq!(
            labels(&chosen),
            ["configmaps", "namespaces", "secrets", "deployments.apps"]
        );
        let account = AccountConfig {
            custom_resource_definitions: vec![CustomResourceConfig {
                kind: "ServiceMonitor.monitoring.coreos.com".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let chosen = select_kinds(&account, &all);
        assert_eq!(
            labels(&chosen),
            [
                "configmaps",
                "namespaces",
                "secrets",
                "deployments.apps",
                "servicemonitors.monitoring.coreos.com"
            ]
        );
        assert_eq!(chosen[4].version, "v1", "preferred version");
    }

    #[test]
    fn a_star_or_omit_kinds_alone_means_everything_listable_but_events_and_leases() {
        let everything = [
            "configmaps",
            "namespaces",
            "secrets",
            "deployments.apps",
            "servicemonitors.monitoring.coreos.com",
        ];
        let star = AccountConfig {
            kinds: vec!["*".into()],
            ..Default::default()
        };
        assert_eq!(labels(&select_kinds(&star, &discovered())), everything);
        let star_and_events = AccountConfig {
            kinds: vec!["*".into(), "Event".into()],
            ..Default::default()
        };
        assert_eq!(select_kinds(&star_and_events, &discovered()).len(), 7);
        let omit = AccountConfig {
            omit_kinds: vec!["Secret".into()],
            ..Default::default()
        };
        assert_eq!(
            labels(&select_kinds(&omit, &discovered())),
            [
                "configmaps",
                "namespaces",
                "deployments.apps",
                "servicemonitors.monitoring.coreos.com"
            ]
        );
    }

    #[test]
    fn kinds_limit_and_can_bring_back_events() {
        let account = AccountConfig {
            kinds: vec!["deployment".into(), "Event".into()],
            ..Default::default()
        };
        assert_eq!(
            labels(&select_kinds(&account, &discovered())),
            ["events", "deployments.apps", "events.events.k8s.io"]
        );
        let account = AccountConfig {
            kinds: vec!["events.events.k8s.io".into()],
            ..Default::default()
        };
        assert_eq!(
            labels(&select_kinds(&account, &discovered())),
            ["events.events.k8s.io"]
        );
    }

    #[test]
    fn omit_kinds_and_namespace_limits() {
        let account = AccountConfig {
            omit_kinds: vec![
                "secrets".into(),
                "ServiceMonitor.monitoring.coreos.com".into(),
            ],
            only_namespaced_resources: true,
            ..Default::default()
        };
        assert_eq!(
            labels(&select_kinds(&account, &discovered())),
            ["configmaps", "deployments.apps"]
        );
        let account = AccountConfig {
            namespaces: vec!["web".into()],
            kinds: vec!["Namespace".into(), "ConfigMap".into()],
            ..Default::default()
        };
        assert_eq!(
            labels(&select_kinds(&account, &discovered())),
            ["configmaps"]
        );
    }

    #[test]
    fn custom_resources_add_to_kinds_and_pin_versions() {
        let account = AccountConfig {
            kinds: vec!["ConfigMap".into()],
            custom_resource_definitions: vec![CustomResourceConfig {
                kind: "ServiceMonitor.monitoring.coreos.com".into(),
                version: Some("v1beta1".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let chosen = select_kinds(&account, &discovered());
        assert_eq!(
            labels(&chosen),
            ["configmaps", "servicemonitors.monitoring.coreos.com"]
        );
        assert_eq!(chosen[1].version, "v1beta1");
    }

    #[test]
    fn one_watch_per_listed_namespace_for_namespaced_kinds() {
        let configmap = kind("", "v1", "ConfigMap", "configmaps", true);
        let namespace = kind("", "v1", "Namespace", "namespaces", false);
        let account = AccountConfig {
            namespaces: vec!["b".into(), "a".into(), "skip".into()],
            omit_namespaces: vec!["skip".into()],
            ..Default::default()
        };
        assert_eq!(
            watch_namespaces(&account, &configmap),
            [Some("a".to_string()), Some("b".to_string())]
        );
        assert_eq!(watch_namespaces(&account, &namespace), [None]);
        assert_eq!(
            watch_namespaces(&AccountConfig::default(), &configmap),
            [None]
        );
    }
}
