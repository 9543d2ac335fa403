//! The cells of the built-in kinds' Table rows, ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO). The API server renders Tables with
//! `Wide: true` (`pkg/printers/storage`), so every row has the priority-1 cells too; kubectl
//! hides those columns unless `-o wide`.
//!
//! The CRDs' and APIServices' Tables come from their own servers' convertors
//! (apiextensions-apiserver, kube-aggregator), ported the same way; `events.k8s.io` Events
//! are printed by the core printer over their other field names.
//!
//! The groups with kinds of their own in other modules: [`super::admission`],
//! [`super::flow_control`], [`super::networking`] (ServiceCIDRs, IPAddresses),
//! [`super::certificates`] (ClusterTrustBundles, PodCertificateRequests) and
//! [`super::dynamic_resources`] (`resource.k8s.io`).
//!
//! Left out on purpose (their Tables are tunnelled): Secrets, whose Data column counts data
//! the hub never holds (the agent sends Secrets as metadata only); HorizontalPodAutoscalers
//! of another version than `autoscaling/v2`, whose metrics `autoscaling/v1` keeps in
//! annotations the API server converts; and the printers not ported (see the module doc
//! of [`super`]).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::{
    Column,
    admission::AdmissionPolicy,
    certificates::Certificates,
    columns, control_plane,
    dynamic_resources::DynamicResource,
    events,
    flow_control::FlowControl,
    format::{self, int, since, string},
    networking::ServiceNetwork,
    storage,
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
    /// `events.k8s.io` Events: the core printer over their other field names.
    EventV1,
    PodTemplate,
    ReplicationController,
    IngressClass,
    Endpoints,
    EndpointSlice,
    PersistentVolume,
    StorageClass,
    VolumeAttachment,
    CsiDriver,
    CsiNode,
    ResourceQuota,
    Lease,
    PriorityClass,
    RuntimeClass,
    ControllerRevision,
    CertificateSigningRequest,
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
    CustomResourceDefinition,
    ApiService,
    VolumeAttributesClass,
    StorageVersionMigration,
    Admission(AdmissionPolicy),
    FlowControl(FlowControl),
    ServiceNetwork(ServiceNetwork),
    Certificates(Certificates),
    DynamicResource(DynamicResource),
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
            ("events.k8s.io", "events") => Builtin::EventV1,
            ("", "podtemplates") => Builtin::PodTemplate,
            ("", "replicationcontrollers") => Builtin::ReplicationController,
            ("networking.k8s.io", "ingressclasses") => Builtin::IngressClass,
            ("", "endpoints") => Builtin::Endpoints,
            ("discovery.k8s.io", "endpointslices") => Builtin::EndpointSlice,
            ("", "persistentvolumes") => Builtin::PersistentVolume,
            ("storage.k8s.io", "storageclasses") => Builtin::StorageClass,
            ("storage.k8s.io", "volumeattachments") => Builtin::VolumeAttachment,
            ("storage.k8s.io", "csidrivers") => Builtin::CsiDriver,
            ("storage.k8s.io", "csinodes") => Builtin::CsiNode,
            ("", "resourcequotas") => Builtin::ResourceQuota,
            ("coordination.k8s.io", "leases") => Builtin::Lease,
            ("scheduling.k8s.io", "priorityclasses") => Builtin::PriorityClass,
            ("node.k8s.io", "runtimeclasses") => Builtin::RuntimeClass,
            ("apps", "controllerrevisions") => Builtin::ControllerRevision,
            ("certificates.k8s.io", "certificatesigningrequests") => {
                Builtin::CertificateSigningRequest
            }
            ("admissionregistration.k8s.io", "mutatingwebhookconfigurations") => {
                Builtin::MutatingWebhookConfiguration
            }
            ("admissionregistration.k8s.io", "validatingwebhookconfigurations") => {
                Builtin::ValidatingWebhookConfiguration
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                Builtin::CustomResourceDefinition
            }
            ("apiregistration.k8s.io", "apiservices") => Builtin::ApiService,
            ("storage.k8s.io", "volumeattributesclasses") => Builtin::VolumeAttributesClass,
            ("storagemigration.k8s.io", "storageversionmigrations") => {
                Builtin::StorageVersionMigration
            }
            ("admissionregistration.k8s.io", resource) => {
                Builtin::Admission(AdmissionPolicy::of(resource)?)
            }
            ("flowcontrol.apiserver.k8s.io", resource) => {
                Builtin::FlowControl(FlowControl::of(resource)?)
            }
            ("networking.k8s.io", resource) => {
                Builtin::ServiceNetwork(ServiceNetwork::of(resource)?)
            }
            ("certificates.k8s.io", resource) => Builtin::Certificates(Certificates::of(resource)?),
            ("resource.k8s.io", resource) => {
                Builtin::DynamicResource(DynamicResource::of(resource)?)
            }
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
            Builtin::EventV1 => columns::EVENT,
            Builtin::PodTemplate => columns::POD_TEMPLATE,
            Builtin::ReplicationController => columns::REPLICATION_CONTROLLER,
            Builtin::IngressClass => columns::INGRESS_CLASS,
            Builtin::Endpoints => columns::ENDPOINTS,
            Builtin::EndpointSlice => columns::ENDPOINT_SLICE,
            Builtin::PersistentVolume => columns::PERSISTENT_VOLUME,
            Builtin::StorageClass => columns::STORAGE_CLASS,
            Builtin::VolumeAttachment => columns::VOLUME_ATTACHMENT,
            Builtin::CsiDriver => columns::CSI_DRIVER,
            Builtin::CsiNode => columns::CSI_NODE,
            Builtin::ResourceQuota => columns::RESOURCE_QUOTA,
            Builtin::Lease => columns::LEASE,
            Builtin::PriorityClass => columns::PRIORITY_CLASS,
            Builtin::RuntimeClass => columns::RUNTIME_CLASS,
            Builtin::ControllerRevision => columns::CONTROLLER_REVISION,
            Builtin::CertificateSigningRequest => columns::CERTIFICATE_SIGNING_REQUEST,
            Builtin::MutatingWebhookConfiguration | Builtin::ValidatingWebhookConfiguration => {
                columns::WEBHOOK_CONFIGURATION
            }
            Builtin::CustomResourceDefinition => columns::CUSTOM_RESOURCE_DEFINITION,
            Builtin::ApiService => columns::API_SERVICE,
            Builtin::VolumeAttributesClass => columns::VOLUME_ATTRIBUTES_CLASS,
            Builtin::StorageVersionMigration => columns::STORAGE_VERSION_MIGRATION,
            Builtin::Admission(k) => k.columns(),
            Builtin::FlowControl(k) => k.columns(),
            Builtin::ServiceNetwork(k) => k.columns(),
            Builtin::Certificates(k) => k.columns(),
            Builtin::DynamicResource(k) => k.columns(),
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
            Builtin::ReplicaSet | Builtin::ReplicationController => {
                let (names, images) = template_containers("/spec/template/spec/containers");
                // A ReplicaSet's selector is a label selector, a ReplicationController's a
                // label map.
                let selector = if self == Builtin::ReplicaSet {
                    format::format_label_selector(o.pointer("/spec/selector"))
                } else {
                    format::labels(o.pointer("/spec/selector"))
                };
                vec![
                    name,
                    json!(int(o.pointer("/spec/replicas"))),
                    json!(int(o.pointer("/status/replicas"))),
                    json!(int(o.pointer("/status/readyReplicas"))),
                    age,
                    json!(names),
                    json!(images),
                    json!(selector),
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
            Builtin::Event => events::event(o, now),
            Builtin::HorizontalPodAutoscaler => super::autoscaler::cells(o, name, age),
            Builtin::EventV1 => events::event(&events::core_event_of(o), now),
            Builtin::PodTemplate => {
                let (names, images) = template_containers("/template/spec/containers");
                vec![
                    name,
                    json!(names),
                    json!(images),
                    json!(format::labels(o.pointer("/template/metadata/labels"))),
                ]
            }
            Builtin::IngressClass => ingress_class(o, age),
            Builtin::Endpoints => super::endpoints::endpoints(o, name, age),
            Builtin::EndpointSlice => super::endpoints::endpoint_slice(o, name, age),
            Builtin::PersistentVolume => storage::persistent_volume(o, name, age),
            Builtin::StorageClass => storage::storage_class(o, name, age),
            Builtin::VolumeAttachment => storage::volume_attachment(o, name, age),
            Builtin::CsiDriver => storage::csi_driver(o, name, age),
            Builtin::CsiNode => storage::csi_node(o, name, age),
            Builtin::ResourceQuota => control_plane::resource_quota(o, name, age),
            Builtin::Lease => vec![name, json!(string(o.pointer("/spec/holderIdentity"))), age],
            Builtin::PriorityClass => vec![
                name,
                json!(int(o.get("value"))),
                json!(
                    o.get("globalDefault")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                ),
                age,
                json!(string(o.get("preemptionPolicy"))),
            ],
            Builtin::RuntimeClass => vec![name, json!(string(o.get("handler"))), age],
            Builtin::ControllerRevision => control_plane::controller_revision(o, name, age),
            Builtin::CertificateSigningRequest => {
                control_plane::certificate_signing_request(o, name, age)
            }
            Builtin::MutatingWebhookConfiguration | Builtin::ValidatingWebhookConfiguration => {
                let webhooks = o
                    .get("webhooks")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                vec![name, json!(webhooks), age]
            }
            Builtin::CustomResourceDefinition => control_plane::custom_resource_definition(o, name),
            Builtin::ApiService => control_plane::api_service(o, name, age),
            Builtin::VolumeAttributesClass => {
                vec![name, json!(string(o.get("driverName"))), age]
            }
            Builtin::StorageVersionMigration => control_plane::storage_version_migration(o, name),
            Builtin::Admission(k) => k.cells(o, name, age),
            Builtin::FlowControl(k) => k.cells(o, name, age),
            Builtin::ServiceNetwork(k) => k.cells(o, name, age),
            Builtin::Certificates(k) => k.cells(o, name),
            Builtin::DynamicResource(k) => k.cells(o, name, age, now),
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
    let phase = storage::phase(o);
    let volume = string(o.pointer("/spec/volumeName"));
    let (capacity, access_modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        let capacity = o
            .pointer("/status/capacity/storage")
            .and_then(Value::as_str)
            .unwrap_or("0")
            .to_string();
        let short = storage::access_modes(o.pointer("/status/accessModes"));
        (capacity, short)
    };
    let class = storage::class_of(o);
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

/// `printIngressClass`: the name marked ` (default)` by the is-default-class annotation,
/// the controller, the parameters as `Kind[.apiGroup]/name` (`<none>` without).
fn ingress_class(o: &Value, age: Value) -> Vec<Value> {
    let mut name = string(o.pointer("/metadata/name")).to_string();
    let default = o
        .pointer("/metadata/annotations")
        .and_then(|a| a.get("ingressclass.kubernetes.io/is-default-class"))
        .and_then(Value::as_str);
    if default == Some("true") {
        name.push_str(" (default)");
    }
    let parameters = match o.pointer("/spec/parameters") {
        Some(p) if !p.is_null() => {
            let mut kind = string(p.get("kind")).to_string();
            // A pointer in Go: present but empty still adds the dot.
            if let Some(group) = p.get("apiGroup").and_then(Value::as_str) {
                kind = format!("{kind}.{group}");
            }
            format!("{kind}/{}", string(p.get("name")))
        }
        _ => "<none>".into(),
    };
    vec![
        json!(name),
        json!(string(o.pointer("/spec/controller"))),
        json!(parameters),
        age,
    ]
}
