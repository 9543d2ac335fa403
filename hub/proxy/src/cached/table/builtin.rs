//! The cells of the built-in kinds' Table rows, ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO). The API server renders Tables with
//! `Wide: true` (`pkg/printers/storage`), so every row has the priority-1 cells too; kubectl
//! hides those columns unless `-o wide`.
//!
//! Left out on purpose (their Tables are tunnelled): Secrets, whose Data column counts data
//! the hub never holds (the agent sends Secrets as metadata only); `events.k8s.io` Events
//! (the core Events are printed) and HorizontalPodAutoscalers of another version than
//! `autoscaling/v2`, whose fields the printers read under other names.

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
    Node,
    Event,
    HorizontalPodAutoscaler,
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
            ("", "nodes") => Builtin::Node,
            ("", "events") => Builtin::Event,
            ("autoscaling", "horizontalpodautoscalers") => Builtin::HorizontalPodAutoscaler,
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
            Builtin::Node => columns::NODE,
            Builtin::Event => columns::EVENT,
            Builtin::HorizontalPodAutoscaler => columns::HORIZONTAL_POD_AUTOSCALER,
        }
    }

    /// The row's cells (and, for pods, its conditions) for object `o` at `now`.
    pub fn cells(self, o: &Value, now: Timestamp) -> (Vec<Value>, Option<Value>) {
        let name = json!(string(o.pointer("/metadata/name")));
        let age = json!(since(o.pointer("/metadata/creationTimestamp"), now));
        let template_containers = |path: &str| format::containers(o.pointer(path));
        let cells = match self {
            Builtin::Pod => return super::pod::cells(o, now),
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
            Builtin::Node => node(o, name, age),
            Builtin::Event => event(o, now),
            Builtin::HorizontalPodAutoscaler => {
                let min = match o.pointer("/spec/minReplicas").and_then(Value::as_i64) {
                    Some(n) => n.to_string(),
                    None => "<unset>".into(),
                };
                vec![
                    name,
                    json!(format!(
                        "{}/{}",
                        string(o.pointer("/spec/scaleTargetRef/kind")),
                        string(o.pointer("/spec/scaleTargetRef/name"))
                    )),
                    json!(hpa_metrics(
                        o.pointer("/spec/metrics"),
                        o.pointer("/status/currentMetrics")
                    )),
                    json!(min),
                    json!(int(o.pointer("/spec/maxReplicas"))),
                    json!(int(o.pointer("/status/currentReplicas"))),
                    age,
                ]
            }
        };
        (cells, None)
    }
}

fn job_status(o: &Value) -> &'static str {
    let conditions = o.pointer("/status/conditions");
    let has = |t: &str| super::pod::condition_true(conditions, t) == Some(true);
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

/// `printNode`: the Ready condition (`NotReady`, `Unknown` without one), cordoned, roles from
/// `node-role.kubernetes.io/<role>` and `kubernetes.io/role` labels, and the wide cells.
fn node(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let conditions = o.pointer("/status/conditions");
    // Go keeps the last condition of a type (a map filled in order).
    let ready = conditions
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .rfind(|c| string(c.get("type")) == "Ready");
    let mut status = vec![match ready {
        Some(c) if string(c.get("status")) == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if o.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled");
    }
    let mut roles: Vec<&str> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) if !role.is_empty() => Some(role),
            Some(_) => None,
            None if k == "kubernetes.io/role" => v.as_str().filter(|v| !v.is_empty()),
            None => None,
        })
        .collect();
    roles.sort_unstable();
    roles.dedup();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let info = |f: &str| string(o.pointer(&format!("/status/nodeInfo/{f}")));
    let or_unknown = |s: &str| {
        if s.is_empty() {
            "<unknown>".to_string()
        } else {
            s.to_string()
        }
    };
    let mut kernel = or_unknown(info("kernelVersion"));
    if !info("architecture").is_empty() {
        kernel = format!("{kernel} ({})", info("architecture"));
    }
    let address = |kind: &str| {
        o.pointer("/status/addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|a| string(a.get("type")) == kind)
            .map_or("<none>", |a| string(a.get("address")))
            .to_string()
    };
    vec![
        name,
        json!(status.join(",")),
        json!(roles),
        age,
        json!(info("kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(or_unknown(info("osImage"))),
        json!(kernel),
        json!(or_unknown(info("containerRuntimeVersion"))),
    ]
}

/// `printEvent` (core/v1 Events): last and first seen (the event time or the series' last
/// observation when set), the involved object as `kind/name`, the source, the count.
fn event(o: &Value, now: Timestamp) -> Vec<Value> {
    let seen = |t: Option<Timestamp>| match t {
        Some(t) => format::human_duration(now.duration_since(t)),
        None => "<unknown>".to_string(),
    };
    let first_time = format::timestamp(o.get("firstTimestamp"));
    let first = match first_time {
        Some(t) => seen(Some(t)),
        None => seen(format::timestamp(o.get("eventTime"))),
    };
    let mut last = match format::timestamp(o.get("lastTimestamp")) {
        Some(t) => seen(Some(t)),
        None => first.clone(),
    };
    let mut count = int(o.get("count"));
    match o.get("series").filter(|s| !s.is_null()) {
        Some(series) => {
            last = seen(format::timestamp(series.get("lastObservedTime")));
            count = int(series.get("count"));
        }
        None if count == 0 => count = 1,
        None => {}
    }
    let kind = string(o.pointer("/involvedObject/kind")).to_lowercase();
    let target = match string(o.pointer("/involvedObject/name")) {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let first_non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_non_empty(
        string(o.pointer("/source/component")),
        // The core/v1 JSON name of `ReportingController`.
        string(o.get("reportingComponent")),
    );
    let instance = first_non_empty(
        string(o.pointer("/source/host")),
        string(o.get("reportingInstance")),
    );
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(string(o.get("type"))),
        json!(string(o.get("reason"))),
        json!(target),
        json!(string(o.pointer("/involvedObject/fieldPath"))),
        json!(source),
        json!(string(o.get("message")).trim()),
        json!(first),
        json!(count),
        json!(string(o.pointer("/metadata/name"))),
    ]
}

/// `formatHPAMetrics` (autoscaling/v2): each metric's current value over its target, at most
/// two, then `+ N more...`; quantities as the API server stored them (canonical strings).
fn hpa_metrics(specs: Option<&Value>, statuses: Option<&Value>) -> String {
    let specs = specs
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses = statuses
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    // Go's `(*Quantity).String()`: `<nil>` for a missing pointer, `0` for a zero value.
    let quantity = |v: Option<&Value>, missing: &str| match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => missing.to_string(),
    };
    let mut list = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let source = |key: &str| -> (Option<&Value>, Option<&Value>) {
            (
                spec.get(key),
                status.and_then(|s| s.get(key)).filter(|s| !s.is_null()),
            )
        };
        let text = match string(spec.get("type")) {
            kind @ ("External" | "Object") => {
                let key = if kind == "External" {
                    "external"
                } else {
                    "object"
                };
                let (spec, status) = source(key);
                let target = spec.and_then(|s| s.get("target"));
                let current = status.and_then(|s| s.get("current"));
                match target
                    .and_then(|t| t.get("averageValue"))
                    .filter(|v| !v.is_null())
                {
                    Some(average) => {
                        let current = current
                            .and_then(|c| c.get("averageValue"))
                            .filter(|v| !v.is_null())
                            .map_or("<unknown>".to_string(), |v| quantity(Some(v), "0"));
                        format!("{current}/{} (avg)", quantity(Some(average), "0"))
                    }
                    None => {
                        let current = match status {
                            Some(_) => quantity(current.and_then(|c| c.get("value")), "<nil>"),
                            None => "<unknown>".into(),
                        };
                        format!(
                            "{current}/{}",
                            quantity(target.and_then(|t| t.get("value")), "<nil>")
                        )
                    }
                }
            }
            "Pods" => {
                let (spec, status) = source("pods");
                let current = match status {
                    Some(s) => quantity(s.pointer("/current/averageValue"), "<nil>"),
                    None => "<unknown>".into(),
                };
                format!(
                    "{current}/{}",
                    quantity(
                        spec.and_then(|s| s.pointer("/target/averageValue")),
                        "<nil>"
                    )
                )
            }
            kind @ ("Resource" | "ContainerResource") => {
                let key = if kind == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let (spec, status) = source(key);
                let resource = string(spec.and_then(|s| s.get("name")));
                let target = spec.and_then(|s| s.get("target"));
                match target
                    .and_then(|t| t.get("averageValue"))
                    .filter(|v| !v.is_null())
                {
                    Some(average) => {
                        let current = match status {
                            Some(s) => quantity(s.pointer("/current/averageValue"), "<nil>"),
                            None => "<unknown>".into(),
                        };
                        format!("{resource}: {current}/{}", quantity(Some(average), "0"))
                    }
                    None => {
                        let current = status
                            .and_then(|s| s.pointer("/current/averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or("<unknown>".to_string(), |u| format!("{u}%"));
                        let target = target
                            .and_then(|t| t.get("averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or("<auto>".to_string(), |u| format!("{u}%"));
                        format!("{resource}: {current}/{target}")
                    }
                }
            }
            _ => "<unknown type>".into(),
        };
        list.push(text);
    }
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        format!("{} + {} more...", list.join(", "), count - 2)
    } else {
        list.join(", ")
    }
}
