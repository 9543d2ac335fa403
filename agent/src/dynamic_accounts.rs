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
//! the agent's own namespace ([`SecretRef`], which `account` reads). The same form works in
//! the config file.
//!
//! Off unless the agent's own config says `dynamicAccounts.enabled: true`, and then only for
//! the Secrets its `dynamicAccounts.kubeconfigSecrets` lists: otherwise whoever can push
//! accounts (a hub admin, a stolen admin token, a compromised hub) could make the agent load
//! any kubeconfig Secret its ServiceAccount can read (issue 28, F13). A refused account is
//! reported `FAILED` with the reason and never read. The file's current setting is applied
//! to every merge, so turning it off stops serving pushed accounts at the next reload.

use std::{collections::BTreeMap, sync::Arc};

use scale_agent_crds::agent_config::{AccountConfig, AgentConfig, DynamicAccountsConfig};
use scale_agent_proto::v1::{self, dynamic_account_status::State};

use crate::{
    account::{DEFAULT_SECRET_KEY, SecretRef},
    state::{AgentView, ROLE_REJECTED, ROLE_STANDBY, ROLE_STREAMING},
};

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
            .filter(|pushed| refusal(&file.dynamic_accounts, pushed).is_none())
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
            if let Some(refused) = self
                .pushed
                .get(name)
                .and_then(|pushed| refusal(&file.dynamic_accounts, pushed))
            {
                statuses.push(status(name, State::Failed, refused));
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

/// Why the agent's `settings` refuse pushed `account`, if they do; checked before its Secret
/// is read.
pub fn refusal(settings: &DynamicAccountsConfig, account: &AccountConfig) -> Option<String> {
    if !settings.enabled {
        return Some(format!(
            "dynamic accounts are off on this agent: its config must set \
             dynamicAccounts.enabled: true (and list the Secret in \
             dynamicAccounts.kubeconfigSecrets) to serve account {:?}",
            account.name
        ));
    }
    let secret = account
        .kubeconfig_file
        .as_deref()
        .and_then(SecretRef::parse)
        .and_then(Result::ok)?;
    if settings.allows_secret(&secret.namespace, &secret.name) {
        return None;
    }
    let named = if secret.namespace.is_empty() {
        secret.name.clone()
    } else {
        format!("{}/{}", secret.namespace, secret.name)
    };
    Some(format!(
        "the hub named kubeconfig Secret {named} for account {:?}, which this agent's \
         dynamicAccounts.kubeconfigSecrets does not list: add {named} (or its namespace/*) \
         there to serve it, or have the hub name a listed Secret",
        account.name
    ))
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

    fn enabled_for(secrets: &[&str]) -> DynamicAccountsConfig {
        DynamicAccountsConfig {
            enabled: true,
            kubeconfig_secrets: secrets.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn pushed_accounts_need_the_opt_in_and_a_listed_secret() {
        let account = account_config(&pushed("dyn")).unwrap();
        let off = refusal(&DynamicAccountsConfig::default(), &account).unwrap();
        assert!(off.contains("dynamicAccounts.enabled: true"), "{off}");
        let unlisted = refusal(
            &enabled_for(&["spinnaker/other", "dyn-kubeconfig"]),
            &account,
        )
        .unwrap();
        assert!(
            unlisted.contains("Secret spinnaker/dyn-kubeconfig")
                && unlisted.contains("dynamicAccounts.kubeconfigSecrets does not list"),
            "{unlisted}"
        );
        for listed in ["spinnaker/dyn-kubeconfig", "spinnaker/*"] {
            assert_eq!(refusal(&enabled_for(&[listed]), &account), None, "{listed}");
        }
        // A bare name is a Secret of the agent's own namespace.
        let mut own = pushed("own");
        own.kubeconfig_secret.as_mut().unwrap().namespace = String::new();
        let own = account_config(&own).unwrap();
        assert_eq!(refusal(&enabled_for(&["dyn-kubeconfig"]), &own), None);
        assert!(refusal(&enabled_for(&["spinnaker/*"]), &own).is_some());

        // Refused accounts are not served, and say why.
        let file = AgentConfig {
            dynamic_accounts: enabled_for(&["spinnaker/other"]),
            ..Default::default()
        };
        let file = Arc::new(file);
        let mut dynamic = DynamicAccounts::default();
        dynamic.replace(v1::DynamicAccounts {
            accounts: vec![pushed("dyn")],
        });
        assert!(dynamic.merged(&file).kubernetes.accounts.is_empty());
        let statuses = dynamic.changed(&file, &AgentView::default());
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0].state, State::Failed as i32);
        assert!(
            statuses[0].message.contains("does not list"),
            "{}",
            statuses[0].message
        );
    }

    #[test]
    fn the_file_wins_and_each_state_is_reported_once() {
        let mut file = AgentConfig {
            dynamic_accounts: enabled_for(&["spinnaker/*"]),
            ..Default::default()
        };
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
