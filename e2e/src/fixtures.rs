//! Pieces of the agent's world that several test files set up the same way.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use serde_json::{Value, json};

use crate::ControlPlane;

/// One account of the agent's config: `kinds` in `namespace`, read as the identity whose
/// kubeconfig is `kubeconfig`.
pub fn account(name: &str, kubeconfig: &Path, namespace: &str, kinds: &[&str]) -> Value {
    json!({
        "name": name,
        "kubeconfigFile": kubeconfig.display().to_string(),
        "namespaces": [namespace],
        "kinds": kinds,
    })
}

/// The API token of the tests' hubs (role operator: everything but the admin API), from the
/// tokens file [`write_api_tokens`] writes. A constant, so any helper holding only the hub's
/// address can attach it; only its hash is in the file, like any API token.
pub const API_TOKEN: &str = "sat_e2e-operator-token-for-tests-only";
/// Its name, as audit lines and 403 messages show it.
pub const API_TOKEN_NAME: &str = "e2e";

/// Writes `dir/api-tokens.yaml`, the hub's `--api-tokens-file` holding [`API_TOKEN`].
pub fn write_api_tokens(dir: &Path) -> anyhow::Result<PathBuf> {
    let path = dir.join("api-tokens.yaml");
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        &path,
        scale_agent_hub::api_auth::file_entry(
            API_TOKEN_NAME,
            scale_agent_hub::api_auth::Role::Operator,
            API_TOKEN,
        ),
    )?;
    Ok(path)
}

/// `method http://<addr><path>` to a plaintext hub's REST API, with [`API_TOKEN`].
pub fn hub_call(method: &str, addr: impl std::fmt::Display, path: &str) -> crate::http::Call {
    crate::http::Call::new(method, format!("http://{addr}{path}")).bearer(API_TOKEN)
}

/// `GET` a JSON document from a plaintext hub's REST API with [`API_TOKEN`]: `None` on 404,
/// an error on any other status but 200.
pub async fn hub_get_json(
    addr: impl std::fmt::Display,
    path: &str,
) -> crate::Result<Option<Value>> {
    Ok(hub_call("GET", addr, path).fetch_json().await?)
}

/// The real hub, in this process: plaintext gRPC and HTTP on free loopback ports, its store
/// in `dir/hub-data`, a heartbeat every 2 s.
pub async fn start_plaintext_hub(dir: &Path) -> anyhow::Result<scale_agent_hub::RunningHub> {
    Ok(scale_agent_hub::start(test_hub_config(dir)?).await?)
}

/// The hub configuration of the tests: plaintext gRPC and HTTP on free loopback ports, its
/// store in `dir/hub-data`, a heartbeat every 2 s, and the tokens file holding [`API_TOKEN`].
pub fn test_hub_config(dir: &Path) -> anyhow::Result<scale_agent_hub::Config> {
    let mut config = scale_agent_hub::Config::new(
        scale_agent_hub::GrpcSecurity::InsecurePlaintext,
        dir.join("hub-data"),
    );
    config.listeners.grpc_addr = "127.0.0.1:0".parse()?;
    config.listeners.http_addr = "127.0.0.1:0".parse()?;
    config.streams.heartbeat_period = Duration::from_secs(2);
    config.api.api_tokens_file = Some(write_api_tokens(dir)?);
    // The agents are `anonymous` here (plaintext gRPC), and identities without an account pattern of their own (anonymous, certificates of --client-ca) register only what an --allow rule names (issue 28, F7):
    // every name, as these tests expect.
    config.agents.allow =
        vec![scale_agent_hub::identity::AllowRule::parse("*=*").map_err(anyhow::Error::msg)?];
    Ok(config)
}

/// The real hub, in this process, as the proxy tests use it: plaintext gRPC for the agents,
/// and its HTTP listener (REST, admin API, Kubernetes API proxy) on TLS with a serving
/// certificate for loopback from a CA of its own, and an admin token file.
pub struct TlsHub {
    pub hub: scale_agent_hub::RunningHub,
    /// The CA that signed the serving certificate (PEM), as clients must trust it.
    pub ca_pem: String,
    /// The file holding `ca_pem`.
    pub ca_file: PathBuf,
    pub admin_token: String,
    pub admin_token_file: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// What it was started with (on its bound ports), for [`Self::restart`].
    config: scale_agent_hub::Config,
}

impl TlsHub {
    /// Starts it with its files in `dir`; `configure` may change the configuration first
    /// (grace period, Clouddriver registration, ...).
    pub async fn start(
        dir: &Path,
        configure: impl FnOnce(&mut scale_agent_hub::Config),
    ) -> anyhow::Result<TlsHub> {
        let ca = crate::pki::CertificateAuthority::new("scale-agent-hub-ca")?;
        let serving = ca.serving("scale-agent-hub", &[])?;
        let ca_file = dir.join("hub-ca.pem");
        std::fs::write(&ca_file, &ca.cert_pem)?;
        let admin_token_file = dir.join("admin-token");
        let mut config = test_hub_config(dir)?;
        config.listeners.http_security = scale_agent_hub::HttpSecurity::Tls {
            cert_pem: serving.cert_pem.into_bytes(),
            key_pem: serving.key_pem.into_bytes(),
        };
        config.api.serving_ca_pem = Some(ca.cert_pem.clone().into_bytes());
        config.api.admin_token_file = Some(admin_token_file.clone());
        configure(&mut config);
        let hub = scale_agent_hub::start(config.clone()).await?;
        config.listeners.grpc_addr = hub.grpc_addr;
        config.listeners.http_addr = hub.http_addr;
        let admin_token = std::fs::read_to_string(&admin_token_file)?
            .trim()
            .to_string();
        let url = format!("https://{}", hub.http_addr);
        Ok(TlsHub {
            hub,
            ca_pem: ca.cert_pem,
            ca_file,
            admin_token,
            admin_token_file,
            url,
            config,
        })
    }

    /// Shuts the hub down (as on SIGTERM), runs `while_down`, and starts it again with the
    /// same configuration, ports, serving certificate and data directory, so that agents
    /// and kubeconfigs find it where it was.
    pub async fn restart<T>(
        self,
        while_down: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(TlsHub, T)> {
        let TlsHub {
            hub,
            ca_pem,
            ca_file,
            admin_token,
            admin_token_file,
            url,
            config,
        } = self;
        hub.shutdown().await?;
        let between = while_down.await?;
        let hub = scale_agent_hub::start(config.clone()).await?;
        let restarted = TlsHub {
            hub,
            ca_pem,
            ca_file,
            admin_token,
            admin_token_file,
            url,
            config,
        };
        Ok((restarted, between))
    }

    /// `method <url><path>` trusting the hub's CA (no token: the proxy's requests carry
    /// their account's token).
    pub fn call(&self, method: &str, path: &str) -> crate::http::Call {
        crate::http::Call::new(method, format!("{}{path}", self.url)).ca(&self.ca_pem)
    }

    /// [`Self::call`] to the REST API, with [`API_TOKEN`].
    pub fn api(&self, method: &str, path: &str) -> crate::http::Call {
        self.call(method, path).bearer(API_TOKEN)
    }

    /// Issues a kubeconfig for `account` (a token named `token_name`) through the admin API
    /// and writes it to `path`.
    pub async fn kubeconfig(
        &self,
        account: &str,
        token_name: &str,
        path: &Path,
    ) -> anyhow::Result<PathBuf> {
        let response = self
            .call(
                "POST",
                &format!("/api/v1/accounts/{account}/kubeconfig?tokenName={token_name}"),
            )
            .bearer(&self.admin_token)
            .send()
            .await?;
        anyhow::ensure!(
            response.status == 200,
            "the admin API refused a kubeconfig for {account}: {} {}",
            response.status,
            response.body
        );
        std::fs::write(path, &response.body)?;
        Ok(path.to_path_buf())
    }

    /// Waits until `account` is streamed by an agent, and has `replicas` replicas connected.
    pub async fn wait_connected(&self, account: &str, replicas: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let response = self
                .api("GET", &format!("/api/v1/accounts/{account}"))
                .send()
                .await?;
            let view = response.json_or_null();
            let connected = usize::from(view["streaming"].is_object())
                + view["standbys"].as_array().map_or(0, Vec::len);
            if response.status == 200 && view["streaming"].is_object() && connected >= replicas {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "account {account} never had {replicas} replica(s) connected: {} {}",
                response.status,
                response.body
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Writes the agent's config file (JSON, which is YAML) for a plaintext hub at `hub` with
/// `accounts`, heartbeating every `heartbeat_seconds`, reconnecting after 200 ms to 2 s, and
/// a task budget of 4 (2 an account).
pub fn write_plaintext_agent_config(
    path: &Path,
    hub: SocketAddr,
    accounts: Value,
    heartbeat_seconds: u32,
) -> anyhow::Result<()> {
    let config = json!({
        "clouddriver": {
            "grpc": hub.to_string(),
            "insecure": true,
            "keepAliveHeartbeatSeconds": heartbeat_seconds,
            "backoff": { "baseDelay": "200ms", "maxDelay": "2s" },
        },
        "kubernetes": { "accounts": accounts },
        "tasks": { "totalBudget": 4, "budgetPerAccount": 2 },
    });
    std::fs::write(path, serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

/// Starts the agent in this process on the config at `config`, as replica `replica`, with
/// its admin port on a free loopback port.
pub async fn start_agent_replica(
    config: &Path,
    replica: &str,
) -> anyhow::Result<scale_agent::AgentHandle> {
    let mut options = scale_agent::Options::for_config(config);
    options.admin_addr = Some("127.0.0.1:0".parse()?);
    options.replica = Some(replica.into());
    Ok(scale_agent::start(options).await?)
}

/// `(uid, resourceVersion)` of objects by name: what a cache must agree on with the API
/// server.
pub type UidVersions = BTreeMap<String, (String, String)>;

/// The [`UidVersions`] of `objects` (JSON objects with `metadata`).
pub fn uid_versions<'a>(objects: impl IntoIterator<Item = &'a Value>) -> UidVersions {
    objects
        .into_iter()
        .map(|o| {
            let m = &o["metadata"];
            let field = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (field("name"), (field("uid"), field("resourceVersion")))
        })
        .collect()
}

/// `bytes` in base64 (standard alphabet, padded) as the API server serves Secret data: the
/// encoding of k8s-openapi's `ByteString`.
pub fn base64(bytes: &[u8]) -> String {
    match serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())) {
        Ok(Value::String(encoded)) => encoded,
        other => unreachable!("a ByteString serializes as a string, not {other:?}"),
    }
}

/// The test binary's log output, set up once (later calls do nothing): `RUST_LOG`, else
/// `default_filter`, into the test harness's captured output (printed for a failed test, or
/// with `--nocapture`).
pub fn init_logs(default_filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_test_writer()
        .try_init();
}

/// A new directory `<prefix>-<pid>-<random>` under the system's temporary directory.
pub fn temp_dir(prefix: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Where a test identity's rules apply.
pub enum Scope {
    /// A ClusterRole and ClusterRoleBinding, both `scale-agent-<namespace>`.
    Cluster,
    /// A Role and RoleBinding in the ServiceAccount's namespace, named as it.
    Namespace,
}

/// Everything in the cluster: the agent's rights in the proxy tests (Clouddriver's accounts
/// are usually this broad), with GET on every non-resource URL (discovery, `/version`).
pub fn admin_rules() -> Vec<PolicyRule> {
    vec![
        PolicyRule {
            api_groups: Some(vec!["*".into()]),
            resources: Some(vec!["*".into()]),
            verbs: vec!["*".into()],
            ..Default::default()
        },
        PolicyRule {
            non_resource_urls: Some(vec!["*".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        },
    ]
}

/// get, list and watch on `resources`: `plural` for the core group, else `plural.group`.
pub fn read_rules(resources: &[&str]) -> Vec<PolicyRule> {
    resources
        .iter()
        .map(|resource| {
            let (plural, group) = resource.split_once('.').unwrap_or((resource, ""));
            PolicyRule {
                api_groups: Some(vec![group.to_string()]),
                resources: Some(vec![plural.to_string()]),
                verbs: vec!["get".into(), "list".into(), "watch".into()],
                ..Default::default()
            }
        })
        .collect()
}

/// A ServiceAccount `name` in `namespace`, bound per `scope` to `rules` under real RBAC;
/// writes a kubeconfig holding a real TokenRequest token for it to `kubeconfig` and returns
/// that path.
pub async fn service_account_identity(
    control_plane: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
    scope: Scope,
    rules: Vec<PolicyRule>,
    kubeconfig: PathBuf,
) -> anyhow::Result<PathBuf> {
    let pp = PostParams::default();
    let metadata = |name: &str| ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create(
            &pp,
            &ServiceAccount {
                metadata: metadata(name),
                ..Default::default()
            },
        )
        .await?;
    let subjects = Some(vec![Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(namespace.into()),
        ..Default::default()
    }]);
    let role_ref = |kind: &str, name: &str| RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.into(),
    };
    match scope {
        Scope::Cluster => {
            let binding = format!("scale-agent-{namespace}");
            let role = ClusterRole {
                metadata: metadata(&binding),
                rules: Some(rules),
                ..Default::default()
            };
            Api::<ClusterRole>::all(admin.clone())
                .create(&pp, &role)
                .await?;
            let role_binding = ClusterRoleBinding {
                metadata: metadata(&binding),
                role_ref: role_ref("ClusterRole", &binding),
                subjects,
            };
            Api::<ClusterRoleBinding>::all(admin.clone())
                .create(&pp, &role_binding)
                .await?;
        }
        Scope::Namespace => {
            let role = Role {
                metadata: metadata(name),
                rules: Some(rules),
            };
            Api::<Role>::namespaced(admin.clone(), namespace)
                .create(&pp, &role)
                .await?;
            let role_binding = RoleBinding {
                metadata: metadata(name),
                role_ref: role_ref("Role", name),
                subjects,
            };
            Api::<RoleBinding>::namespaced(admin.clone(), namespace)
                .create(&pp, &role_binding)
                .await?;
        }
    }
    let token = control_plane
        .service_account_token(admin, namespace, name)
        .await?;
    std::fs::write(&kubeconfig, control_plane.kubeconfig_for_token(&token))?;
    Ok(kubeconfig)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_is_the_padded_standard_alphabet() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }
}
