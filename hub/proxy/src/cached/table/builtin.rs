//! The cells of the built-in kinds' Table rows, ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO). The API server renders Tables with
//! `Wide: true` (`pkg/printers/storage`), so every row has the priority-1 cells too; kubectl
//! hides those columns unless `-o wide`.
//!
//! Kinds left out on purpose (their Tables are tunnelled): Secrets, whose Type and Data
//! columns need what the hub never holds (the agent sends Secrets as metadata only); Events,
//! Nodes and HorizontalPodAutoscalers, whose printers read more than these cells were
//! checked against (event series and sources, node conditions and roles, HPA metric
//! formatting) — not yet ported.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::{
    Column, columns,
    format::{self, int, since, string},
};

/// A built-in kind the hub renders Tables of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Pod,
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
    Service,
    Ingress,
    Namespace,
    ServiceAccount,
    PersistentVolumeClaim,
    ConfigMap,
    NetworkPolicy,
    RoleBinding,
    ClusterRoleBinding,
    PodDisruptionBudget,
}

impl Builtin {
    /// The printer of a resource of a built-in group, `None` when the hub has none.
    pub fn of(group: &str, resource: &str) -> Option<Builtin> {
        Some(match (group, resource) {
            ("", "pods") => Builtin::Pod,
            ("apps", "deployments") => Builtin::Deployment,
            ("apps", "replicasets") => Builtin::ReplicaSet,
            ("apps", "statefulsets") => Builtin::StatefulSet,
            ("apps", "daemonsets") => Builtin::DaemonSet,
            ("batch", "jobs") => Builtin::Job,
            ("batch", "cronjobs") => Builtin::CronJob,
            ("", "services") => Builtin::Service,
            ("networking.k8s.io", "ingresses") => Builtin::Ingress,
            ("", "namespaces") => Builtin::Namespace,
            ("", "serviceaccounts") => Builtin::ServiceAccount,
            ("", "persistentvolumeclaims") => Builtin::PersistentVolumeClaim,
            ("", "configmaps") => Builtin::ConfigMap,
            ("networking.k8s.io", "networkpolicies") => Builtin::NetworkPolicy,
            ("rbac.authorization.k8s.io", "rolebindings") => Builtin::RoleBinding,
            ("rbac.authorization.k8s.io", "clusterrolebindings") => Builtin::ClusterRoleBinding,
            ("policy", "poddisruptionbudgets") => Builtin::PodDisruptionBudget,
            _ => return None,
        })
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            Builtin::Pod => columns::POD,
            Builtin::Deployment => columns::DEPLOYMENT,
            Builtin::ReplicaSet => columns::REPLICA_SET,
            Builtin::StatefulSet => columns::STATEFUL_SET,
            Builtin::DaemonSet => columns::DAEMON_SET,
            Builtin::Job => columns::JOB,
            Builtin::CronJob => columns::CRON_JOB,
            Builtin::Service => columns::SERVICE,
            Builtin::Ingress => columns::INGRESS,
            Builtin::Namespace => columns::NAMESPACE,
            Builtin::ServiceAccount => columns::SERVICE_ACCOUNT,
            Builtin::PersistentVolumeClaim => columns::PERSISTENT_VOLUME_CLAIM,
            Builtin::ConfigMap => columns::CONFIG_MAP,
            Builtin::NetworkPolicy => columns::NETWORK_POLICY,
            Builtin::RoleBinding => columns::ROLE_BINDING,
            Builtin::ClusterRoleBinding => columns::CLUSTER_ROLE_BINDING,
            Builtin::PodDisruptionBudget => columns::POD_DISRUPTION_BUDGET,
        }
    }

    /// The row's cells (and, for pods, its conditions) for object `o` at `now`.
    pub fn cells(self, o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
        let name = json!(string(o.pointer("/metadata/name")));
        let age = json!(since(o.pointer("/metadata/creationTimestamp"), now));
        let template_containers = |path: &str| format::containers(o.pointer(path));
        let cells = match self {
            Builtin::Pod => return pod(o, now),
            Builtin::Deployment => {
                let (names, images) = template_containers("/spec/template/spec/containers");
                let selector = format::label_selector(o.pointer("/spec/selector"))
                    .unwrap_or_else(|| "<invalid>".into());
                vec![
                    name,
                    json!(format!(
                        "{}/{}",
                        int(o.pointer("/status/readyReplicas")),
                        int(o.pointer("/spec/replicas"))
                    )),
                    json!(int(o.pointer("/status/updatedReplicas"))),
                    json!(int(o.pointer("/status/availableReplicas"))),
                    age,
                    json!(names),
                    json!(images),
                    json!(selector),
                ]
            }
            Builtin::ReplicaSet => {
                let (names, images) = template_containers("/spec/template/spec/containers");
                vec![
                    name,
                    json!(int(o.pointer("/spec/replicas"))),
                    json!(int(o.pointer("/status/replicas"))),
                    json!(int(o.pointer("/status/readyReplicas"))),
                    age,
                    json!(names),
                    json!(images),
                    json!(format::format_label_selector(o.pointer("/spec/selector"))),
                ]
            }
            Builtin::StatefulSet => {
                let (names, images) = template_containers("/spec/template/spec/containers");
                vec![
                    name,
                    json!(format!(
                        "{}/{}",
                        int(o.pointer("/status/readyReplicas")),
                        int(o.pointer("/spec/replicas"))
                    )),
                    age,
                    json!(names),
                    json!(images),
                ]
            }
            Builtin::DaemonSet => {
                let (names, images) = template_containers("/spec/template/spec/containers");
                vec![
                    name,
                    json!(int(o.pointer("/status/desiredNumberScheduled"))),
                    json!(int(o.pointer("/status/currentNumberScheduled"))),
                    json!(int(o.pointer("/status/numberReady"))),
                    json!(int(o.pointer("/status/updatedNumberScheduled"))),
                    json!(int(o.pointer("/status/numberAvailable"))),
                    json!(format::labels(
                        o.pointer("/spec/template/spec/nodeSelector")
                    )),
                    age,
                    json!(names),
                    json!(images),
                    json!(format::format_label_selector(o.pointer("/spec/selector"))),
                ]
            }
            Builtin::Job => {
                let (names, images) = template_containers("/spec/template/spec/containers");
                vec![
                    name,
                    json!(job_status(o)),
                    json!(job_completions(o)),
                    json!(job_duration(o, now)),
                    age,
                    json!(names),
                    json!(images),
                    json!(format::format_label_selector(o.pointer("/spec/selector"))),
                ]
            }
            Builtin::CronJob => {
                let (names, images) =
                    template_containers("/spec/jobTemplate/spec/template/spec/containers");
                let last = match o.pointer("/status/lastScheduleTime") {
                    Some(t) if !t.is_null() => since(Some(t), now),
                    _ => "<none>".into(),
                };
                let time_zone = match o.pointer("/spec/timeZone").and_then(Value::as_str) {
                    Some(tz) => tz.to_string(),
                    None => "<none>".into(),
                };
                let active = o
                    .pointer("/status/active")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                vec![
                    name,
                    json!(string(o.pointer("/spec/schedule"))),
                    json!(time_zone),
                    json!(format::bool_ptr(o.pointer("/spec/suspend"))),
                    json!(active),
                    json!(last),
                    age,
                    json!(names),
                    json!(images),
                    json!(format::format_label_selector(
                        o.pointer("/spec/jobTemplate/spec/selector")
                    )),
                ]
            }
            Builtin::Service => {
                let cluster_ip = o
                    .pointer("/spec/clusterIPs/0")
                    .and_then(Value::as_str)
                    .unwrap_or("<none>");
                let ports = match format::service_ports(o.pointer("/spec/ports")) {
                    p if p.is_empty() => "<none>".to_string(),
                    p => p,
                };
                vec![
                    name,
                    json!(string(o.pointer("/spec/type"))),
                    json!(cluster_ip),
                    json!(service_external_ip(o)),
                    json!(ports),
                    age,
                    json!(format::labels(o.pointer("/spec/selector"))),
                ]
            }
            Builtin::Ingress => {
                let class = o
                    .pointer("/spec/ingressClassName")
                    .and_then(Value::as_str)
                    .unwrap_or("<none>");
                let tls = o
                    .pointer("/spec/tls")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty());
                vec![
                    name,
                    json!(class),
                    json!(ingress_hosts(o.pointer("/spec/rules"))),
                    json!(format::load_balancer(
                        o.pointer("/status/loadBalancer"),
                        true
                    )),
                    json!(if tls { "80, 443" } else { "80" }),
                    age,
                ]
            }
            Builtin::Namespace => vec![name, json!(string(o.pointer("/status/phase"))), age],
            Builtin::ServiceAccount => vec![name, age],
            Builtin::PersistentVolumeClaim => pvc(o, name, age),
            Builtin::ConfigMap => {
                let count = |p: &str| {
                    o.pointer(p)
                        .and_then(Value::as_object)
                        .map_or(0, |m| m.len())
                };
                vec![name, json!(count("/data") + count("/binaryData")), age]
            }
            Builtin::NetworkPolicy => {
                // The internal type's podSelector is a struct, never nil: absent is empty.
                let empty = json!({});
                let selector = o.pointer("/spec/podSelector").unwrap_or(&empty);
                vec![
                    name,
                    json!(format::format_label_selector(Some(selector))),
                    age,
                ]
            }
            Builtin::RoleBinding | Builtin::ClusterRoleBinding => {
                let role = format!(
                    "{}/{}",
                    string(o.pointer("/roleRef/kind")),
                    string(o.pointer("/roleRef/name"))
                );
                let (users, groups, service_accounts) = subjects(o.get("subjects"));
                vec![
                    name,
                    json!(role),
                    age,
                    json!(users),
                    json!(groups),
                    json!(service_accounts),
                ]
            }
            Builtin::PodDisruptionBudget => {
                let or_na = |p: &str| match o.pointer(p) {
                    Some(v) if !v.is_null() => format::int_or_string(v),
                    _ => "N/A".into(),
                };
                vec![
                    name,
                    json!(or_na("/spec/minAvailable")),
                    json!(or_na("/spec/maxUnavailable")),
                    json!(int(o.pointer("/status/disruptionsAllowed"))),
                    age,
                ]
            }
        };
        (cells, None)
    }
}

fn condition_true(conditions: Option<&Value>, kind: &str) -> Option<bool> {
    conditions
        .and_then(Value::as_array)?
        .iter()
        .find(|c| string(c.get("type")) == kind)
        .map(|c| string(c.get("status")) == "True")
}

/// `printPod`: Ready x/y, the aggregate status, restarts with the last one's age, and the
/// wide cells; Succeeded and Failed pods carry a Completed row condition.
fn pod(o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
    let spec = o.get("spec").unwrap_or(&Value::Null);
    let status = o.get("status").unwrap_or(&Value::Null);
    let conditions = status.get("conditions");
    let phase = string(status.get("phase"));
    let mut reason = match string(status.get("reason")) {
        "" => phase.to_string(),
        r => r.to_string(),
    };
    for c in conditions.and_then(Value::as_array).into_iter().flatten() {
        if string(c.get("type")) == "PodScheduled" && string(c.get("reason")) == "SchedulingGated" {
            reason = "SchedulingGated".into();
        }
    }
    let row_conditions = match phase {
        "Succeeded" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}]),
        ),
        "Failed" => Some(
            json!([{"type": "Completed", "status": "True", "reason": "Failed", "message": "The pod failed."}]),
        ),
        _ => None,
    };
    let list = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
    let init_containers = list(spec.get("initContainers"));
    let restartable = |name: &str| {
        init_containers
            .iter()
            .any(|c| string(c.get("name")) == name && string(c.get("restartPolicy")) == "Always")
    };
    let total = list(spec.get("containers")).len()
        + init_containers
            .iter()
            .filter(|c| string(c.get("restartPolicy")) == "Always")
            .count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut restartable_restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut last_restartable_restart: Option<Timestamp> = None;
    let later = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let finished = |c: &Value| format::timestamp(c.pointer("/lastState/terminated/finishedAt"));
    let mut initializing = false;
    let init_statuses = list(status.get("initContainerStatuses"));
    for (i, c) in init_statuses.iter().enumerate() {
        let count = int(c.get("restartCount"));
        restarts += count;
        last_restart = later(last_restart, finished(c));
        let is_restartable = restartable(string(c.get("name")));
        if is_restartable {
            restartable_restarts += count;
            last_restartable_restart = later(last_restartable_restart, finished(c));
        }
        let terminated = c.pointer("/state/terminated").filter(|t| !t.is_null());
        let waiting_reason = string(c.pointer("/state/waiting/reason"));
        if let Some(t) = terminated
            && int(t.get("exitCode")) == 0
        {
            continue;
        }
        if is_restartable && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        if let Some(t) = terminated {
            reason = match string(t.get("reason")) {
                "" if int(t.get("signal")) != 0 => format!("Init:Signal:{}", int(t.get("signal"))),
                "" => format!("Init:ExitCode:{}", int(t.get("exitCode"))),
                r => format!("Init:{r}"),
            };
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            reason = format!("Init:{waiting_reason}");
        } else {
            reason = format!("Init:{i}/{}", init_containers.len());
        }
        initializing = true;
        break;
    }
    if !initializing || condition_true(conditions, "Initialized") == Some(true) {
        restarts = restartable_restarts;
        last_restart = last_restartable_restart;
        let mut has_running = false;
        let mut error_reason = String::new();
        for c in list(status.get("containerStatuses")).iter().rev() {
            restarts += int(c.get("restartCount"));
            last_restart = later(last_restart, finished(c));
            let waiting_reason = string(c.pointer("/state/waiting/reason"));
            let terminated = c.pointer("/state/terminated").filter(|t| !t.is_null());
            let running = c.pointer("/state/running").is_some_and(|r| !r.is_null());
            if c.pointer("/state/waiting").is_some_and(|w| !w.is_null())
                && !waiting_reason.is_empty()
            {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = match string(t.get("reason")) {
                    "" if int(t.get("signal")) != 0 => format!("Signal:{}", int(t.get("signal"))),
                    "" => format!("ExitCode:{}", int(t.get("exitCode"))),
                    r => r.to_string(),
                };
                if int(t.get("exitCode")) != 0 {
                    error_reason = reason.clone();
                }
            } else if c.get("ready").and_then(Value::as_bool) == Some(true) && running {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" {
            if has_running && condition_true_any(conditions, "Ready") {
                reason = "Running".into();
            } else if !error_reason.is_empty() {
                reason = error_reason;
            } else if has_running {
                reason = "NotReady".into();
            }
        }
    }
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null());
    if deleting && string(status.get("reason")) == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && phase != "Failed" && phase != "Succeeded" {
        reason = "Terminating".into();
    }
    let restarts_text = match last_restart {
        Some(t) if restarts != 0 => {
            format!(
                "{restarts} ({} ago)",
                format::human_duration(now.duration_since(t))
            )
        }
        _ => restarts.to_string(),
    };
    let or_none = |s: &str| {
        if s.is_empty() {
            "<none>".to_string()
        } else {
            s.to_string()
        }
    };
    let gates = list(spec.get("readinessGates"));
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let true_count = gates
            .iter()
            .filter(|g| condition_true(conditions, string(g.get("conditionType"))) == Some(true))
            .count();
        format!("{true_count}/{}", gates.len())
    };
    let cells = vec![
        json!(string(o.pointer("/metadata/name"))),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_text),
        json!(since(o.pointer("/metadata/creationTimestamp"), now)),
        json!(or_none(string(status.pointer("/podIPs/0/ip")))),
        json!(or_none(string(spec.get("nodeName")))),
        json!(or_none(string(status.get("nominatedNodeName")))),
        json!(readiness_gates),
    ];
    (cells, row_conditions)
}

/// `hasPodReadyCondition`: any Ready condition that is True (unlike the first-match lookups).
fn condition_true_any(conditions: Option<&Value>, kind: &str) -> bool {
    conditions
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| string(c.get("type")) == kind && string(c.get("status")) == "True")
}

fn job_status(o: &Value) -> &'static str {
    let conditions = o.pointer("/status/conditions");
    let has = |t: &str| condition_true(conditions, t) == Some(true);
    if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null())
    {
        "Terminating"
    } else if has("Suspended") {
        "Suspended"
    } else if has("FailureTarget") {
        "FailureTarget"
    } else if has("SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
}

fn job_completions(o: &Value) -> String {
    let succeeded = int(o.pointer("/status/succeeded"));
    match o.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(completions) => format!("{succeeded}/{completions}"),
        None => match int(o.pointer("/spec/parallelism")) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    }
}

fn job_duration(o: &Value, now: Timestamp) -> String {
    let start = format::timestamp(o.pointer("/status/startTime"));
    let completion = format::timestamp(o.pointer("/status/completionTime"));
    match (start, completion) {
        (None, _) => String::new(),
        (Some(start), None) => format::human_duration(now.duration_since(start)),
        (Some(start), Some(end)) => format::human_duration(end.duration_since(start)),
    }
}

/// `getServiceExternalIP` (wide).
fn service_external_ip(o: &Value) -> String {
    let external: Vec<&str> = o
        .pointer("/spec/externalIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match string(o.pointer("/spec/type")) {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".into()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let lb = format::load_balancer(o.pointer("/status/loadBalancer"), true);
            if !external.is_empty() {
                let mut all: Vec<&str> = Vec::new();
                if !lb.is_empty() {
                    all.extend(lb.split(','));
                }
                all.extend(external);
                all.join(",")
            } else if !lb.is_empty() {
                lb
            } else {
                "<pending>".into()
            }
        }
        "ExternalName" => string(o.pointer("/spec/externalName")).to_string(),
        _ => "<unknown>".into(),
    }
}

/// `formatHosts`: up to three hosts, then `+ N more...`; `*` for none.
fn ingress_hosts(rules: Option<&Value>) -> String {
    let rules = rules
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut list: Vec<&str> = Vec::new();
    let mut more = false;
    for rule in rules {
        if list.len() == 3 {
            more = true;
        }
        let host = string(rule.get("host"));
        if !more && !host.is_empty() {
            list.push(host);
        }
    }
    if list.is_empty() {
        return "*".into();
    }
    let joined = list.join(",");
    if more {
        format!("{joined} + {} more...", rules.len() - 3)
    } else {
        joined
    }
}

fn pvc(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let deleting = o
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|d| !d.is_null());
    let phase = if deleting {
        "Terminating"
    } else {
        string(o.pointer("/status/phase"))
    };
    let volume = string(o.pointer("/spec/volumeName"));
    let (capacity, access_modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        let capacity = o
            .pointer("/status/capacity/storage")
            .and_then(Value::as_str)
            .unwrap_or("0")
            .to_string();
        let modes: Vec<&str> = o
            .pointer("/status/accessModes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let short = [
            ("ReadWriteOnce", "RWO"),
            ("ReadOnlyMany", "ROX"),
            ("ReadWriteMany", "RWX"),
            ("ReadWriteOncePod", "RWOP"),
        ]
        .iter()
        .filter(|(long, _)| modes.contains(long))
        .map(|(_, s)| *s)
        .collect::<Vec<_>>()
        .join(",");
        (capacity, short)
    };
    let class = match o
        .pointer("/metadata/annotations")
        .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
        .and_then(Value::as_str)
    {
        Some(class) => class,
        None => string(o.pointer("/spec/storageClassName")),
    };
    let or_unset = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("<unset>")
            .to_string()
    };
    vec![
        name,
        json!(phase),
        json!(volume),
        json!(capacity),
        json!(access_modes),
        json!(class),
        json!(or_unset("/spec/volumeAttributesClassName")),
        age,
        json!(or_unset("/spec/volumeMode")),
    ]
}

/// `rbac.SubjectsStrings`: users, groups and `namespace/name` ServiceAccounts, each joined
/// with ", ".
fn subjects(subjects: Option<&Value>) -> (String, String, String) {
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for s in subjects.and_then(Value::as_array).into_iter().flatten() {
        let name = string(s.get("name"));
        match string(s.get("kind")) {
            "ServiceAccount" => sas.push(format!("{}/{name}", string(s.get("namespace")))),
            "User" => users.push(name.to_string()),
            "Group" => groups.push(name.to_string()),
            _ => {}
        }
    }
    (users.join(", "), groups.join(", "), sas.join(", "))
}
