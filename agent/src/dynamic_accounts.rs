//! Dynamic accounts: accounts the hub pushes (item 12 of the stream contract), served as if
//! they were in the config file.
//!
//! The hub sends the whole set of this agent identity's dynamic accounts on every stream and
//! whenever it changes. Each becomes an account of the config the runtime applies (the
//! file's accounts plus the pushed ones), so adding, changing and removing one is the same
//! hot reload as a config change. An account of the same name in the file wins; the pushed
//! one is reported `OVERRIDDEN`.
//!
//! A pushed account's kubeconfig lives in a Secret of this agent's cluster, read with the
//! agent's own credentials when the account's credentials are loaded (and on each retry).
//! Its `kubeconfigFile` names the Secret the way Spinnaker's Kubernetes secret engine does:
//! `encryptedFile:k8s!n:<secret>!k:<key>`, with `!ns:<namespace>` when the Secret is not in
//! the agent's own namespace. The same form works in the config file.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, config::Kubeconfig};
use scale_agent_crds::agent_config::{AccountConfig, AgentConfig};
use scale_agent_proto::v1::{self, dynamic_account_status::State};

use crate::state::{AgentView, ROLE_REJECTED, ROLE_STANDBY, ROLE_STREAMING};

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
        let config = crate::account::own_cluster_config(false)
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
            return Err(format!(
                "Secret {namespace}/{} has no key {:?} (it has {:?}): put the kubeconfig \
                 under that key, or name the right one",
                self.name,
                self.key,
                data.keys().collect::<Vec<_>>()
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

/// The account a pushed one becomes: its settings, its name, the Secret as credentials.
pub fn account_config(pushed: &v1::DynamicAccount) -> Result<AccountConfig, String> {
    let mut account: AccountConfig = if pushed.settings_json.is_empty() {
        AccountConfig::default()
    } else {
        serde_json::from_slice(&pushed.settings_json)
            .map_err(|e| format!("the hub sent settings this agent cannot read: {e}"))?
    };
    let secret = pushed.kubeconfig_secret.clone().unwrap_or_default();
    account.name = pushed.account.clone();
    account.service_account = false;
    account.agent_account = None;
    account.kubeconfig_file = Some(
        SecretRef {
            namespace: secret.namespace,
            name: secret.name,
            key: if secret.key.is_empty() {
                DEFAULT_SECRET_KEY.into()
            } else {
                secret.key
            },
        }
        .to_kubeconfig_file(),
    );
    account.context = (!pushed.context.is_empty()).then(|| pushed.context.clone());
    Ok(account)
}

/// The accounts the hub pushed, and what was last reported about each on this stream.
#[derive(Debug, Default)]
pub struct DynamicAccounts {
    /// Usable accounts, by name.
    pushed: BTreeMap<String, AccountConfig>,
    /// Pushed accounts this agent could not read, with why.
    unreadable: BTreeMap<String, String>,
    reported: BTreeMap<String, (State, String)>,
}

impl DynamicAccounts {
    /// Takes the hub's new set in place of the old one.
    pub fn replace(&mut self, set: v1::DynamicAccounts) {
        self.pushed.clear();
        self.unreadable.clear();
        for pushed in set.accounts {
            match account_config(&pushed) {
                Ok(account) => {
                    self.pushed.insert(account.name.clone(), account);
                }
                Err(error) => {
                    self.unreadable.insert(pushed.account, error);
                }
            }
        }
        let names: Vec<&String> = self.pushed.keys().collect();
        tracing::info!(accounts = ?names, "dynamic accounts from the hub");
    }

    /// A new stream: everything is reported again.
    pub fn stream_started(&mut self) {
        self.reported.clear();
    }

    /// The file's config plus the pushed accounts the file does not have.
    pub fn merged(&self, file: &Arc<AgentConfig>) -> Arc<AgentConfig> {
        let extra: Vec<&AccountConfig> = self
            .pushed
            .values()
            .filter(|pushed| !in_file(file, &pushed.name))
            .collect();
        if extra.is_empty() {
            return file.clone();
        }
        let mut merged = (**file).clone();
        merged
            .kubernetes
            .accounts
            .extend(extra.into_iter().cloned());
        Arc::new(merged)
    }

    /// Each pushed account's state now.
    pub fn statuses(&self, file: &AgentConfig, view: &AgentView) -> Vec<v1::DynamicAccountStatus> {
        let status = |account: &str, state: State, message: String| v1::DynamicAccountStatus {
            account: account.to_string(),
            state: state as i32,
            message,
        };
        let mut statuses: Vec<v1::DynamicAccountStatus> = self
            .unreadable
            .iter()
            .map(|(name, error)| status(name, State::Failed, error.clone()))
            .collect();
        for name in self.pushed.keys() {
            if in_file(file, name) {
                statuses.push(status(
                    name,
                    State::Overridden,
                    format!(
                        "account {name:?} is in this agent's own config (kubernetes.accounts, or \
                         an AgentAccount), which wins over the account the hub pushed: remove it \
                         there to serve the pushed one, or delete the dynamic account"
                    ),
                ));
                continue;
            }
            let Some(account) = view.account(name) else {
                statuses.push(status(name, State::Loading, String::new()));
                continue;
            };
            let (state, message) = match (&account.error, account.role.as_str()) {
                (Some(error), _) => (State::Failed, error.clone()),
                (None, ROLE_REJECTED) => (
                    State::Failed,
                    format!(
                        "the hub rejected it: {}",
                        account
                            .rejection_reason
                            .as_deref()
                            .unwrap_or("no reason given")
                    ),
                ),
                (None, ROLE_STREAMING) => (
                    State::Registered,
                    format!("replica {} streams it", view.replica),
                ),
                (None, ROLE_STANDBY) => (
                    State::Registered,
                    format!("replica {} is on standby for it", view.replica),
                ),
                (None, _) => (
                    State::Loading,
                    "loading its credentials or registering".into(),
                ),
            };
            statuses.push(status(name, state, message));
        }
        statuses
    }

    /// The statuses that changed since last reported on this stream, marked as reported.
    pub fn changed(
        &mut self,
        file: &AgentConfig,
        view: &AgentView,
    ) -> Vec<v1::DynamicAccountStatus> {
        let statuses = self.statuses(file, view);
        let mut changed = Vec::new();
        for status in statuses {
            let state = State::try_from(status.state).unwrap_or(State::Unspecified);
            let now = (state, status.message.clone());
            if self.reported.get(&status.account) != Some(&now) {
                self.reported.insert(status.account.clone(), now);
                changed.push(status);
            }
        }
        changed
    }
}

fn in_file(file: &AgentConfig, name: &str) -> bool {
    file.kubernetes.accounts.iter().any(|a| a.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::AccountView;

    fn pushed(name: &str) -> v1::DynamicAccount {
        v1::DynamicAccount {
            account: name.into(),
            settings_json: br#"{"kinds": ["ConfigMap"], "namespaces": ["team-a"], "omitNamespaces": [], "permissions": {}}"#.to_vec(),
            kubeconfig_secret: Some(v1::SecretKeySelector {
                namespace: "spinnaker".into(),
                name: "dyn-kubeconfig".into(),
                key: String::new(),
            }),
            context: "ctx".into(),
        }
    }

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
    fn a_pushed_account_becomes_an_account_reading_its_secret() {
        let account = account_config(&pushed("dyn")).unwrap();
        assert_eq!(account.name, "dyn");
        assert_eq!(account.kinds, vec!["ConfigMap".to_string()]);
        assert_eq!(account.namespaces, vec!["team-a".to_string()]);
        assert_eq!(account.context.as_deref(), Some("ctx"));
        assert!(!account.service_account);
        assert_eq!(
            account.kubeconfig_file.as_deref(),
            Some("encryptedFile:k8s!n:dyn-kubeconfig!k:kubeconfig!ns:spinnaker")
        );
        let mut bad = pushed("bad");
        bad.settings_json = b"[".to_vec();
        assert!(account_config(&bad).unwrap_err().contains("settings"));
    }

    #[test]
    fn the_file_wins_and_each_state_is_reported_once() {
        let mut file = AgentConfig::default();
        file.kubernetes.accounts.push(AccountConfig {
            name: "static".into(),
            service_account: true,
            ..Default::default()
        });
        let file = Arc::new(file);
        let mut dynamic = DynamicAccounts::default();
        let mut bad = pushed("bad");
        bad.settings_json = b"[".to_vec();
        dynamic.replace(v1::DynamicAccounts {
            accounts: vec![pushed("static"), pushed("dyn"), bad],
        });
        let merged = dynamic.merged(&file);
        let names: Vec<&str> = merged
            .kubernetes
            .accounts
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(names, ["static", "dyn"]);
        assert!(merged.kubernetes.accounts[0].service_account, "the file's");

        let mut view = AgentView {
            replica: "pod-a".into(),
            ..Default::default()
        };
        let state_of = |statuses: &[v1::DynamicAccountStatus], name: &str| {
            statuses
                .iter()
                .find(|s| s.account == name)
                .map(|s| (State::try_from(s.state).unwrap(), s.message.clone()))
        };
        let first = dynamic.changed(&file, &view);
        assert_eq!(first.len(), 3);
        let (state, message) = state_of(&first, "static").unwrap();
        assert_eq!(state, State::Overridden);
        assert!(message.contains("own config"), "{message}");
        assert_eq!(state_of(&first, "dyn").unwrap().0, State::Loading);
        assert_eq!(state_of(&first, "bad").unwrap().0, State::Failed);
        assert!(dynamic.changed(&file, &view).is_empty(), "reported once");

        let mut account = AccountView::new("dyn");
        account.error = Some("Secret spinnaker/dyn-kubeconfig does not exist".into());
        view.accounts.push(account);
        let failed = dynamic.changed(&file, &view);
        assert_eq!(failed.len(), 1);
        assert_eq!(
            state_of(&failed, "dyn"),
            Some((
                State::Failed,
                "Secret spinnaker/dyn-kubeconfig does not exist".into()
            ))
        );
        view.accounts[0].error = None;
        view.accounts[0].role = ROLE_STREAMING.into();
        assert_eq!(
            state_of(&dynamic.changed(&file, &view), "dyn").unwrap().0,
            State::Registered
        );
        dynamic.stream_started();
        assert_eq!(
            dynamic.changed(&file, &view).len(),
            3,
            "a new stream hears all"
        );
    }
}
