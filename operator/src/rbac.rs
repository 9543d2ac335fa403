//! RBAC for the agent's ServiceAccount, derived from what its accounts watch and deploy: the
//! kind names accounts use resolved to API groups and resources, and the rules built from
//! them. Pure.
//!
//! Rules are minimal for the operations the hub documents on those kinds:
//! - watched kinds: `get`, `list`, `watch`; Secrets only `list`, `watch` (the agent watches
//!   their metadata and never needs one whole).
//! - deployable kinds (`Deploy`, an account's `deployKinds`, default its watched kinds): also
//!   `create`, `update`, `patch`, `delete`, `get`/`update`/`patch` on `scale` of scalable
//!   kinds, and `get`/`create` on `exec`, `attach` and `portforward` of Pods. A deployable
//!   Secret gets `get` as well: client-side apply and replace read it, and write responses
//!   carry the whole object anyway.
//! - what the operations read besides the object: Events (`events`), the pods of a workload
//!   and their `log` (`logs`), ReplicaSets and ControllerRevisions (`rollout history`/`undo`).
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

/// Resolves `names`, adding those that do not resolve to `unknown`.
fn resolve_names(
    names: &[String],
    served: &[ServedKind],
    unknown: &mut Vec<String>,
) -> BTreeSet<Resolved> {
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
    let mut resolve_all = |names: &[String]| resolve_names(names, served, &mut unknown);
    // `*` is every kind for the agent too (agent/src/kinds.rs), not a kind to resolve. An
    // account with no kinds is granted everything as before, a superset of the agent's
    // default kinds.
    let every_kind = kinds.iter().any(|k| k.trim() == "*");
    let mut watched = if kinds.is_empty() || every_kind {
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
/// Verbs on Secrets an account only watches: metadata-only list and watch, never `get`.
pub const SECRET_READ_VERBS: &[&str] = &["list", "watch"];
/// API groups whose objects are the cluster's privileges themselves: RBAC (Roles and
/// bindings), admission webhooks and policies, aggregated APIServices, and CRDs. An account
/// that deploys everything (no `kinds`/`deployKinds`, or `*`) only reads these; writing them
/// needs their kinds named in `kinds` or `deployKinds` (review N2/F26: otherwise every token
/// of a default Deploy account is cluster-admin-equivalent). The operator README lists them
/// (a test checks it does).
pub const PRIVILEGE_GROUPS: &[&str] = &[
    "rbac.authorization.k8s.io",
    "admissionregistration.k8s.io",
    "apiregistration.k8s.io",
    "apiextensions.k8s.io",
];

/// Verbs on the `scale` subresource of a deployable scalable kind.
pub const SCALE_VERBS: &[&str] = &["get", "update", "patch"];
/// Verbs on the streaming pod subresources (`exec`, `attach`, `portforward`): `create` for
/// SPDY, `get` for the WebSocket upgrade kubectl 1.30+ sends.
pub const STREAM_VERBS: &[&str] = &["get", "create"];

/// The order verbs are written in, so rules compare and read the same every time.
const VERB_ORDER: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// What one account needs: the kinds it watches, and the kinds Spinnaker may deploy through
/// it (`None` when it writes nothing as the agent: `ReadOnly`, or it impersonates).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountKinds {
    pub watched: Watched,
    pub deployed: Option<Watched>,
}

/// Resolves the kinds an account may deploy: `deploy_kinds` when set, else what it watches.
/// Unresolvable kind names are returned as the error.
pub fn deployed(
    deploy_kinds: Option<&[String]>,
    watched: &Watched,
    served: &[ServedKind],
) -> Result<Watched, Vec<String>> {
    let Some(names) = deploy_kinds else {
        return Ok(watched.clone());
    };
    let mut unknown = Vec::new();
    let resources = resolve_names(names, served, &mut unknown);
    if unknown.is_empty() {
        Ok(Watched {
            everything: false,
            resources,
            omitted: BTreeSet::new(),
        })
    } else {
        Err(unknown)
    }
}

/// Reads the documented operations need besides the object itself (all namespaced):
/// `events` lists Events of any kind; `logs` lists the pods a workload selects and reads
/// their log; `rollout history`/`undo` list a Deployment's ReplicaSets and a StatefulSet's
/// or DaemonSet's ControllerRevisions.
fn related_reads(resolved: &Resolved) -> &'static [(&'static str, &'static str)] {
    const PODS: (&str, &str) = ("", "pods");
    const POD_LOG: (&str, &str) = ("", "pods/log");
    match (resolved.group.as_str(), resolved.resource.as_str()) {
        ("apps", "deployments") => &[("apps", "replicasets"), PODS, POD_LOG],
        ("apps", "statefulsets" | "daemonsets") => {
            &[("apps", "controllerrevisions"), PODS, POD_LOG]
        }
        ("apps", "replicasets") | ("batch", "jobs") | ("", "replicationcontrollers") => {
            &[PODS, POD_LOG]
        }
        ("", "pods") => &[POD_LOG],
        _ => &[],
    }
}

/// The core resources an account watching everything covers: the built-in core kinds, minus
/// those `omitted`.
fn core_everything(omitted: &BTreeSet<Resolved>) -> impl Iterator<Item = Resolved> + '_ {
    KNOWN_KINDS
        .iter()
        .filter(|known| known.group.is_empty())
        .map(Resolved::from)
        .filter(move |resolved| !omitted.contains(resolved))
}

/// Verbs per (group, resource), collected from the accounts.
#[derive(Default)]
struct Grants {
    cluster_scoped: bool,
    verbs: BTreeMap<(String, String), BTreeSet<&'static str>>,
}

impl Grants {
    fn grant(&mut self, group: &str, resource: &str, verbs: &[&'static str]) {
        self.verbs
            .entry((group.to_owned(), resource.to_owned()))
            .or_default()
            .extend(verbs.iter().copied());
    }

    /// Grants what a watched kind needs (reads; Secrets only `list`/`watch`), or with
    /// `deploy` a deployable one (reads and writes, its `scale` subresource, and for pods
    /// `exec`, `attach` and `portforward`), plus what the documented operations on it read
    /// besides.
    fn kind(&mut self, resolved: &Resolved, deploy: bool) {
        if !resolved.namespaced && !self.cluster_scoped {
            return;
        }
        let (group, resource) = (resolved.group.as_str(), resolved.resource.as_str());
        let is_secret = group.is_empty() && resource == "secrets";
        if deploy {
            self.grant(group, resource, READ_VERBS);
            self.grant(group, resource, WRITE_VERBS);
            if resolved.scalable {
                self.grant(group, &format!("{resource}/scale"), SCALE_VERBS);
            }
            if group.is_empty() && resource == "pods" {
                for stream in ["pods/exec", "pods/attach", "pods/portforward"] {
                    self.grant("", stream, STREAM_VERBS);
                }
            }
        } else if is_secret {
            self.grant(group, resource, SECRET_READ_VERBS);
        } else {
            self.grant(group, resource, READ_VERBS);
        }
        for (group, resource) in related_reads(resolved) {
            let verbs: &[&str] = if resource.contains('/') {
                &["get"]
            } else {
                READ_VERBS
            };
            self.grant(group, resource, verbs);
        }
    }

    /// Grants `verbs` on every kind an account watching everything covers: the core kinds
    /// one by one and `*` in every other served group; deploying everything writes no
    /// [`PRIVILEGE_GROUPS`] (reads only: their kinds must be named to be written).
    fn everything(&mut self, kinds: &Watched, deploy: bool, api_groups: &[String]) {
        for resolved in core_everything(&kinds.omitted) {
            self.kind(&resolved, deploy);
        }
        for group in api_groups.iter().filter(|g| !g.is_empty()) {
            let verbs: &[&str] = if deploy && !PRIVILEGE_GROUPS.contains(&group.as_str()) {
                VERB_ORDER
            } else {
                READ_VERBS
            };
            self.grant(group, "*", verbs);
        }
    }

    fn account(&mut self, account: &AccountKinds, api_groups: &[String]) {
        let add = |kinds: &Watched, deploy: bool, grants: &mut Self| {
            if kinds.everything {
                grants.everything(kinds, deploy, api_groups);
            }
            for resolved in &kinds.resources {
                grants.kind(resolved, deploy);
            }
        };
        add(&account.watched, false, self);
        if let Some(deployed) = &account.deployed {
            add(deployed, true, self);
        }
        // The `events` operation works on any kind the account can name.
        self.grant("", "events", READ_VERBS);
    }

    /// The rules: one per group and set of verbs, resources sorted; a resource whose verbs
    /// its group's `*` already grants is left out.
    fn into_rules(self) -> Vec<PolicyRule> {
        let wildcard: BTreeMap<String, BTreeSet<&str>> = self
            .verbs
            .iter()
            .filter(|((_, resource), _)| resource == "*")
            .map(|((group, _), verbs)| (group.clone(), verbs.clone()))
            .collect();
        let mut by_verbs: BTreeMap<(String, Vec<&str>), Vec<String>> = BTreeMap::new();
        for ((group, resource), verbs) in self.verbs {
            let covered =
                resource != "*" && wildcard.get(&group).is_some_and(|all| verbs.is_subset(all));
            if covered {
                continue;
            }
            let mut ordered: Vec<&str> = verbs.into_iter().collect();
            ordered.sort_by_key(|verb| VERB_ORDER.iter().position(|v| v == verb));
            by_verbs.entry((group, ordered)).or_default().push(resource);
        }
        let mut rules: Vec<PolicyRule> = by_verbs
            .into_iter()
            .map(|((group, verbs), resources)| PolicyRule {
                api_groups: Some(vec![group]),
                resources: Some(resources),
                verbs: verbs.into_iter().map(str::to_owned).collect(),
                ..Default::default()
            })
            .collect();
        // Core first, then by group; within a group the widest verbs first.
        rules.sort_by(|a, b| {
            (a.api_groups.clone(), std::cmp::Reverse(a.verbs.len()))
                .cmp(&(b.api_groups.clone(), std::cmp::Reverse(b.verbs.len())))
        });
        rules
    }
}

/// Builds the rules for what `accounts` watch and deploy, plus what the documented operations
/// on those kinds read besides (Events, a workload's pods and their logs, ReplicaSets and
/// ControllerRevisions for rollout history and undo).
///
/// `cluster_scoped` says whether the rules go into a ClusterRole (cluster-scoped kinds are
/// only meaningful there); `api_groups` are the non-core groups the cluster serves, used when
/// an account watches or deploys everything.
pub fn rules(
    accounts: &[AccountKinds],
    cluster_scoped: bool,
    api_groups: &[String],
) -> Vec<PolicyRule> {
    if accounts.is_empty() {
        return Vec::new();
    }
    let mut grants = Grants {
        cluster_scoped,
        ..Grants::default()
    };
    for account in accounts {
        grants.account(account, api_groups);
    }
    grants.into_rules()
}

/// The pod metrics reads an account with `podMetrics: true` needs (Armory's `metrics: true`:
/// Clouddriver runs `kubectl top pod --containers -n <namespace>` through the hub): get and
/// list of `metrics.k8s.io` pods, and of nodes in a ClusterRole (nodes are cluster-scoped,
/// so a Role cannot grant them). None when no account asks for metrics.
pub fn metrics_rule(pod_metrics: bool, cluster_scoped: bool) -> Option<PolicyRule> {
    let resources = if cluster_scoped {
        vec!["nodes".to_owned(), "pods".to_owned()]
    } else {
        vec!["pods".to_owned()]
    };
    pod_metrics.then(|| PolicyRule {
        api_groups: Some(vec!["metrics.k8s.io".to_owned()]),
        resources: Some(resources),
        verbs: vec!["get".to_owned(), "list".to_owned()],
        ..Default::default()
    })
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
    fn pod_metrics_grant_metrics_reads_only_when_asked() {
        assert_eq!(metrics_rule(false, true), None);
        let cluster = metrics_rule(true, true).unwrap();
        assert_eq!(
            cluster.api_groups.as_deref(),
            Some(&["metrics.k8s.io".to_string()][..])
        );
        assert_eq!(
            cluster.resources.as_deref(),
            Some(&names(&["nodes", "pods"])[..])
        );
        assert_eq!(cluster.verbs, names(&["get", "list"]));
        let namespaced = metrics_rule(true, false).unwrap();
        assert_eq!(namespaced.resources.as_deref(), Some(&names(&["pods"])[..]));
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

    fn read_only(kinds: &[&str]) -> AccountKinds {
        AccountKinds {
            watched: watched(&names(kinds), &[], &[], &[]).unwrap(),
            deployed: None,
        }
    }

    /// An account that deploys `deploy_kinds` (`None`: what it watches).
    fn deploying(kinds: &[&str], deploy_kinds: Option<&[&str]>) -> AccountKinds {
        let watched = watched(&names(kinds), &[], &[], &[]).unwrap();
        let deploy_kinds = deploy_kinds.map(names);
        let deployed = deployed(deploy_kinds.as_deref(), &watched, &[]).unwrap();
        AccountKinds {
            watched,
            deployed: Some(deployed),
        }
    }

    /// The verbs `rules` grant on `resource` of `group` (directly or through `*`), in
    /// `VERB_ORDER`.
    fn verbs_on(rules: &[PolicyRule], group: &str, resource: &str) -> Vec<String> {
        let mut verbs: BTreeSet<String> = BTreeSet::new();
        for rule in rules {
            let in_group = rule.api_groups.as_ref().unwrap().iter().any(|g| g == group);
            let names = rule.resources.as_ref().unwrap();
            if in_group && names.iter().any(|r| r == resource || r == "*") {
                verbs.extend(rule.verbs.iter().cloned());
            }
        }
        let mut verbs: Vec<String> = verbs.into_iter().collect();
        verbs.sort_by_key(|verb| VERB_ORDER.iter().position(|v| v == verb));
        verbs
    }

    fn all_verbs() -> Vec<String> {
        names(VERB_ORDER)
    }

    #[test]
    fn read_only_rules_cover_the_kinds_and_what_their_reads_need() {
        let rules = super::rules(
            &[read_only(&[
                "Deployment",
                "StatefulSet",
                "ConfigMap",
                "Namespace",
            ])],
            false,
            &[],
        );
        let read = names(READ_VERBS);
        for (group, resource) in [
            ("apps", "deployments"),
            ("apps", "statefulsets"),
            ("", "configmaps"),
            // rollout history of a Deployment, of a StatefulSet
            ("apps", "replicasets"),
            ("apps", "controllerrevisions"),
            // logs of their pods, and events of anything
            ("", "pods"),
            ("", "events"),
        ] {
            assert_eq!(
                verbs_on(&rules, group, resource),
                read,
                "{group}/{resource}"
            );
        }
        assert_eq!(verbs_on(&rules, "", "pods/log"), names(&["get"]));
        assert!(
            verbs_on(&rules, "", "namespaces").is_empty(),
            "namespaces dropped from a Role"
        );
        for (group, resource) in [
            ("", "secrets"),
            ("", "services"),
            ("batch", "jobs"),
            ("apps", "deployments/scale"),
            ("", "pods/exec"),
        ] {
            assert!(
                verbs_on(&rules, group, resource).is_empty(),
                "{group}/{resource}: {rules:?}"
            );
        }
        assert!(
            rules
                .iter()
                .all(|r| !r.verbs.iter().any(|v| WRITE_VERBS.contains(&v.as_str()))),
            "ReadOnly writes nothing: {rules:?}"
        );
        // One rule per group and set of verbs.
        let core_read = rules
            .iter()
            .find(|r| r.api_groups == Some(names(&[""])) && r.verbs == read)
            .unwrap();
        assert_eq!(
            core_read.resources,
            Some(names(&["configmaps", "events", "pods"]))
        );
    }

    #[test]
    fn deploy_writes_the_deploy_kinds_with_scale_and_only_reads_the_rest() {
        let rules = super::rules(&[deploying(&["Deployment", "Namespace"], None)], true, &[]);
        assert_eq!(verbs_on(&rules, "apps", "deployments"), all_verbs());
        assert_eq!(verbs_on(&rules, "", "namespaces"), all_verbs());
        assert_eq!(
            verbs_on(&rules, "apps", "deployments/scale"),
            names(SCALE_VERBS)
        );
        // Read for rollout history and undo, never written.
        assert_eq!(verbs_on(&rules, "apps", "replicasets"), names(READ_VERBS));
        assert_eq!(verbs_on(&rules, "", "pods"), names(READ_VERBS));
        assert!(verbs_on(&rules, "", "pods/exec").is_empty());
    }

    #[test]
    fn deploy_kinds_default_to_the_watched_kinds_and_may_name_unwatched_ones() {
        let w = watched(&names(&["ConfigMap"]), &[], &[], &[]).unwrap();
        assert_eq!(deployed(None, &w, &[]).unwrap(), w);
        assert_eq!(
            deployed(Some(&names(&["Job", "Widget"])), &w, &[]).unwrap_err(),
            names(&["Widget"])
        );

        // A Job deployed without being watched.
        let rules = super::rules(
            &[deploying(&["ConfigMap"], Some(&["ConfigMap", "Job"]))],
            false,
            &[],
        );
        assert_eq!(verbs_on(&rules, "batch", "jobs"), all_verbs());
        assert_eq!(verbs_on(&rules, "", "configmaps"), all_verbs());
        assert_eq!(verbs_on(&rules, "", "pods"), names(READ_VERBS), "Job logs");
        assert_eq!(verbs_on(&rules, "", "pods/log"), names(&["get"]));

        // `deployKinds: []`: read-only under a Deploy agent.
        let rules = super::rules(&[deploying(&["ConfigMap"], Some(&[]))], false, &[]);
        assert_eq!(verbs_on(&rules, "", "configmaps"), names(READ_VERBS));

        // Watched but not deployable: read only.
        let rules = super::rules(
            &[deploying(&["ConfigMap", "Service"], Some(&["ConfigMap"]))],
            false,
            &[],
        );
        assert_eq!(verbs_on(&rules, "", "services"), names(READ_VERBS));
    }

    #[test]
    fn deployable_pods_may_be_exec_attached_and_port_forwarded() {
        let rules = super::rules(&[deploying(&["Pod"], None)], false, &[]);
        for stream in ["pods/exec", "pods/attach", "pods/portforward"] {
            assert_eq!(
                verbs_on(&rules, "", stream),
                names(STREAM_VERBS),
                "{stream}"
            );
        }
        let rules = super::rules(&[read_only(&["Pod"])], false, &[]);
        assert!(verbs_on(&rules, "", "pods/exec").is_empty());
    }

    #[test]
    fn watched_secrets_are_list_watch_only_and_deployable_ones_are_readable() {
        let ro = super::rules(&[read_only(&["Secret"])], false, &[]);
        assert_eq!(verbs_on(&ro, "", "secrets"), names(SECRET_READ_VERBS));
        // Deploy: client-side apply and replace read the live Secret; create, update and
        // patch answer with the whole object, so `get` reveals nothing writing does not.
        let deploy = super::rules(&[deploying(&["Secret"], None)], false, &[]);
        assert_eq!(verbs_on(&deploy, "", "secrets"), all_verbs());
        // Not watched and not deployable: nothing at all.
        let none = super::rules(&[deploying(&["ConfigMap"], None)], false, &[]);
        assert!(verbs_on(&none, "", "secrets").is_empty());
    }

    #[test]
    fn everything_is_the_core_one_by_one_and_every_other_group() {
        let groups = names(&["apps", "batch"]);
        let everything_but_secrets = AccountKinds {
            watched: watched(&[], &names(&["Secret", "Event"]), &[], &[]).unwrap(),
            deployed: None,
        };
        let all = super::rules(std::slice::from_ref(&everything_but_secrets), true, &groups);
        assert!(verbs_on(&all, "", "secrets").is_empty(), "{all:?}");
        assert_eq!(verbs_on(&all, "apps", "replicasets"), names(READ_VERBS));
        assert_eq!(verbs_on(&all, "", "pods"), names(READ_VERBS));
        assert_eq!(verbs_on(&all, "", "namespaces"), names(READ_VERBS));
        assert_eq!(verbs_on(&all, "", "pods/log"), names(&["get"]));
        // Omitted from the watch, still readable for the `events` operation.
        assert_eq!(verbs_on(&all, "", "events"), names(READ_VERBS));
        // `*` covers the group: no resource of it listed again.
        assert!(all.iter().all(|r| {
            r.api_groups != Some(names(&["apps"])) || r.resources == Some(names(&["*"]))
        }));

        // Watching everything, deploying Deployments: the group's `*` stays read-only and
        // Deployments are listed with the write verbs next to it.
        let mut narrow = everything_but_secrets.clone();
        narrow.deployed = Some(watched(&names(&["Deployment"]), &[], &[], &[]).unwrap());
        let rules = super::rules(&[narrow], true, &groups);
        assert_eq!(verbs_on(&rules, "apps", "deployments"), all_verbs());
        assert_eq!(verbs_on(&rules, "apps", "statefulsets"), names(READ_VERBS));
        assert_eq!(verbs_on(&rules, "batch", "jobs"), names(READ_VERBS));

        // Deploying everything (the default for an account watching everything).
        let mut wide = everything_but_secrets;
        wide.deployed = Some(wide.watched.clone());
        let rules = super::rules(&[wide], true, &groups);
        assert_eq!(verbs_on(&rules, "batch", "jobs"), all_verbs());
        assert_eq!(verbs_on(&rules, "", "configmaps"), all_verbs());
        assert!(verbs_on(&rules, "", "secrets").is_empty(), "omitted");
    }

    #[test]
    fn deploying_everything_writes_no_privileges_unless_they_are_named() {
        let groups = names(&[
            "apps",
            "rbac.authorization.k8s.io",
            "admissionregistration.k8s.io",
            "apiregistration.k8s.io",
            "apiextensions.k8s.io",
        ]);
        for kinds in [&[][..], &["*"]] {
            let rules = super::rules(&[deploying(kinds, None)], true, &groups);
            assert_eq!(verbs_on(&rules, "apps", "deployments"), all_verbs());
            for group in PRIVILEGE_GROUPS {
                assert_eq!(
                    verbs_on(&rules, group, "anything"),
                    names(READ_VERBS),
                    "{group}"
                );
            }
        }
        // Named, they are deployable.
        let named = super::rules(
            &[deploying(&[], Some(&["ClusterRoleBinding", "Deployment"]))],
            true,
            &groups,
        );
        assert_eq!(
            verbs_on(&named, "rbac.authorization.k8s.io", "clusterrolebindings"),
            all_verbs()
        );
        assert_eq!(
            verbs_on(&named, "rbac.authorization.k8s.io", "roles"),
            names(READ_VERBS)
        );
    }

    /// The operator README says which groups the default Deploy account cannot write.
    #[test]
    fn the_readme_lists_the_privilege_groups() {
        let readme = include_str!("../README.md");
        let line = readme
            .lines()
            .find(|l| l.contains("Deploy without `kinds`"))
            .expect("README: the line on what Deploy without `kinds` grants");
        for group in PRIVILEGE_GROUPS {
            assert!(
                line.contains(&format!("`{group}`")),
                "{group} missing: {line}"
            );
        }
    }

    #[test]
    fn a_star_watches_everything() {
        let star = watched(&names(&["*"]), &[], &[], &[]).unwrap();
        assert!(star.everything);
        assert_eq!(star, watched(&[], &[], &[], &[]).unwrap());
    }

    #[test]
    fn no_accounts_no_rules() {
        assert!(rules(&[], true, &names(&["apps"])).is_empty());
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
