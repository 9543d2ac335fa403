//! The column definitions of the built-in kinds' Tables, as the API server declares them
//! (`pkg/printers/internalversion/printers.go` of Kubernetes 1.37, `AddHandlers`): names,
//! types, formats, priorities (1: shown by `-o wide`) and descriptions, the Go types' Swagger
//! docs copied verbatim.

use super::Column;

/// `metav1.ObjectMeta{}.SwaggerDoc()["name"]`.
pub const NAME_DOC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
/// `metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]`.
pub const CREATED_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// One column definition (a line each, as in `printers.go`).
const fn col(
    name: &'static str,
    kind: &'static str,
    format: &'static str,
    priority: i64,
    description: &'static str,
) -> Column {
    Column {
        name,
        kind,
        format,
        priority,
        description,
    }
}

/// `podColumnDefinitions`.
#[rustfmt::skip]
pub const POD: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Ready", "string", "", 0, "The aggregate readiness state of this pod for accepting traffic."),
    col("Status", "string", "", 0, "The aggregate status of the containers in this pod."),
    col("Restarts", "string", "", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("IP", "string", "", 1, "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated."),
    col("Node", "string", "", 1, "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename"),
    col("Nominated Node", "string", "", 1, "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled."),
    col("Readiness Gates", "string", "", 1, "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates"),
];

/// `deploymentColumnDefinitions`.
#[rustfmt::skip]
pub const DEPLOYMENT: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Ready", "string", "", 0, "Number of the pod with ready state"),
    col("Up-to-date", "string", "", 0, "Total number of non-terminating pods targeted by this deployment that have the desired template spec."),
    col("Available", "string", "", 0, "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Containers", "string", "", 1, "Names of each container in the template."),
    col("Images", "string", "", 1, "Images referenced by each container in the template."),
    col("Selector", "string", "", 1, "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels."),
];

/// `replicaSetColumnDefinitions`.
#[rustfmt::skip]
pub const REPLICA_SET: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Desired", "integer", "", 0, "Replicas is the number of desired pods. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset"),
    col("Current", "integer", "", 0, "Replicas is the most recently observed number of non-terminating pods. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset"),
    col("Ready", "integer", "", 0, "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Containers", "string", "", 1, "Names of each container in the template."),
    col("Images", "string", "", 1, "Images referenced by each container in the template."),
    col("Selector", "string", "", 1, "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
];

/// `statefulSetColumnDefinitions`.
#[rustfmt::skip]
pub const STATEFUL_SET: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Ready", "string", "", 0, "Number of the pod with ready state"),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Containers", "string", "", 1, "Names of each container in the template."),
    col("Images", "string", "", 1, "Images referenced by each container in the template."),
];

/// `daemonSetColumnDefinitions`.
#[rustfmt::skip]
pub const DAEMON_SET: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Desired", "integer", "", 0, "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
    col("Current", "integer", "", 0, "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/"),
    col("Ready", "integer", "", 0, "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition."),
    col("Up-to-date", "integer", "", 0, "The total number of nodes that are running updated daemon pod"),
    col("Available", "integer", "", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)"),
    col("Node Selector", "string", "", 0, "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/"),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Containers", "string", "", 1, "Names of each container in the template."),
    col("Images", "string", "", 1, "Images referenced by each container in the template."),
    col("Selector", "string", "", 1, "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
];

/// `jobColumnDefinitions`.
#[rustfmt::skip]
pub const JOB: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Status", "string", "", 0, "Status of the job."),
    col("Completions", "string", "", 0, "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs."),
    col("Duration", "string", "", 0, "Time required to complete the job."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Containers", "string", "", 1, "Names of each container in the template."),
    col("Images", "string", "", 1, "Images referenced by each container in the template."),
    col("Selector", "string", "", 1, "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
];

/// `cronJobColumnDefinitions`.
#[rustfmt::skip]
pub const CRON_JOB: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Schedule", "string", "", 0, "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
    col("Timezone", "string", "", 0, "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones"),
    col("Suspend", "boolean", "", 0, "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false."),
    col("Active", "integer", "", 0, "A list of pointers to currently running jobs."),
    col("Last Schedule", "string", "", 0, "Information when was the last time the job was successfully scheduled."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Containers", "string", "", 1, "Names of each container in the template."),
    col("Images", "string", "", 1, "Images referenced by each container in the template."),
    col("Selector", "string", "", 1, "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors"),
];

/// `serviceColumnDefinitions`.
#[rustfmt::skip]
pub const SERVICE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Type", "string", "", 0, "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types"),
    col("Cluster-IP", "string", "", 0, "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies"),
    col("External-IP", "string", "", 0, "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system."),
    col("Port(s)", "string", "", 0, "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies"),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Selector", "string", "", 1, "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/"),
];

/// `ingressColumnDefinitions`.
#[rustfmt::skip]
pub const INGRESS: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Class", "string", "", 0, "The name of the IngressClass resource that should be used for additional configuration"),
    col("Hosts", "string", "", 0, "Hosts that incoming requests are matched against before the ingress rule"),
    col("Address", "string", "", 0, "Address is a list containing ingress points for the load-balancer"),
    col("Ports", "string", "", 0, "Ports of TLS configurations that open"),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `namespaceColumnDefinitions`.
#[rustfmt::skip]
pub const NAMESPACE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Status", "string", "", 0, "The status of the namespace"),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `secretColumnDefinitions`.
#[rustfmt::skip]
pub const SECRET: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Type", "string", "", 0, "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types"),
    col("Data", "string", "", 0, "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4"),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `serviceAccountColumnDefinitions`.
#[rustfmt::skip]
pub const SERVICE_ACCOUNT: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `persistentVolumeClaimColumnDefinitions`.
#[rustfmt::skip]
pub const PERSISTENT_VOLUME_CLAIM: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Status", "string", "", 0, "phase represents the current phase of PersistentVolumeClaim."),
    col("Volume", "string", "", 0, "volumeName is the binding reference to the PersistentVolume backing this claim."),
    col("Capacity", "string", "", 0, "capacity represents the actual resources of the underlying volume."),
    col("Access Modes", "string", "", 0, "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1"),
    col("StorageClass", "string", "", 0, "StorageClass of the pvc"),
    col("VolumeAttributesClass", "string", "", 0, "VolumeAttributesClass of the pvc"),
    col("Age", "string", "", 0, CREATED_DOC),
    col("VolumeMode", "string", "", 1, "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec."),
];

/// `configMapColumnDefinitions`.
#[rustfmt::skip]
pub const CONFIG_MAP: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Data", "string", "", 0, "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process."),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `networkPolicyColumnDefinitioins`.
#[rustfmt::skip]
pub const NETWORK_POLICY: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Pod-Selector", "string", "", 0, "podSelector selects the pods to which this NetworkPolicy object applies. The array of rules is applied to any pods selected by this field. An empty selector matches all pods in the policy's namespace. Multiple network policies can select the same set of pods. In this case, the ingress rules for each are combined additively. This field is optional. If it is not specified, it defaults to an empty selector."),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `roleBindingsColumnDefinitions`.
#[rustfmt::skip]
pub const ROLE_BINDING: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Role", "string", "", 0, "roleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Users", "string", "", 1, "Users in the roleBinding"),
    col("Groups", "string", "", 1, "Groups in the roleBinding"),
    col("ServiceAccounts", "string", "", 1, "ServiceAccounts in the roleBinding"),
];

/// `clusterRoleBindingsColumnDefinitions`.
#[rustfmt::skip]
pub const CLUSTER_ROLE_BINDING: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Role", "string", "", 0, "roleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error."),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Users", "string", "", 1, "Users in the clusterRoleBinding"),
    col("Groups", "string", "", 1, "Groups in the clusterRoleBinding"),
    col("ServiceAccounts", "string", "", 1, "ServiceAccounts in the clusterRoleBinding"),
];

/// `podDisruptionBudgetColumnDefinitions`.
#[rustfmt::skip]
pub const POD_DISRUPTION_BUDGET: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Min Available", "string", "", 0, "The minimum number of pods that must be available."),
    col("Max Unavailable", "string", "", 0, "The maximum number of pods that may be unavailable."),
    col("Allowed Disruptions", "integer", "", 0, "Calculated number of pods that may be disrupted at this time."),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `nodeColumnDefinitions`.
#[rustfmt::skip]
pub const NODE: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Status", "string", "", 0, "The status of the node"),
    col("Roles", "string", "", 0, "The roles of the node"),
    col("Age", "string", "", 0, CREATED_DOC),
    col("Version", "string", "", 0, "Kubelet Version reported by the node."),
    col("Internal-IP", "string", "", 1, "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP)."),
    col("External-IP", "string", "", 1, "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP)."),
    col("OS-Image", "string", "", 1, "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy))."),
    col("Kernel-Version", "string", "", 1, "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64)."),
    col("Container-Runtime", "string", "", 1, "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2)."),
];

/// `eventColumnDefinitions`.
#[rustfmt::skip]
pub const EVENT: &[Column] = &[
    col("Last Seen", "string", "", 0, "The time at which the most recent occurrence of this event was recorded."),
    col("Type", "string", "", 0, "Type of this event (Normal, Warning), new types could be added in the future"),
    col("Reason", "string", "", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
    col("Object", "string", "", 0, "The object that this event is about."),
    col("Subobject", "string", "", 1, "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2]. For example, if the object reference is to a container within a pod, this would take on a value like: \"spec.containers{name}\" (where \"name\" refers to the name of the container that triggered the event) or if no container name is specified \"spec.containers[2]\" (container with index 2 in this pod). This syntax is chosen only to have some well-defined way of referencing a part of an object."),
    col("Source", "string", "", 1, "The component reporting this event. Should be a short machine understandable string."),
    col("Message", "string", "", 0, "A human-readable description of the status of this operation."),
    col("First Seen", "string", "", 1, "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)"),
    col("Count", "string", "", 1, "The number of times this event has occurred."),
    col("Name", "string", "name", 1, NAME_DOC),
];

/// `horizontalPodAutoscalerColumnDefinitions`.
#[rustfmt::skip]
pub const HORIZONTAL_POD_AUTOSCALER: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Reference", "string", "", 0, "scaleTargetRef points to the target resource to scale, and is used to the pods for which metrics should be collected, as well as to actually change the replica count."),
    col("Targets", "string", "", 0, "metrics contains the specifications for which to use to calculate the desired replica count (the maximum replica count across all metrics will be used).  The desired replica count is calculated multiplying the ratio between the target value and the current value by the current number of pods.  Ergo, metrics used must decrease as the pod count is increased, and vice-versa.  See the individual metric source types for more information about how each type of metric must respond. If not set, the default metric will be set to 80% average CPU utilization."),
    col("MinPods", "string", "", 0, "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.  It defaults to 1 pod.  minReplicas is allowed to be 0 if the alpha feature gate HPAScaleToZero is enabled and at least one Object or External metric is configured.  Scaling is active as long as at least one metric value is available."),
    col("MaxPods", "string", "", 0, "maxReplicas is the upper limit for the number of replicas to which the autoscaler can scale up. It cannot be less that minReplicas."),
    col("Replicas", "string", "", 0, "currentReplicas is current number of replicas of pods managed by this autoscaler, as last seen by the autoscaler."),
    col("Age", "string", "", 0, CREATED_DOC),
];
