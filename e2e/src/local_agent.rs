//! Running an agent Deployment's pod as a local process, doing what a kubelet would.
//!
//! The test cluster has no kubelet, so the agent pods the operator's Deployment asks for
//! never start. [`LocalAgent::start`] plays kubelet for one replica:
//!
//! 1. reads the Deployment and its pod template's agent container;
//! 2. projects the pod's volumes into a directory: `<dir>/root` stands for `/`, so a mount
//!    at `/etc/scale-agent` becomes `<dir>/root/etc/scale-agent`. ConfigMap and Secret
//!    volumes get one file per key (or per `items` entry; `subPath` mounts one key),
//!    `emptyDir` an empty directory. Files are replaced atomically (write, then rename), as
//!    the kubelet's symlink swap does;
//! 3. because the agent's config names the mount paths (`/var/run/scale-agent/tls/tls.crt`),
//!    every mount path found in a ConfigMap's values and in the container's args is
//!    rewritten to its local directory;
//! 4. mints a TokenRequest token for the pod's ServiceAccount (unless
//!    `automountServiceAccountToken` is false) into
//!    `<dir>/root/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}`,
//!    and writes `<dir>/kubeconfig` that reads that token file (`tokenFile`, re-read by the
//!    client, so [`LocalAgent::refresh_token`] rotates it under a running agent). The agent's
//!    `serviceAccount: true` uses the in-cluster config inside a pod and falls back to
//!    `$KUBECONFIG` outside one; the process gets `KUBECONFIG` set to that file and
//!    `KUBERNETES_SERVICE_HOST`/`_PORT` removed, so it authenticates as the ServiceAccount
//!    and the operator's RBAC applies to it for real;
//! 5. starts the agent binary (`e2e-agent`, the `scale-agent` command) with the container's
//!    args (the image's entrypoint is the agent), its env (`fieldRef`s resolved:
//!    `metadata.name` is the local pod name `<deployment>-local-<replica>`,
//!    `metadata.namespace`, `spec.serviceAccountName`, `spec.nodeName` = `local`,
//!    `status.podIP` = `127.0.0.1`; `configMapKeyRef`/`secretKeyRef` looked up), and
//!    `--admin-addr 127.0.0.1:<free port>` (a pod's port 8082 cannot be shared), plus
//!    `--hub`/`--hub-server-name` when [`LocalAgentOptions`] overrides them.
//!
//! A kubelet keeps mounted ConfigMaps and Secrets in step with the API; here that is
//! [`LocalAgent::sync_volumes`], which the caller runs after the operator changed something
//! (the agent re-reads its config file every 2 s and its certificate on every reconnect).
//!
//! ```no_run
//! # async fn example(control_plane: &scale_agent_e2e::ControlPlane, client: kube::Client)
//! #     -> scale_agent_e2e::Result<()> {
//! use scale_agent_e2e::local_agent::{LocalAgent, LocalAgentOptions};
//! let options = LocalAgentOptions::new("team-a", "prod-agent", "/tmp/prod-agent-0".into());
//! let mut agent = LocalAgent::start(control_plane, &client, options).await?;
//! agent.wait_ready(std::time::Duration::from_secs(60)).await?;
//! println!("{} pid {} admin {}", agent.pod_name(), agent.pid(), agent.admin_url());
//! // ... the operator rewrites the ConfigMap ...
//! agent.sync_volumes(&client).await?;
//! agent.stop();
//! # Ok(()) }
//! ```
//!
//! Not emulated: probes and restarts, resource limits, `envFrom`, projected and other
//! volume types (an error names them), init and sidecar containers.

use std::{
    collections::BTreeMap,
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Container, EnvVar, KeyToPath, PodSpec, Secret, Volume, VolumeMount},
};
use kube::{Api, Client};

use crate::{
    ControlPlane,
    binaries::product_binary,
    error::{Error, Result, io_err},
    process::ManagedProcess,
};

/// Where a kubelet mounts a pod's ServiceAccount token.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What to run and where.
#[derive(Clone, Debug)]
pub struct LocalAgentOptions {
    /// Namespace of the Deployment.
    pub namespace: String,
    /// The agent Deployment (`<scaleagent>-agent`).
    pub deployment: String,
    /// Which replica this is: the pod is named `<deployment>-local-<replica>`.
    pub replica: usize,
    /// The pod's directory: projected volumes, kubeconfig, log. Created if missing.
    pub dir: PathBuf,
    /// The agent binary; by default `e2e-agent` next to the running executable.
    pub program: Option<PathBuf>,
    /// The container to run; by default the one named `agent`, else the first.
    pub container: Option<String>,
    /// Overrides the hub address of the config (`--hub`).
    pub hub: Option<String>,
    /// Overrides the name checked in the hub's certificate (`--hub-server-name`).
    pub hub_server_name: Option<String>,
    /// Lifetime asked for the ServiceAccount token.
    pub token_lifetime: Duration,
    /// Extra environment for the process (after the container's), e.g. `RUST_LOG`.
    pub env: Vec<(String, String)>,
}

impl LocalAgentOptions {
    /// Replica 0 of `namespace/deployment`, files in `dir`, everything else default.
    pub fn new(namespace: &str, deployment: &str, dir: PathBuf) -> Self {
        Self {
            namespace: namespace.to_owned(),
            deployment: deployment.to_owned(),
            replica: 0,
            dir,
            program: None,
            container: None,
            hub: None,
            hub_server_name: None,
            token_lifetime: Duration::from_secs(24 * 3600),
            env: Vec::new(),
        }
    }

    /// The same pod template, another replica; give each replica its own `dir`.
    pub fn replica(mut self, replica: usize) -> Self {
        self.replica = replica;
        self
    }
}

/// One agent pod running as a local process. Dropping it stops the process.
#[derive(Debug)]
pub struct LocalAgent {
    pod: LocalPod,
    process: ManagedProcess,
    kubeconfig: Option<PathBuf>,
    admin_addr: SocketAddr,
}

/// The pod's identity and files, independent of the process.
#[derive(Debug)]
struct LocalPod {
    pod_name: String,
    namespace: String,
    service_account: Option<String>,
    root: PathBuf,
    token_lifetime: Duration,
    /// Mounts of the container, longest path first, with their volumes.
    mounts: Vec<(VolumeMount, Volume)>,
}

impl LocalAgent {
    /// Projects the pod's volumes and token and starts the agent process (see the module
    /// documentation). Fails when the Deployment, or a non-optional ConfigMap or Secret it
    /// mounts, does not exist yet.
    pub async fn start(
        control_plane: &ControlPlane,
        client: &Client,
        options: LocalAgentOptions,
    ) -> Result<Self> {
        let pod_name = format!("{}-local-{}", options.deployment, options.replica);
        let pod_error = |message: String| Error::LocalPod {
            pod: format!("{}/{pod_name}", options.namespace),
            message,
        };
        let deployment = Api::<Deployment>::namespaced(client.clone(), &options.namespace)
            .get_opt(&options.deployment)
            .await?
            .ok_or_else(|| {
                pod_error(format!(
                    "Deployment {}/{} not found",
                    options.namespace, options.deployment
                ))
            })?;
        let pod: PodSpec = deployment
            .spec
            .template
            .spec
            .ok_or_else(|| pod_error("the Deployment has no pod template".into()))?;
        let container: Container = match &options.container {
            Some(name) => pod.containers.iter().find(|c| &c.name == name),
            None => pod
                .containers
                .iter()
                .find(|c| c.name == "agent")
                .or(pod.containers.first()),
        }
        .cloned()
        .ok_or_else(|| pod_error("the pod template has no such container".into()))?;

        let volumes = pod.volumes.clone().unwrap_or_default();
        let mut mounts = Vec::new();
        for mount in container.volume_mounts.clone().unwrap_or_default() {
            let volume = volumes
                .iter()
                .find(|v| v.name == mount.name)
                .cloned()
                .ok_or_else(|| pod_error(format!("no volume named {}", mount.name)))?;
            mounts.push((mount, volume));
        }
        mounts.sort_by_key(|(m, _)| std::cmp::Reverse(m.mount_path.len()));

        let root = options.dir.join("root");
        fs::create_dir_all(&root).map_err(io_err(format!("create {}", root.display())))?;
        let service_account = pod
            .service_account_name
            .clone()
            .filter(|_| pod.automount_service_account_token != Some(false))
            .or_else(|| {
                (pod.automount_service_account_token != Some(false)).then(|| "default".into())
            });
        let pod_files = LocalPod {
            pod_name: pod_name.clone(),
            namespace: options.namespace.clone(),
            service_account: service_account.clone(),
            root: root.clone(),
            token_lifetime: options.token_lifetime,
            mounts,
        };
        pod_files.sync_volumes(client).await?;
        let admin_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut kubeconfig_path = None;

        let mut command = Command::new(match &options.program {
            Some(program) => program.clone(),
            None => product_binary("e2e-agent")?,
        });
        command.current_dir(&options.dir);
        // Nothing of this process's own configuration leaks into the pod.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy().into_owned();
            if key.starts_with("SCALE_AGENT_")
                || key.starts_with("KUBERNETES_")
                || key == "KUBECONFIG"
                || key == "POD_NAME"
                || key == "POD_NAMESPACE"
            {
                command.env_remove(&key);
            }
        }
        if let Some(service_account) = &service_account {
            pod_files.refresh_token(control_plane, client).await?;
            let kubeconfig = options.dir.join("kubeconfig");
            let sa_dir = pod_files.local_path(SERVICE_ACCOUNT_DIR);
            write_atomically(
                &kubeconfig,
                token_kubeconfig(
                    control_plane.server(),
                    &sa_dir.join("ca.crt"),
                    &sa_dir.join("token"),
                    &format!(
                        "system:serviceaccount:{}:{service_account}",
                        options.namespace
                    ),
                )
                .as_bytes(),
            )?;
            command.env("KUBECONFIG", &kubeconfig);
            kubeconfig_path = Some(kubeconfig);
        }
        for var in container.env.clone().unwrap_or_default() {
            let value = pod_files.env_value(client, &pod, &var).await?;
            command.env(&var.name, pod_files.rewrite(&value));
        }
        for (key, value) in &options.env {
            command.env(key, value);
        }
        let mut args: Vec<String> = container
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|arg| pod_files.rewrite(arg))
            .collect();
        args.extend(["--admin-addr".into(), admin_addr.to_string()]);
        if let Some(hub) = &options.hub {
            args.extend(["--hub".into(), hub.clone()]);
        }
        if let Some(name) = &options.hub_server_name {
            args.extend(["--hub-server-name".into(), name.clone()]);
        }
        command.args(&args);
        let process = ManagedProcess::spawn_command(
            "scale-agent",
            command,
            options.dir.join(format!("{pod_name}.log")),
        )?;
        Ok(Self {
            pod: pod_files,
            process,
            kubeconfig: kubeconfig_path,
            admin_addr,
        })
    }

    /// Does what the kubelet does periodically for mounted ConfigMaps and Secrets: copies
    /// their current contents into the pod's files (mount paths in ConfigMap values
    /// rewritten). Only files whose contents changed are replaced; returns their paths.
    pub async fn sync_volumes(&self, client: &Client) -> Result<Vec<PathBuf>> {
        self.pod.sync_volumes(client).await
    }

    /// Mints a new ServiceAccount token into the pod's token file (the agent's client
    /// re-reads it within a minute). Does nothing for a pod without a token.
    pub async fn refresh_token(&self, control_plane: &ControlPlane, client: &Client) -> Result<()> {
        self.pod.refresh_token(control_plane, client).await
    }

    /// Waits until the agent's `/readyz` answers 200 (its accounts' credentials loaded) and
    /// `/accounts` says `synced` (connected to the hub and every account answered). Fails
    /// early with the agent's log when it exits.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.process.ensure_running()?;
            let ready = crate::http::get(self.admin_addr, "/readyz")
                .await
                .is_ok_and(|r| r.status == 200);
            if ready && self.synced().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    component: "scale-agent",
                    waited_secs: timeout.as_secs(),
                    log: self.process.log().to_path_buf(),
                    log_tail: crate::process::tail(self.process.log(), 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether `/accounts` says `synced`: connected to the hub, every account answered and
    /// a streaming account's watches started.
    pub async fn synced(&self) -> bool {
        crate::http::get(self.admin_addr, "/accounts")
            .await
            .is_ok_and(|r| r.status == 200 && r.json_or_null()["synced"] == true)
    }

    /// The local pod's name (`POD_NAME`, and the agent's replica name).
    pub fn pod_name(&self) -> &str {
        &self.pod.pod_name
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The agent's log file.
    pub fn log(&self) -> &Path {
        self.process.log()
    }

    /// The admin listener (`/healthz`, `/readyz`, `/metrics`, `/accounts`).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// The kubeconfig the agent authenticates with (the ServiceAccount's token).
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }

    /// Where the pod's path `pod_path` (absolute) lives locally.
    pub fn local_path(&self, pod_path: &str) -> PathBuf {
        self.pod.local_path(pod_path)
    }

    /// Fails with the end of the agent's log when it has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        self.process.ensure_running()
    }

    /// Stops the agent (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }
}

impl LocalPod {
    async fn sync_volumes(&self, client: &Client) -> Result<Vec<PathBuf>> {
        let mut changed = Vec::new();
        for (mount, volume) in &self.mounts {
            let target = self.local_path(&mount.mount_path);
            let files = self.volume_files(client, volume).await?;
            let Some(files) = files else {
                fs::create_dir_all(&target)
                    .map_err(io_err(format!("create {}", target.display())))?;
                continue;
            };
            let files: Vec<(PathBuf, Vec<u8>)> = match mount.sub_path.as_deref() {
                Some(sub) if !sub.is_empty() => files
                    .into_iter()
                    .filter(|(name, _)| name == Path::new(sub))
                    .map(|(_, data)| (target.clone(), data))
                    .collect(),
                _ => files
                    .into_iter()
                    .map(|(name, data)| (target.join(name), data))
                    .collect(),
            };
            if mount.sub_path.as_deref().is_none_or(str::is_empty) {
                fs::create_dir_all(&target)
                    .map_err(io_err(format!("create {}", target.display())))?;
            }
            for (path, data) in files {
                if fs::read(&path).ok().as_deref() != Some(data.as_slice()) {
                    write_atomically(&path, &data)?;
                    changed.push(path);
                }
            }
        }
        Ok(changed)
    }

    async fn refresh_token(&self, control_plane: &ControlPlane, client: &Client) -> Result<()> {
        let Some(service_account) = &self.service_account else {
            return Ok(());
        };
        let token = crate::control_plane::token_request(
            client,
            &self.namespace,
            service_account,
            self.token_lifetime,
        )
        .await?;
        let dir = self.local_path(SERVICE_ACCOUNT_DIR);
        fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        write_atomically(&dir.join("ca.crt"), control_plane.ca_pem().as_bytes())?;
        write_atomically(&dir.join("namespace"), self.namespace.as_bytes())?;
        write_atomically(&dir.join("token"), token.as_bytes())
    }

    fn local_path(&self, pod_path: &str) -> PathBuf {
        self.root.join(pod_path.trim_start_matches('/'))
    }

    /// Mount paths in `text` replaced by their local directories.
    fn rewrite(&self, text: &str) -> String {
        let mut mounts: Vec<(String, PathBuf)> = self
            .mounts
            .iter()
            .map(|(m, _)| (m.mount_path.clone(), self.local_path(&m.mount_path)))
            .collect();
        mounts.push((
            SERVICE_ACCOUNT_DIR.to_owned(),
            self.local_path(SERVICE_ACCOUNT_DIR),
        ));
        rewrite_paths(text, &mounts)
    }

    /// A volume's files (relative path, contents); `None` for a directory without files
    /// (`emptyDir`, a missing optional source).
    async fn volume_files(
        &self,
        client: &Client,
        volume: &Volume,
    ) -> Result<Option<Vec<(PathBuf, Vec<u8>)>>> {
        let missing = |what: String| Error::LocalPod {
            pod: format!("{}/{}", self.namespace, self.pod_name),
            message: format!("volume {}: {what} not found", volume.name),
        };
        if let Some(source) = &volume.config_map {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), &self.namespace)
                .get_opt(&source.name)
                .await?;
            let Some(cm) = cm else {
                return match source.optional {
                    Some(true) => Ok(None),
                    _ => Err(missing(format!("ConfigMap {}", source.name))),
                };
            };
            let mut data: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, self.rewrite(&v).into_bytes()))
                .collect();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                data.insert(k, v.0);
            }
            return Ok(Some(select_items(data, source.items.as_deref())));
        }
        if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap_or_default();
            let secret = Api::<Secret>::namespaced(client.clone(), &self.namespace)
                .get_opt(&name)
                .await?;
            let Some(secret) = secret else {
                return match source.optional {
                    Some(true) => Ok(None),
                    _ => Err(missing(format!("Secret {name}"))),
                };
            };
            let mut data: BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in secret.string_data.unwrap_or_default() {
                data.insert(k, v.into_bytes());
            }
            return Ok(Some(select_items(data, source.items.as_deref())));
        }
        if volume.empty_dir.is_some() {
            return Ok(None);
        }
        Err(Error::LocalPod {
            pod: format!("{}/{}", self.namespace, self.pod_name),
            message: format!(
                "volume {}: only configMap, secret and emptyDir volumes can be run locally",
                volume.name
            ),
        })
    }

    /// The value of one container env var, `fieldRef`s and key references resolved.
    async fn env_value(&self, client: &Client, pod: &PodSpec, var: &EnvVar) -> Result<String> {
        let Some(from) = &var.value_from else {
            return Ok(var.value.clone().unwrap_or_default());
        };
        let unsupported = |what: &str| Error::LocalPod {
            pod: format!("{}/{}", self.namespace, self.pod_name),
            message: format!("env {}: {what}", var.name),
        };
        if let Some(field) = &from.field_ref {
            return Ok(match field.field_path.as_str() {
                "metadata.name" => self.pod_name.clone(),
                "metadata.namespace" => self.namespace.clone(),
                "spec.serviceAccountName" => pod
                    .service_account_name
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                "spec.nodeName" => "local".into(),
                "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
                other => return Err(unsupported(&format!("fieldRef {other} is not emulated"))),
            });
        }
        if let Some(key) = &from.config_map_key_ref {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), &self.namespace)
                .get_opt(&key.name)
                .await?;
            return Ok(cm
                .and_then(|cm| cm.data)
                .and_then(|d| d.get(&key.key).cloned())
                .unwrap_or_default());
        }
        if let Some(key) = &from.secret_key_ref {
            let secret = Api::<Secret>::namespaced(client.clone(), &self.namespace)
                .get_opt(&key.name)
                .await?;
            return Ok(secret
                .and_then(|s| s.data)
                .and_then(|d| d.get(&key.key).cloned())
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .unwrap_or_default());
        }
        Err(unsupported("resourceFieldRef is not emulated"))
    }
}

/// Keys of a ConfigMap or Secret as files: all of them, or the `items` mapping.
fn select_items(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
) -> Vec<(PathBuf, Vec<u8>)> {
    match items {
        Some(items) if !items.is_empty() => items
            .iter()
            .filter_map(|item| {
                data.get(&item.key)
                    .map(|v| (PathBuf::from(&item.path), v.clone()))
            })
            .collect(),
        _ => data
            .into_iter()
            .map(|(k, v)| (PathBuf::from(k), v))
            .collect(),
    }
}

/// Replaces, in one pass, every occurrence of a mount path (followed by `/` or the end of a
/// word, and preceded by the start of a word) with its local directory. Longest mount paths
/// win; replaced text is never rewritten again.
pub fn rewrite_paths(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut mounts: Vec<(&str, String)> = mounts
        .iter()
        .map(|(from, to)| (from.trim_end_matches('/'), to.display().to_string()))
        .filter(|(from, _)| from.len() > 1)
        .collect();
    mounts.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let is_word_end = |c: Option<char>| {
        c.is_none_or(|c| c == '/' || c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ']'))
    };
    let is_word_start = |c: Option<char>| {
        c.is_none_or(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '=' | ':' | '[' | ','))
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut previous: Option<char> = None;
    'outer: while !rest.is_empty() {
        if is_word_start(previous) {
            for (from, to) in &mounts {
                if let Some(after) = rest.strip_prefix(from)
                    && is_word_end(after.chars().next())
                {
                    out.push_str(to);
                    previous = from.chars().last();
                    rest = after;
                    continue 'outer;
                }
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            out.push(c);
            previous = Some(c);
        }
        rest = chars.as_str();
    }
    out
}

/// A kubeconfig for `user` that reads its bearer token from `token_file`.
fn token_kubeconfig(server: &str, ca_file: &Path, token_file: &Path, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    tokenFile: {token}
contexts:
- name: local
  context:
    cluster: local
    user: {user}
current-context: local
",
        ca = ca_file.display(),
        token = token_file.display(),
    )
}

/// Writes `data` to `path` through a temporary file and a rename, so a reader never sees a
/// half-written file.
fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("create {}", parent.display())))?;
    }
    let tmp = path.with_extension("local-agent-tmp");
    fs::write(&tmp, data).map_err(io_err(format!("write {}", tmp.display())))?;
    fs::rename(&tmp, path).map_err(io_err(format!("rename to {}", path.display())))
}

/// A free TCP port on loopback ([`scale_agent_testkit::free_port`]). Another process may
/// take it before it is used; on a test machine that is rare enough to accept.
pub fn free_port() -> Result<u16> {
    scale_agent_testkit::free_port().map_err(io_err("find a free port"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_rewritten_once_and_only_as_whole_paths() {
        let mounts = vec![
            (
                "/etc/scale-agent".to_owned(),
                PathBuf::from("/tmp/x/root/etc/scale-agent"),
            ),
            ("/tmp".to_owned(), PathBuf::from("/tmp/x/root/tmp")),
            (
                "/var/run/scale-agent/tls".to_owned(),
                PathBuf::from("/tmp/x/root/var/run/scale-agent/tls"),
            ),
        ];
        let config = "clientCertFile: /var/run/scale-agent/tls/tls.crt\n\
                      other: /var/run/scale-agent/tls2/a\n\
                      args: [\"--config\", \"/etc/scale-agent/scale-agent.yaml\"]\n\
                      tmp: /tmp\nnot: /tmpfoo x/tmp/y\n";
        assert_eq!(
            rewrite_paths(config, &mounts),
            "clientCertFile: /tmp/x/root/var/run/scale-agent/tls/tls.crt\n\
             other: /var/run/scale-agent/tls2/a\n\
             args: [\"--config\", \"/tmp/x/root/etc/scale-agent/scale-agent.yaml\"]\n\
             tmp: /tmp/x/root/tmp\nnot: /tmpfoo x/tmp/y\n"
        );
        assert_eq!(
            rewrite_paths("/etc/scale-agent/scale-agent.yaml", &mounts),
            "/tmp/x/root/etc/scale-agent/scale-agent.yaml"
        );
    }

    #[test]
    fn items_select_and_rename_keys() {
        let data: BTreeMap<String, Vec<u8>> =
            [("a".into(), b"1".to_vec()), ("b".into(), b"2".to_vec())].into();
        assert_eq!(select_items(data.clone(), None).len(), 2);
        let items = [KeyToPath {
            key: "b".into(),
            path: "dir/b.txt".into(),
            ..Default::default()
        }];
        assert_eq!(
            select_items(data, Some(&items)),
            [(PathBuf::from("dir/b.txt"), b"2".to_vec())]
        );
    }

    #[test]
    fn kubeconfig_reads_the_token_file() {
        let yaml = token_kubeconfig(
            "https://127.0.0.1:6443",
            Path::new("/x/ca.crt"),
            Path::new("/x/token"),
            "system:serviceaccount:ns:sa",
        );
        let parsed = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.token_file.as_deref(), Some("/x/token"));
    }
}
