//! The column definitions of the built-in kinds' Tables, as the API server declares them
//! (`pkg/printers/internalversion/printers.go` of Kubernetes 1.37, `AddHandlers`): names,
//! types, formats, priorities (1: shown by `-o wide`) and descriptions, the Go types' Swagger
//! docs copied verbatim.

use super::Column;

/// `metav1.ObjectMeta{}.SwaggerDoc()["name"]`.
pub const NAME_DOC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
/// `metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]`.
pub const CREATED_DOC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// `podColumnDefinitions`.
pub const POD: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Ready",
        kind: "string",
        format: "",
        priority: 0,
        description: "The aggregate readiness state of this pod for accepting traffic.",
    },
    Column {
        name: "Status",
        kind: "string",
        format: "",
        priority: 0,
        description: "The aggregate status of the containers in this pod.",
    },
    Column {
        name: "Restarts",
        kind: "string",
        format: "",
        priority: 0,
        description: "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "IP",
        kind: "string",
        format: "",
        priority: 1,
        description: "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
    },
    Column {
        name: "Node",
        kind: "string",
        format: "",
        priority: 1,
        description: "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
    },
    Column {
        name: "Nominated Node",
        kind: "string",
        format: "",
        priority: 1,
        description: "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
    },
    Column {
        name: "Readiness Gates",
        kind: "string",
        format: "",
        priority: 1,
        description: "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
    },
];

/// `deploymentColumnDefinitions`.
pub const DEPLOYMENT: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Ready",
        kind: "string",
        format: "",
        priority: 0,
        description: "Number of the pod with ready state",
    },
    Column {
        name: "Up-to-date",
        kind: "string",
        format: "",
        priority: 0,
        description: "Total number of non-terminating pods targeted by this deployment that have the desired template spec.",
    },
    Column {
        name: "Available",
        kind: "string",
        format: "",
        priority: 0,
        description: "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Containers",
        kind: "string",
        format: "",
        priority: 1,
        description: "Names of each container in the template.",
    },
    Column {
        name: "Images",
        kind: "string",
        format: "",
        priority: 1,
        description: "Images referenced by each container in the template.",
    },
    Column {
        name: "Selector",
        kind: "string",
        format: "",
        priority: 1,
        description: "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels.",
    },
];

/// `replicaSetColumnDefinitions`.
pub const REPLICA_SET: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Desired",
        kind: "integer",
        format: "",
        priority: 0,
        description: "Replicas is the number of desired pods. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset",
    },
    Column {
        name: "Current",
        kind: "integer",
        format: "",
        priority: 0,
        description: "Replicas is the most recently observed number of non-terminating pods. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset",
    },
    Column {
        name: "Ready",
        kind: "integer",
        format: "",
        priority: 0,
        description: "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Containers",
        kind: "string",
        format: "",
        priority: 1,
        description: "Names of each container in the template.",
    },
    Column {
        name: "Images",
        kind: "string",
        format: "",
        priority: 1,
        description: "Images referenced by each container in the template.",
    },
    Column {
        name: "Selector",
        kind: "string",
        format: "",
        priority: 1,
        description: "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    },
];

/// `statefulSetColumnDefinitions`.
pub const STATEFUL_SET: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Ready",
        kind: "string",
        format: "",
        priority: 0,
        description: "Number of the pod with ready state",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Containers",
        kind: "string",
        format: "",
        priority: 1,
        description: "Names of each container in the template.",
    },
    Column {
        name: "Images",
        kind: "string",
        format: "",
        priority: 1,
        description: "Images referenced by each container in the template.",
    },
];

/// `daemonSetColumnDefinitions`.
pub const DAEMON_SET: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Desired",
        kind: "integer",
        format: "",
        priority: 0,
        description: "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    },
    Column {
        name: "Current",
        kind: "integer",
        format: "",
        priority: 0,
        description: "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    },
    Column {
        name: "Ready",
        kind: "integer",
        format: "",
        priority: 0,
        description: "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
    },
    Column {
        name: "Up-to-date",
        kind: "integer",
        format: "",
        priority: 0,
        description: "The total number of nodes that are running updated daemon pod",
    },
    Column {
        name: "Available",
        kind: "integer",
        format: "",
        priority: 0,
        description: "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
    },
    Column {
        name: "Node Selector",
        kind: "string",
        format: "",
        priority: 0,
        description: "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Containers",
        kind: "string",
        format: "",
        priority: 1,
        description: "Names of each container in the template.",
    },
    Column {
        name: "Images",
        kind: "string",
        format: "",
        priority: 1,
        description: "Images referenced by each container in the template.",
    },
    Column {
        name: "Selector",
        kind: "string",
        format: "",
        priority: 1,
        description: "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    },
];

/// `jobColumnDefinitions`.
pub const JOB: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Status",
        kind: "string",
        format: "",
        priority: 0,
        description: "Status of the job.",
    },
    Column {
        name: "Completions",
        kind: "string",
        format: "",
        priority: 0,
        description: "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.",
    },
    Column {
        name: "Duration",
        kind: "string",
        format: "",
        priority: 0,
        description: "Time required to complete the job.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Containers",
        kind: "string",
        format: "",
        priority: 1,
        description: "Names of each container in the template.",
    },
    Column {
        name: "Images",
        kind: "string",
        format: "",
        priority: 1,
        description: "Images referenced by each container in the template.",
    },
    Column {
        name: "Selector",
        kind: "string",
        format: "",
        priority: 1,
        description: "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    },
];

/// `cronJobColumnDefinitions`.
pub const CRON_JOB: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Schedule",
        kind: "string",
        format: "",
        priority: 0,
        description: "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
    },
    Column {
        name: "Timezone",
        kind: "string",
        format: "",
        priority: 0,
        description: "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones",
    },
    Column {
        name: "Suspend",
        kind: "boolean",
        format: "",
        priority: 0,
        description: "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
    },
    Column {
        name: "Active",
        kind: "integer",
        format: "",
        priority: 0,
        description: "A list of pointers to currently running jobs.",
    },
    Column {
        name: "Last Schedule",
        kind: "string",
        format: "",
        priority: 0,
        description: "Information when was the last time the job was successfully scheduled.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Containers",
        kind: "string",
        format: "",
        priority: 1,
        description: "Names of each container in the template.",
    },
    Column {
        name: "Images",
        kind: "string",
        format: "",
        priority: 1,
        description: "Images referenced by each container in the template.",
    },
    Column {
        name: "Selector",
        kind: "string",
        format: "",
        priority: 1,
        description: "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    },
];

/// `serviceColumnDefinitions`.
pub const SERVICE: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Type",
        kind: "string",
        format: "",
        priority: 0,
        description: "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types",
    },
    Column {
        name: "Cluster-IP",
        kind: "string",
        format: "",
        priority: 0,
        description: "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    },
    Column {
        name: "External-IP",
        kind: "string",
        format: "",
        priority: 0,
        description: "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.",
    },
    Column {
        name: "Port(s)",
        kind: "string",
        format: "",
        priority: 0,
        description: "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Selector",
        kind: "string",
        format: "",
        priority: 1,
        description: "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/",
    },
];

/// `ingressColumnDefinitions`.
pub const INGRESS: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Class",
        kind: "string",
        format: "",
        priority: 0,
        description: "The name of the IngressClass resource that should be used for additional configuration",
    },
    Column {
        name: "Hosts",
        kind: "string",
        format: "",
        priority: 0,
        description: "Hosts that incoming requests are matched against before the ingress rule",
    },
    Column {
        name: "Address",
        kind: "string",
        format: "",
        priority: 0,
        description: "Address is a list containing ingress points for the load-balancer",
    },
    Column {
        name: "Ports",
        kind: "string",
        format: "",
        priority: 0,
        description: "Ports of TLS configurations that open",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];

/// `namespaceColumnDefinitions`.
pub const NAMESPACE: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Status",
        kind: "string",
        format: "",
        priority: 0,
        description: "The status of the namespace",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];

/// `secretColumnDefinitions`.
pub const SECRET: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Type",
        kind: "string",
        format: "",
        priority: 0,
        description: "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
    },
    Column {
        name: "Data",
        kind: "string",
        format: "",
        priority: 0,
        description: "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];

/// `serviceAccountColumnDefinitions`.
pub const SERVICE_ACCOUNT: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];

/// `persistentVolumeClaimColumnDefinitions`.
pub const PERSISTENT_VOLUME_CLAIM: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Status",
        kind: "string",
        format: "",
        priority: 0,
        description: "phase represents the current phase of PersistentVolumeClaim.",
    },
    Column {
        name: "Volume",
        kind: "string",
        format: "",
        priority: 0,
        description: "volumeName is the binding reference to the PersistentVolume backing this claim.",
    },
    Column {
        name: "Capacity",
        kind: "string",
        format: "",
        priority: 0,
        description: "capacity represents the actual resources of the underlying volume.",
    },
    Column {
        name: "Access Modes",
        kind: "string",
        format: "",
        priority: 0,
        description: "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1",
    },
    Column {
        name: "StorageClass",
        kind: "string",
        format: "",
        priority: 0,
        description: "StorageClass of the pvc",
    },
    Column {
        name: "VolumeAttributesClass",
        kind: "string",
        format: "",
        priority: 0,
        description: "VolumeAttributesClass of the pvc",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "VolumeMode",
        kind: "string",
        format: "",
        priority: 1,
        description: "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec.",
    },
];

/// `configMapColumnDefinitions`.
pub const CONFIG_MAP: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Data",
        kind: "string",
        format: "",
        priority: 0,
        description: "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];

/// `networkPolicyColumnDefinitioins`.
pub const NETWORK_POLICY: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Pod-Selector",
        kind: "string",
        format: "",
        priority: 0,
        description: "podSelector selects the pods to which this NetworkPolicy object applies. The array of rules is applied to any pods selected by this field. An empty selector matches all pods in the policy's namespace. Multiple network policies can select the same set of pods. In this case, the ingress rules for each are combined additively. This field is optional. If it is not specified, it defaults to an empty selector.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];

/// `roleBindingsColumnDefinitions`.
pub const ROLE_BINDING: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Role",
        kind: "string",
        format: "",
        priority: 0,
        description: "roleRef can reference a Role in the current namespace or a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Users",
        kind: "string",
        format: "",
        priority: 1,
        description: "Users in the roleBinding",
    },
    Column {
        name: "Groups",
        kind: "string",
        format: "",
        priority: 1,
        description: "Groups in the roleBinding",
    },
    Column {
        name: "ServiceAccounts",
        kind: "string",
        format: "",
        priority: 1,
        description: "ServiceAccounts in the roleBinding",
    },
];

/// `clusterRoleBindingsColumnDefinitions`.
pub const CLUSTER_ROLE_BINDING: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Role",
        kind: "string",
        format: "",
        priority: 0,
        description: "roleRef can only reference a ClusterRole in the global namespace. If the RoleRef cannot be resolved, the Authorizer must return an error.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
    Column {
        name: "Users",
        kind: "string",
        format: "",
        priority: 1,
        description: "Users in the clusterRoleBinding",
    },
    Column {
        name: "Groups",
        kind: "string",
        format: "",
        priority: 1,
        description: "Groups in the clusterRoleBinding",
    },
    Column {
        name: "ServiceAccounts",
        kind: "string",
        format: "",
        priority: 1,
        description: "ServiceAccounts in the clusterRoleBinding",
    },
];

/// `podDisruptionBudgetColumnDefinitions`.
pub const POD_DISRUPTION_BUDGET: &[Column] = &[
    Column {
        name: "Name",
        kind: "string",
        format: "name",
        priority: 0,
        description: NAME_DOC,
    },
    Column {
        name: "Min Available",
        kind: "string",
        format: "",
        priority: 0,
        description: "The minimum number of pods that must be available.",
    },
    Column {
        name: "Max Unavailable",
        kind: "string",
        format: "",
        priority: 0,
        description: "The maximum number of pods that may be unavailable.",
    },
    Column {
        name: "Allowed Disruptions",
        kind: "integer",
        format: "",
        priority: 0,
        description: "Calculated number of pods that may be disrupted at this time.",
    },
    Column {
        name: "Age",
        kind: "string",
        format: "",
        priority: 0,
        description: CREATED_DOC,
    },
];
