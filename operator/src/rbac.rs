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
/// list of `metrics.k8s.io` pods. Cluster-wide, also what `kubectl top node` reads: the
/// metrics of nodes and the Node objects themselves (their allocatable, the column's 100 %;
/// kubectl 1.37 asks in protobuf, which the hub tunnels, so the agent needs the read even
/// when it watches Nodes). A Role cannot grant either (nodes are cluster-scoped). Empty when
/// no account asks for metrics.
pub fn metrics_rules(pod_metrics: bool, cluster_scoped: bool) -> Vec<PolicyRule> {
    if !pod_metrics {
        return Vec::new();
    }
    let read = |group: &str, resources: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: vec!["get".to_owned(), "list".to_owned()],
        ..Default::default()
    };
    if cluster_scoped {
        vec![
            read("metrics.k8s.io", &["nodes", "pods"]),
            read("", &["nodes"]),
        ]
    } else {
        vec![read("metrics.k8s.io", &["pods"])]
    }
}

#[cfg(test)]
mod tests;
