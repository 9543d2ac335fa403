//! The configuration files of a real node's components: containerd's, the CNI network's,
//! kubelet's and kube-proxy's. Each says in a comment why a setting differs from the
//! component's default (`/work/shared/reference/real-node.md` recorded what this machine
//! kind needs).

use std::path::Path;

use super::{BRIDGE, BRIDGE_ADDRESS, CNI_BIN_DIR, NODE_NAME, PAUSE_IMAGE, POD_SUBNET};

/// containerd 1.6's configuration (version 2): its own root, state and socket, so it never
/// meets a containerd of the machine's, and the CRI plugin set up for kubelet.
pub(super) fn containerd(root: &Path, state: &Path, socket: &Path, cni_conf_dir: &Path) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # Built by e2e/node/install.sh and imported by the harness: nothing is pulled.
  sandbox_image = "{PAUSE_IMAGE}"
  # Virtual machines of this kind refuse a negative oom_score_adj; without this every
  # sandbox fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
        root = root.display(),
        state = state.display(),
        socket = socket.display(),
        conf = cni_conf_dir.display(),
    )
}

/// The pods' network: a bridge (made by the harness beforehand, with the gateway address
/// the API server listens on), addresses from host-local with its state in the run
/// directory, masquerading for traffic leaving the subnet, hairpin so a pod reaches itself
/// through a Service, and portmap for hostPorts.
pub(super) fn cni_conflist(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "scale-agent-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": POD_SUBNET, "gateway": BRIDGE_ADDRESS.to_string() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": ipam_dir.display().to_string(),
                }
            },
            { "type": "portmap", "capabilities": { "portMappings": true } }
        ]
    })
    .to_string()
}

/// What kubelet's configuration points at.
pub(super) struct KubeletFiles<'a> {
    pub ca: &'a Path,
    pub serving_cert: &'a Path,
    pub serving_key: &'a Path,
    pub containerd_socket: &'a Path,
    pub pod_logs: &'a Path,
    pub healthz_port: u16,
}

/// kubelet's KubeletConfiguration: clients authenticated by certificate (this run's CA) or
/// by token (TokenReview), and authorized by the API server (SubjectAccessReview), never
/// anonymously; its API served on the bridge address with a certificate from the run's CA.
pub(super) fn kubelet(files: &KubeletFiles<'_>) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{BRIDGE_ADDRESS}"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "{ca}"
authorization:
  mode: Webhook
tlsCertFile: "{serving_cert}"
tlsPrivateKeyFile: "{serving_key}"
containerRuntimeEndpoint: "unix://{socket}"
podLogsDir: "{pod_logs}"
# This machine kind has cgroup v1 controllers (kubelet 1.37 refuses v1 unless told), no
# systemd to delegate to, and a shared disk that is busy but large.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
# The images were imported, not pulled: collecting them would lose them for good.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# No cluster DNS: pods resolve with the machine's resolv.conf (kubelet's MissingClusterDNS
# event is expected).
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
rotateCertificates: false
serverTLSBootstrap: false
maxPods: 110
"#,
        healthz_port = files.healthz_port,
        ca = files.ca.display(),
        serving_cert = files.serving_cert.display(),
        serving_key = files.serving_key.display(),
        socket = files.containerd_socket.display(),
        pod_logs = files.pod_logs.display(),
    )
}

/// kube-proxy's KubeProxyConfiguration: iptables mode, NodePorts only on the bridge address,
/// and none of the machine-wide conntrack settings touched.
pub(super) fn kube_proxy(kubeconfig: &Path, healthz_port: u16, metrics_port: u16) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: "{kubeconfig}"
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_SUBNET}
bindAddress: {BRIDGE_ADDRESS}
healthzBindAddress: 127.0.0.1:{healthz_port}
metricsBindAddress: 127.0.0.1:{metrics_port}
nodePortAddresses: ["{BRIDGE_ADDRESS}/32"]
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        kubeconfig = kubeconfig.display(),
    )
}
