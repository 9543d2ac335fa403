//! RBAC for the agent's ServiceAccount, derived from what its accounts watch: the kind names
//! accounts use resolved to API groups and resources, and the rules built from them. Pure.
//!
//! Rules are minimal for what the accounts ask for:
//! - `ReadOnly`: `get`, `list`, `watch` on each watched resource.
//! - `Deploy`: also `create`, `update`, `patch`, `delete`, and `get`/`update`/`patch` on the
//!   `scale` subresource of scalable kinds.
//! - Secrets: only `list` and `watch` (the agent watches Secrets as metadata; it never reads
//!   their data), plus the write verbs for `Deploy`; and only when an account caches Secrets.
//! - An account that names no kinds watches every kind it may list. RBAC cannot subtract, so
//!   "everything except Secrets' data" is written as: the core (`""`) group's resources listed
//!   one by one (Secrets as list/watch), and `*` in every other API group the cluster serves
//!   at reconcile time (from discovery). Groups added later are picked up at the next
//!   reconcile (at the latest after the resync interval). `omitKinds` removes core resources;
//!   in other groups it only narrows what the agent watches, not what RBAC allows.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::PolicyRule;

/// A kind the operator knows the resource of.
#[derive(Clone, Copy, Debug)]
struct KnownKind {
    kind: &'static str,
    group: &'static str,
    resource: &'static str,
    namespaced: bool,
    scalable: bool,
}

const fn k(
    kind: &'static str,
    group: &'static str,
    resource: &'static str,
    namespaced: bool,
    scalable: bool,
) -> KnownKind {
    KnownKind {
        kind,
        group,
        resource,
        namespaced,
        scalable,
    }
}

/// The built-in kinds Spinnaker's Kubernetes provider deals with.
const KNOWN_KINDS: &[KnownKind] = &[
    k("Pod", "", "pods", true, false),
    k("Service", "", "services", true, false),
    k("ConfigMap", "", "configmaps", true, false),
    k("Secret", "", "secrets", true, false),
    k("ServiceAccount", "", "serviceaccounts", true, false),
    k("Endpoints", "", "endpoints", true, false),
    k("Event", "", "events", true, false),
    k(
        "PersistentVolumeClaim",
        "",
        "persistentvolumeclaims",
        true,
        false,
    ),
    k(
        "ReplicationController",
        "",
        "replicationcontrollers",
        true,
        true,
    ),
    k("LimitRange", "", "limitranges", true, false),
    k("ResourceQuota", "", "resourcequotas", true, false),
    k("PodTemplate", "", "podtemplates", true, false),
    k("Namespace", "", "namespaces", false, false),
    k("Node", "", "nodes", false, false),
    k("PersistentVolume", "", "persistentvolumes", false, false),
    k("Deployment", "apps", "deployments", true, true),
    k("ReplicaSet", "apps", "replicasets", true, true),
    k("StatefulSet", "apps", "statefulsets", true, true),
    k("DaemonSet", "apps", "daemonsets", true, false),
    k(
        "ControllerRevision",
        "apps",
        "controllerrevisions",
        true,
        false,
    ),
    k("Job", "batch", "jobs", true, false),
    k("CronJob", "batch", "cronjobs", true, false),
    k("Ingress", "networking.k8s.io", "ingresses", true, false),
    k(
        "NetworkPolicy",
        "networking.k8s.io",
        "networkpolicies",
        true,
        false,
    ),
    k(
        "IngressClass",
        "networking.k8s.io",
        "ingressclasses",
        false,
        false,
    ),
    k(
        "HorizontalPodAutoscaler",
        "autoscaling",
        "horizontalpodautoscalers",
        true,
        false,
    ),
    k(
        "PodDisruptionBudget",
        "policy",
        "poddisruptionbudgets",
        true,
        false,
    ),
    k("Role", "rbac.authorization.k8s.io", "roles", true, false),
    k(
        "RoleBinding",
        "rbac.authorization.k8s.io",
        "rolebindings",
        true,
        false,
    ),
    k(
        "ClusterRole",
        "rbac.authorization.k8s.io",
        "clusterroles",
        false,
        false,
    ),
    k(
        "ClusterRoleBinding",
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        false,
        false,
    ),
    k(
        "StorageClass",
        "storage.k8s.io",
        "storageclasses",
        false,
        false,
    ),
    k(
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        false,
        false,
    ),
    k(
        "EndpointSlice",
        "discovery.k8s.io",
        "endpointslices",
        true,
        false,
    ),
    k("Lease", "coordination.k8s.io", "leases", true, false),
];

/// A kind resolved to what RBAC needs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Resolved {
    /// API group; `""` for core.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// Whether objects live in namespaces (unknown custom kinds are assumed to).
    pub namespaced: bool,
    /// Whether the kind has a `scale` subresource.
    pub scalable: bool,
}

impl From<&KnownKind> for Resolved {
    fn from(known: &KnownKind) -> Self {
        Self {
            group: known.group.into(),
            resource: known.resource.into(),
            namespaced: known.namespaced,
            scalable: known.scalable,
        }
    }
}

/// A kind the cluster serves, from discovery (`kube::discovery`), so custom resources resolve
/// to their real plural, scope and subresources instead of a guess.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedKind {
    pub kind: String,
    pub resolved: Resolved,
}

/// Resolves a kind as accounts write it: `Deployment`, `deployment`, `deployments`,
/// `Deployment.apps` or `deployments.apps`; kinds outside the built-in table are looked up in
/// what the cluster serves (`served`). A name without a group that several groups serve, or a
/// kind the cluster does not serve, gives `None`.
pub fn resolve(kind: &str, served: &[ServedKind]) -> Option<Resolved> {
    let (name, group) = match kind.split_once('.') {
        Some((name, group)) => (name, Some(group)),
        None => (kind, None),
    };
    let lower = name.to_ascii_lowercase();
    let known = KNOWN_KINDS.iter().find(|known| {
        (known.kind.eq_ignore_ascii_case(name) || known.resource == lower)
            && group.is_none_or(|g| g == known.group)
    });
    if let Some(known) = known {
        return Some(known.into());
    }
    let mut matches = served.iter().filter(|served| {
        (served.kind.eq_ignore_ascii_case(name) || served.resolved.resource == lower)
            && group.is_none_or(|g| g == served.resolved.group)
    });
    let first = matches.next()?;
    // One group, or the name is ambiguous and must carry its group.
    matches
        .all(|other| other.resolved.group == first.resolved.group)
        .then(|| first.resolved.clone())
}

/// What one account wants watched, in RBAC terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Watched {
    /// Every kind the account may list (no `kinds` set).
    pub everything: bool,
    /// Explicit resources (when not `everything`), or custom resources in addition.
    pub resources: BTreeSet<Resolved>,
    /// Core resources to leave out when `everything`.
    pub omitted: BTreeSet<Resolved>,
}

/// Resolves the kinds of one account (its own `kinds`/`omitKinds`, else the agent defaults,
/// plus its custom resources). Unresolvable kind names are returned as the error.
pub fn watched(
    kinds: &[String],
    omit_kinds: &[String],
    custom: &[(String, String)],
    served: &[ServedKind],
) -> Result<Watched, Vec<String>> {
    let mut unknown = Vec::new();
    let mut resolve_all = |names: &[String]| -> BTreeSet<Resolved> {
        names
            .iter()
            .filter_map(|name| {
                let resolved = resolve(name, served);
                if resolved.is_none() {
                    unknown.push(name.clone());
                }
                resolved
            })
            .collect()
    };
    let mut watched = if kinds.is_empty() {
        Watched {
            everything: true,
            resources: BTreeSet::new(),
            omitted: resolve_all(omit_kinds),
        }
    } else {
        Watched {
            everything: false,
            resources: resolve_all(kinds),
            omitted: BTreeSet::new(),
        }
    };
    for (kind, group) in custom {
        match resolve(&format!("{kind}.{group}"), served) {
            Some(resolved) => {
                watched.resources.insert(resolved);
            }
            None => unknown.push(format!("{kind}.{group}")),
        }
    }
    if unknown.is_empty() {
        Ok(watched)
    } else {
        Err(unknown)
    }
}

/// The agent's right to write the hub's verdict: `patch` on the status subresource of its
/// own ScaleAgent and of exactly the AgentAccounts it serves (`resourceNames`), nothing else.
pub fn status_rules(scale_agent: &str, agent_accounts: &BTreeSet<String>) -> Vec<PolicyRule> {
    let rule = |resource: &str, names: Vec<String>| PolicyRule {
        api_groups: Some(vec![scale_agent_crds::GROUP.to_owned()]),
        resources: Some(vec![format!("{resource}/status")]),
        verbs: vec!["patch".into()],
        resource_names: Some(names),
        ..Default::default()
    };
    let mut rules = vec![rule("scaleagents", vec![scale_agent.to_owned()])];
    // An empty resourceNames would mean every object: leave the rule out instead.
    if !agent_accounts.is_empty() {
        rules.push(rule(
            "agentaccounts",
            agent_accounts.iter().cloned().collect(),
        ));
    }
    rules
}

/// Read verbs.
pub const READ_VERBS: &[&str] = &["get", "list", "watch"];
/// Write verbs added for `Deploy`.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete"];
/// Verbs on Secrets for reading: metadata-only list and watch, never `get`.
pub const SECRET_READ_VERBS: &[&str] = &["list", "watch"];

/// Builds the rules for the union of what the accounts watch.
///
/// `cluster_scoped` says whether the rules go into a ClusterRole (cluster-scoped kinds are
/// only meaningful there); `api_groups` are the non-core groups the cluster serves, used when
/// an account watches everything.
pub fn rules(
    watched: &[Watched],
    deploy: bool,
    cluster_scoped: bool,
    api_groups: &[String],
) -> Vec<PolicyRule> {
    let everything = watched.iter().any(|w| w.everything);
    // group -> resources
    let mut resources: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut scale: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut secrets = false;
    let mut add = |r: &Resolved, resources: &mut BTreeMap<String, BTreeSet<String>>| {
        if !r.namespaced && !cluster_scoped {
            return;
        }
        if r.group.is_empty() && r.resource == "secrets" {
            secrets = true;
            return;
        }
        resources
            .entry(r.group.clone())
            .or_default()
            .insert(r.resource.clone());
        if r.scalable {
            scale
                .entry(r.group.clone())
                .or_default()
                .insert(format!("{}/scale", r.resource));
        }
    };
    for w in watched {
        for r in &w.resources {
            add(r, &mut resources);
        }
    }
    if everything {
        // Core resources one by one; a core kind omitted by every account watching
        // everything is left out.
        for known in KNOWN_KINDS.iter().filter(|k| k.group.is_empty()) {
            let resolved = Resolved::from(known);
            let omitted_by_all = watched
                .iter()
                .filter(|w| w.everything)
                .all(|w| w.omitted.contains(&resolved));
            if !omitted_by_all {
                add(&resolved, &mut resources);
            }
        }
        for group in api_groups.iter().filter(|g| !g.is_empty()) {
            resources
                .entry(group.clone())
                .or_default()
                .insert("*".into());
        }
    }
    // `*` covers every resource of the group, subresources included.
    for (group, set) in &mut resources {
        if set.contains("*") {
            set.retain(|r| r == "*");
            scale.remove(group);
        }
    }
    let verbs = |extra: &[&str], base: &[&str], deploy: bool| -> Vec<String> {
        let mut verbs: Vec<String> = base.iter().map(|v| v.to_string()).collect();
        if deploy {
            verbs.extend(extra.iter().map(|v| v.to_string()));
        }
        verbs
    };
    let mut rules = Vec::new();
    for (group, set) in resources {
        rules.push(PolicyRule {
            api_groups: Some(vec![group]),
            resources: Some(set.into_iter().collect()),
            verbs: verbs(WRITE_VERBS, READ_VERBS, deploy),
            ..Default::default()
        });
    }
    if secrets {
        rules.push(PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            verbs: verbs(WRITE_VERBS, SECRET_READ_VERBS, deploy),
            ..Default::default()
        });
    }
    if deploy {
        for (group, set) in scale {
            rules.push(PolicyRule {
                api_groups: Some(vec![group]),
                resources: Some(set.into_iter().collect()),
                verbs: vec!["get".into(), "update".into(), "patch".into()],
                ..Default::default()
            });
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// What discovery reports for a cluster with a few custom resources.
    fn served() -> Vec<ServedKind> {
        let kind = |kind: &str, group: &str, resource: &str, namespaced, scalable| ServedKind {
            kind: kind.into(),
            resolved: Resolved {
                group: group.into(),
                resource: resource.into(),
                namespaced,
                scalable,
            },
        };
        vec![
            kind(
                "ServiceMonitor",
                "monitoring.coreos.com",
                "servicemonitors",
                true,
                false,
            ),
            kind(
                "Prometheus",
                "monitoring.coreos.com",
                "prometheuses",
                true,
                true,
            ),
            kind(
                "ClusterIssuer",
                "cert-manager.io",
                "clusterissuers",
                false,
                false,
            ),
            kind(
                "Certificate",
                "cert-manager.io",
                "certificates",
                true,
                false,
            ),
            kind("Certificate", "example.com", "certificates", true, false),
        ]
    }

    #[test]
    fn resolves_the_spellings_accounts_use() {
        for spelling in [
            "Deployment",
            "deployment",
            "deployments",
            "Deployment.apps",
            "deployments.apps",
        ] {
            let resolved = resolve(spelling, &[]).unwrap();
            assert_eq!(
                (resolved.group.as_str(), resolved.resource.as_str()),
                ("apps", "deployments")
            );
            assert!(resolved.scalable);
        }
        assert_eq!(
            resolve("NetworkPolicy", &[]).unwrap().group,
            "networking.k8s.io"
        );
    }

    #[test]
    fn custom_kinds_resolve_to_what_the_cluster_serves() {
        let served = served();
        // The real plural, scope and scale subresource, not guesses.
        let prometheus = resolve("Prometheus.monitoring.coreos.com", &served).unwrap();
        assert_eq!(prometheus.resource, "prometheuses");
        assert!(prometheus.scalable);
        let issuer = resolve("ClusterIssuer", &served).unwrap();
        assert_eq!(issuer.group, "cert-manager.io");
        assert!(!issuer.namespaced);
        assert_eq!(
            resolve("servicemonitors", &served).unwrap().group,
            "monitoring.coreos.com"
        );
        // Served by two groups: it must carry its group.
        assert!(resolve("Certificate", &served).is_none());
        assert_eq!(
            resolve("certificates.cert-manager.io", &served)
                .unwrap()
                .group,
            "cert-manager.io"
        );
        // Not served at all (its CRD is not installed): unknown, not guessed.
        assert!(resolve("Widget.example.org", &served).is_none());
        assert!(resolve("ServiceMonitor", &[]).is_none());
    }

    #[test]
    fn read_only_rules_cover_only_the_kinds() {
        let w = watched(
            &names(&["Deployment", "ConfigMap", "Namespace"]),
            &[],
            &[],
            &[],
        )
        .unwrap();
        let rules = rules(&[w], false, false, &[]);
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(rules[0].api_groups, Some(vec![String::new()]));
        assert_eq!(
            rules[0].resources,
            Some(names(&["configmaps"])),
            "namespaces dropped from a Role"
        );
        assert_eq!(rules[0].verbs, names(READ_VERBS));
        assert_eq!(rules[1].resources, Some(names(&["deployments"])));
    }

    #[test]
    fn deploy_adds_writes_and_scale() {
        let w = watched(&names(&["Deployment", "Namespace"]), &[], &[], &[]).unwrap();
        let rules = rules(&[w], true, true, &[]);
        assert_eq!(rules.len(), 3, "{rules:?}");
        assert_eq!(rules[0].resources, Some(names(&["namespaces"])));
        assert_eq!(
            rules[1].verbs,
            names(&[
                "get", "list", "watch", "create", "update", "patch", "delete"
            ])
        );
        assert_eq!(rules[2].resources, Some(names(&["deployments/scale"])));
    }

    #[test]
    fn secrets_are_list_watch_only_and_only_when_watched() {
        let w = watched(&names(&["Secret"]), &[], &[], &[]).unwrap();
        let rules_ro = rules(std::slice::from_ref(&w), false, false, &[]);
        assert_eq!(rules_ro.len(), 1);
        assert_eq!(rules_ro[0].verbs, names(&["list", "watch"]));
        let rules_deploy = rules(&[w], true, false, &[]);
        assert!(!rules_deploy[0].verbs.contains(&"get".to_string()));

        let everything_but_secrets = watched(&[], &names(&["Secret"]), &[], &[]).unwrap();
        let all = rules(
            &[everything_but_secrets],
            false,
            true,
            &names(&["apps", "batch"]),
        );
        assert!(all.iter().all(|r| {
            !r.resources
                .as_ref()
                .unwrap()
                .contains(&"secrets".to_string())
        }));
        assert!(
            all.iter()
                .any(|r| r.api_groups == Some(names(&["apps"]))
                    && r.resources == Some(names(&["*"])))
        );
        let core = &all[0];
        assert!(
            core.resources
                .as_ref()
                .unwrap()
                .contains(&"pods".to_string())
        );
        assert!(
            core.resources
                .as_ref()
                .unwrap()
                .contains(&"namespaces".to_string())
        );
    }

    #[test]
    fn unknown_kinds_are_reported() {
        assert_eq!(
            watched(&names(&["Deployment", "Widget"]), &[], &[], &[]).unwrap_err(),
            names(&["Widget"])
        );
        let custom = watched(
            &names(&["Pod"]),
            &[],
            &[("ServiceMonitor".into(), "monitoring.coreos.com".into())],
            &served(),
        )
        .unwrap();
        assert_eq!(custom.resources.len(), 2);
        assert_eq!(
            watched(
                &names(&["Pod"]),
                &[],
                &[("Widget".into(), "example.org".into())],
                &served(),
            )
            .unwrap_err(),
            names(&["Widget.example.org"])
        );
    }
}
