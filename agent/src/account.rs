//! One account's credentials, cluster identity and discovery.
//!
//! Credentials: `kubeconfigFile` (with `context`, else the file's current context), or
//! `serviceAccount: true`, which uses the pod's own ServiceAccount
//! ([`kube::Config::incluster`]) and, when the agent does not run in a pod, falls back to
//! [`kube::Config::infer`] (`$KUBECONFIG` or `~/.kube/config`), which is handy on a laptop.
//! A `kubeconfigFile` of the form `encryptedFile:k8s!n:<secret>!k:<key>` ([`SecretRef`])
//! names a Secret read with the agent's own credentials instead of a file.

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
    discovery::{Discovery, Scope},
};
use scale_agent_crds::agent_config::AccountConfig;
use scale_agent_proto::v1;

use crate::{
    error::{Error, Result},
    kinds::{Candidate, KindRef},
};

/// An account ready to register: its clients and the identity of its cluster.
pub struct Prepared {
    /// The account's own credentials: discovery and watches.
    pub client: Client,
    /// Operations: the account's credentials impersonating `impersonateServiceAccount`
    /// when it is set, else the same as `client`.
    pub operations_client: Client,
    /// For the hub's Kubernetes API proxy: the same credentials without kube's retries, so
    /// every request is replayed exactly once and its answer passed on as it is.
    pub proxy_client: Client,
    /// The proxy's writes: like `proxy_client`, impersonating as `operations_client` does.
    pub proxy_write_client: Client,
    pub cluster: v1::ClusterInfo,
}

impl Prepared {
    /// The client a tunnelled request is replayed with: writes may impersonate.
    pub fn proxy_client_for(&self, write: bool) -> Client {
        if write {
            self.proxy_write_client.clone()
        } else {
            self.proxy_client.clone()
        }
    }
}

/// `config` acting as the account's `impersonateServiceAccount`, if any. Only the user is
/// sent: for a ServiceAccount user the API server adds its groups itself
/// (`system:serviceaccounts`, `system:serviceaccounts:<namespace>`, `system:authenticated`),
/// and asking for groups would need the right to impersonate groups as well.
pub fn impersonating(account: &AccountConfig, config: &Config) -> Option<Config> {
    let target = account.impersonate_service_account.as_ref()?;
    let mut config = config.clone();
    config.auth_info.impersonate = Some(target.username());
    config.auth_info.impersonate_groups = None;
    Some(config)
}

/// The kube client config for an account's credentials.
pub async fn kube_config(account: &AccountConfig) -> Result<Config> {
    if let Some(path) = account.kubeconfig_file.as_deref().filter(|p| !p.is_empty()) {
        let kubeconfig_error = |message: String| Error::Kubeconfig {
            account: account.name.clone(),
            path: path.to_string(),
            message,
        };
        // `encryptedFile:k8s!n:<secret>!k:<key>`: a Secret read with the agent's own
        // credentials (dynamic accounts), else a file.
        let kubeconfig = match SecretRef::parse(path) {
            Some(secret) => secret
                .map_err(kubeconfig_error)?
                .read_kubeconfig()
                .await
                .map_err(kubeconfig_error)?,
            None => Kubeconfig::read_from(path).map_err(|e| kubeconfig_error(e.to_string()))?,
        };
        let options = KubeConfigOptions {
            context: account.context.clone(),
            ..Default::default()
        };
        return Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| kubeconfig_error(e.to_string()));
    }
    if account.service_account {
        return match Config::incluster() {
            Ok(config) => Ok(config),
            Err(incluster) => Config::infer().await.map_err(|e| Error::InCluster {
                account: account.name.clone(),
                message: format!("{incluster}; {e}"),
            }),
        };
    }
    Err(Error::NoCredentials {
        account: account.name.clone(),
    })
}

/// The client config for the agent's own cluster: the pod's ServiceAccount, or `$KUBECONFIG`
/// outside a pod, through the environment's proxy unless `no_proxy` (`kubernetes.noProxy`)
/// or `NO_PROXY` says otherwise. The error says what is missing.
pub async fn own_cluster_config(no_proxy: bool) -> std::result::Result<Config, String> {
    let mut config = match Config::incluster() {
        Ok(config) => config,
        Err(incluster) => Config::infer()
            .await
            .map_err(|e| format!("no in-cluster config ({incluster}) and no kubeconfig ({e})"))?,
    };
    crate::egress::apply_to_kube(&mut config, no_proxy, &crate::egress::from_env());
    Ok(config)
}

/// Prefix of a `kubeconfigFile` that names a Secret's key.
pub const SECRET_PREFIX: &str = "encryptedFile:k8s!";
/// The Secret key read when none is named.
pub const DEFAULT_SECRET_KEY: &str = "kubeconfig";

/// A key of a Secret holding a kubeconfig.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// Empty: the agent's own namespace.
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl SecretRef {
    /// `encryptedFile:k8s!n:<name>!k:<key>` (and `!ns:<namespace>` when set).
    pub fn to_kubeconfig_file(&self) -> String {
        let mut file = format!("{SECRET_PREFIX}n:{}!k:{}", self.name, self.key);
        if !self.namespace.is_empty() {
            file.push_str(&format!("!ns:{}", self.namespace));
        }
        file
    }

    /// The reference in a `kubeconfigFile`; `None` for a plain path. An error says what is
    /// wrong with a value that has the prefix.
    pub fn parse(kubeconfig_file: &str) -> Option<Result<Self, String>> {
        let rest = kubeconfig_file.strip_prefix(SECRET_PREFIX)?;
        let mut secret = SecretRef {
            namespace: String::new(),
            name: String::new(),
            key: DEFAULT_SECRET_KEY.into(),
        };
        for part in rest.split('!') {
            match part.split_once(':') {
                Some(("n", name)) => secret.name = name.to_string(),
                Some(("k", key)) => secret.key = key.to_string(),
                Some(("ns", namespace)) => secret.namespace = namespace.to_string(),
                _ => {
                    return Some(Err(format!(
                        "{kubeconfig_file:?}: unknown part {part:?}; write \
                         {SECRET_PREFIX}n:<secret>!k:<key>[!ns:<namespace>]"
                    )));
                }
            }
        }
        if secret.name.is_empty() {
            return Some(Err(format!(
                "{kubeconfig_file:?} names no Secret; write {SECRET_PREFIX}n:<secret>!k:<key>"
            )));
        }
        Some(Ok(secret))
    }

    /// Reads the kubeconfig with the agent's own credentials (the pod's ServiceAccount, or
    /// `$KUBECONFIG` outside a pod). The error says what to change.
    pub async fn read_kubeconfig(&self) -> Result<Kubeconfig, String> {
        let config = own_cluster_config(false)
            .await
            .map_err(|e| format!("no credentials of the agent's own to read Secrets with: {e}"))?;
        let client = Client::try_from(config).map_err(|e| e.to_string())?;
        let namespace = if self.namespace.is_empty() {
            client.default_namespace().to_string()
        } else {
            self.namespace.clone()
        };
        let secret = Api::<Secret>::namespaced(client, &namespace)
            .get(&self.name)
            .await
            .map_err(|e| match &e {
                kube::Error::Api(status) if status.code == 403 => format!(
                    "the agent may not read Secret {namespace}/{}: grant its ServiceAccount \
                     `get` on it (a Role with resourceNames: [{}]): {e}",
                    self.name, self.name
                ),
                kube::Error::Api(status) if status.code == 404 => format!(
                    "Secret {namespace}/{} does not exist: create it with the kubeconfig \
                     under key {:?}",
                    self.name, self.key
                ),
                _ => format!("cannot read Secret {namespace}/{}: {e}", self.name),
            })?;
        let data = secret.data.unwrap_or_default();
        let Some(bytes) = data.get(&self.key) else {
            // The Secret's other key names are not echoed: this message goes to the hub.
            return Err(format!(
                "Secret {namespace}/{} has no key {:?}: put the kubeconfig under that key, or \
                 name the right one",
                self.name, self.key,
            ));
        };
        let text = std::str::from_utf8(&bytes.0).map_err(|_| {
            format!(
                "key {:?} of Secret {namespace}/{} is not UTF-8 text: it must hold a kubeconfig",
                self.key, self.name
            )
        })?;
        Kubeconfig::from_yaml(text).map_err(|e| {
            format!(
                "key {:?} of Secret {namespace}/{} is not a kubeconfig: {e}",
                self.key, self.name
            )
        })
    }
}

/// A proxy URL without its credentials, for logs.
fn redacted(proxy: &http::Uri) -> String {
    match (proxy.scheme_str(), proxy.host(), proxy.port_u16()) {
        (Some(scheme), Some(host), Some(port)) => format!("{scheme}://{host}:{port}"),
        (Some(scheme), Some(host), None) => format!("{scheme}://{host}"),
        _ => "(a proxy)".into(),
    }
}

/// Lowercase hex SHA-256 of `der`.
pub fn fingerprint(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The API server URL as the agent reaches it, without a trailing slash.
pub fn api_server_host(config: &Config) -> String {
    config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string()
}

/// Loads credentials, builds a client and asks the API server its version.
pub async fn prepare(account: &AccountConfig) -> Result<Prepared> {
    let mut config = kube_config(account).await?;
    crate::egress::apply_to_kube(&mut config, account.no_proxy, &crate::egress::from_env());
    if let Some(proxy) = &config.proxy_url {
        tracing::debug!(account = %account.name, api_server = %config.cluster_url, proxy = %redacted(proxy), "the account's API server is reached through a proxy");
    }
    let ca_fingerprint = config
        .root_cert
        .as_ref()
        .and_then(|certs| certs.first())
        .map(|der| fingerprint(der))
        .unwrap_or_default();
    let api_server_host = api_server_host(&config);
    let kube_error = |context: &str| {
        let account = account.name.clone();
        let context = context.to_string();
        move |source| Error::Kube {
            account,
            context,
            source,
        }
    };
    let mut proxy_config = config.clone();
    proxy_config.default_retry = false;
    let proxy_client = Client::try_from(proxy_config.clone())
        .map_err(kube_error("build a client for the proxy"))?;
    let (operations_client, proxy_write_client) = match (
        impersonating(account, &config),
        impersonating(account, &proxy_config),
    ) {
        (Some(operations), Some(proxy_writes)) => (
            Client::try_from(operations)
                .map_err(kube_error("build an impersonating client for operations"))?,
            Client::try_from(proxy_writes).map_err(kube_error(
                "build an impersonating client for proxied writes",
            ))?,
        ),
        _ => (
            Client::try_from(config.clone()).map_err(kube_error("build a client"))?,
            proxy_client.clone(),
        ),
    };
    let client = Client::try_from(config).map_err(kube_error("build a client"))?;
    let version = client
        .apiserver_version()
        .await
        .map_err(kube_error(&format!(
            "ask {api_server_host} for its version"
        )))?;
    if let Some(target) = &account.impersonate_service_account {
        tracing::info!(
            account = %account.name,
            impersonate = %target.username(),
            "operations and proxied writes run as the impersonated ServiceAccount"
        );
    }
    Ok(Prepared {
        client,
        operations_client,
        proxy_client,
        proxy_write_client,
        cluster: v1::ClusterInfo {
            api_server_host,
            ca_fingerprint,
            kubernetes_version: version.git_version,
        },
    })
}

/// Every resource of every version the API server serves.
pub async fn discover(account: &str, client: &Client) -> Result<Vec<Candidate>> {
    let discovery = match Discovery::new(client.clone()).run_aggregated().await {
        Ok(discovery) => discovery,
        Err(aggregated) => {
            tracing::debug!(error = %aggregated, "aggregated discovery failed; using per-group discovery");
            Discovery::new(client.clone())
                .run()
                .await
                .map_err(|source| Error::Kube {
                    account: account.to_string(),
                    context: "discover the API server's kinds".into(),
                    source,
                })?
        }
    };
    let mut candidates = Vec::new();
    for group in discovery.groups() {
        let preferred = group.preferred_version_or_latest().to_string();
        for version in group.versions() {
            for (resource, capabilities) in group.versioned_resources(version) {
                candidates.push(Candidate {
                    kind: KindRef {
                        group: resource.group.clone(),
                        version: resource.version.clone(),
                        kind: resource.kind.clone(),
                        plural: resource.plural.clone(),
                        namespaced: capabilities.scope == Scope::Namespaced,
                    },
                    verbs: capabilities.operations.clone(),
                    preferred: version == preferred,
                });
            }
        }
    }
    Ok(candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_reference_round_trips_in_spinnakers_form() {
        let secret = SecretRef {
            namespace: "spinnaker".into(),
            name: "k".into(),
            key: "config".into(),
        };
        let file = secret.to_kubeconfig_file();
        assert_eq!(file, "encryptedFile:k8s!n:k!k:config!ns:spinnaker");
        assert_eq!(SecretRef::parse(&file), Some(Ok(secret)));
        let own = SecretRef::parse("encryptedFile:k8s!n:k").unwrap().unwrap();
        assert_eq!(
            (own.namespace.as_str(), own.key.as_str()),
            ("", DEFAULT_SECRET_KEY)
        );
        assert_eq!(SecretRef::parse("/etc/kubeconfig"), None);
        let err = SecretRef::parse("encryptedFile:k8s!x:y")
            .unwrap()
            .unwrap_err();
        assert!(err.contains("n:<secret>"), "{err}");
        let err = SecretRef::parse("encryptedFile:k8s!k:a")
            .unwrap()
            .unwrap_err();
        assert!(err.contains("names no Secret"), "{err}");
    }

    #[test]
    fn fingerprint_is_lowercase_hex_sha256() {
        assert_eq!(
            fingerprint(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn impersonation_sends_the_service_account_user_and_no_groups() {
        let mut account = AccountConfig {
            name: "prod".into(),
            ..Default::default()
        };
        let config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(impersonating(&account, &config).is_none());
        account.impersonate_service_account = Some(scale_agent_crds::v1alpha1::ServiceAccountRef {
            namespace: "team-a".into(),
            name: "deployer".into(),
        });
        let impersonating = impersonating(&account, &config).unwrap();
        assert_eq!(
            impersonating.auth_info.impersonate.as_deref(),
            Some("system:serviceaccount:team-a:deployer")
        );
        assert!(impersonating.auth_info.impersonate_groups.is_none());
    }

    #[tokio::test]
    async fn an_account_without_credentials_says_what_to_set() {
        let account = AccountConfig {
            name: "prod".into(),
            ..Default::default()
        };
        let err = kube_config(&account)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("serviceAccount: true"), "{err}");
    }

    #[tokio::test]
    async fn kubeconfig_file_and_context_are_used_and_fingerprinted() {
        let dir = std::env::temp_dir().join(format!("scale-agent-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, cert.cert.pem()).unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: {}\n- name: b\n  cluster:\n    server: https://10.0.0.2:443/\ncontexts:\n- name: a\n  context: {{cluster: a, user: u}}\n- name: b\n  context: {{cluster: b, user: u}}\ncurrent-context: a\nusers:\n- name: u\n  user:\n    token: abc\n",
            ca_path.display()
        );
        let path = dir.join("kubeconfig");
        std::fs::write(&path, kubeconfig).unwrap();
        let mut account = AccountConfig {
            name: "prod".into(),
            kubeconfig_file: Some(path.display().to_string()),
            ..Default::default()
        };
        let config = kube_config(&account).await.unwrap();
        assert_eq!(api_server_host(&config), "https://127.0.0.1:6443");
        let der = config.root_cert.as_ref().unwrap()[0].clone();
        assert_eq!(der, cert.cert.der().to_vec());
        account.context = Some("b".into());
        let config = kube_config(&account).await.unwrap();
        assert!(api_server_host(&config).starts_with("https://10.0.0.2"));
        account.kubeconfig_file = Some(dir.join("missing").display().to_string());
        let err = kube_config(&account)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("cannot load kubeconfig"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
