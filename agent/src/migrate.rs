//! `scale-agent migrate`: turns an Armory agent's `armory-agent.yml` (with its local overlay,
//! and optionally the Kubernetes manifests that run it) into the `ScaleAgent` and
//! `AgentAccount` resources that reproduce it, with a YAML comment for every setting that has
//! no equivalent. Reading files is [`read_input`]; everything else is pure.

use std::path::PathBuf;

use scale_agent_crds::{AgentAccount, ScaleAgent, agent_config::AgentConfig, v1alpha1::Mode};
use serde_json::Value;

use crate::config_armory::{self, Verdict};
use crate::error::{Error, Result};

mod account;
mod differences;
mod input;
mod render;
mod scale_agent;

use account::agent_account;
use scale_agent::scale_agent_spec;

pub use differences::differences;
pub use input::{parse_input, read_input};
pub use render::render;

/// Where the resources go.
#[derive(Clone, Debug)]
pub struct MigrateOptions {
    /// Name of the ScaleAgent (the AgentAccounts' `agentRef`).
    pub name: String,
    /// Namespace of every resource; else the Armory manifests' namespace; else none (kubectl's).
    pub namespace: Option<String>,
    /// The hub's gRPC address; else Armory's `clouddriver.grpc`.
    pub hub_address: Option<String>,
}

/// What was read from Armory's files.
#[derive(Clone, Debug, Default)]
pub struct ArmoryInput {
    /// The agent config, the overlay merged in (`null` when none was given).
    pub config: Value,
    /// Where the config came from, for the output's header.
    pub sources: Vec<String>,
    /// The agent's Deployment, when given.
    pub deployment: Option<Value>,
    /// ClusterRoles and Roles given (the agent's RBAC).
    pub roles: Vec<Value>,
    /// Namespace of the manifests given.
    pub namespace: Option<String>,
    /// Manifests not carried over, as `Kind name`.
    pub skipped: Vec<String>,
}

/// The resources that reproduce the Armory agent, and what could not be carried over.
#[derive(Clone, Debug)]
pub struct Migration {
    pub scale_agent: ScaleAgent,
    /// Settings of the agent with no equivalent, one line each.
    pub agent_notes: Vec<String>,
    /// Each account, with its own notes.
    pub accounts: Vec<(AgentAccount, Vec<String>)>,
    /// Where the config came from.
    pub sources: Vec<String>,
}

/// A name as a lowercase DNS label (what AgentAccount names must be): lowercase, other
/// characters as `-`, at most 63.
pub fn dns_label(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    let mut label: String = trimmed.chars().take(63).collect();
    while label.ends_with('-') {
        label.pop();
    }
    label
}

/// Seconds of a duration, at least 1, rounded up (the CRD counts whole seconds).
fn whole_seconds(duration: std::time::Duration) -> i32 {
    let seconds = duration.as_millis().div_ceil(1000).max(1);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

/// A list budget: Armory's 0 (no limit) has no ScaleAgent spelling but the largest limit.
fn budget(limit: u32) -> i32 {
    match limit {
        0 => i32::MAX,
        limit => i32::try_from(limit).unwrap_or(i32::MAX),
    }
}

/// Turns what was read into resources.
pub fn migrate(input: &ArmoryInput, options: &MigrateOptions) -> Result<Migration> {
    let invalid = |message: String| Error::ParseConfig {
        path: PathBuf::from(input.sources.first().map_or("(no config)", String::as_str)),
        message,
    };
    let (config, unknown) = AgentConfig::from_value_reporting_unknown(input.config.clone())
        .map_err(|e| invalid(e.to_string()))?;
    let namespace = options.namespace.clone().or(input.namespace.clone());
    let mut agent_notes = Vec::new();
    let mut account_notes: Vec<Vec<String>> = vec![Vec::new(); config.kubernetes.accounts.len()];
    // Notes found in the config go to the account they are about, else to the ScaleAgent.
    let mut note = |path: &str, text: String| {
        let index = path
            .strip_prefix("kubernetes.accounts[")
            .and_then(|rest| rest.split(']').next())
            .and_then(|i| i.parse::<usize>().ok());
        match index.and_then(|i| account_notes.get_mut(i)) {
            Some(notes) => notes.push(text),
            None => agent_notes.push(text),
        }
    };
    for notice in config_armory::check(&input.config) {
        let what = match notice.verdict {
            Verdict::Refused => "not supported",
            Verdict::NoEffect => "no effect",
        };
        note(
            &notice.path,
            format!("{}: {what}: {}", notice.path, notice.message),
        );
    }
    for key in unknown
        .iter()
        .filter(|key| !config_armory::covers(&key.path))
    {
        note(
            &key.path,
            format!("{key}: not a Scale Agent setting; not carried over"),
        );
    }

    let spec = scale_agent_spec(&config, input, options, &mut agent_notes);
    let spec_mode = spec.mode;
    let mut scale_agent = ScaleAgent::new(&options.name, spec);
    scale_agent.metadata.namespace = namespace.clone();

    let mut accounts = Vec::new();
    for (account, mut notes) in config.kubernetes.accounts.iter().zip(account_notes) {
        let resource = agent_account(account, input, options, &mut notes);
        if spec_mode == Mode::Infrastructure && account.kubeconfig_file.is_none() {
            notes.push("serviceAccount: true, but this ScaleAgent serves kubeconfig accounts (mode Infrastructure), for which the operator accepts only kubeconfig credentials: serve this account from a ScaleAgent in mode Agent in the cluster it reads".into());
        }
        let mut resource = AgentAccount::new(&dns_label(&account.name), resource);
        resource.metadata.namespace = namespace.clone();
        accounts.push((resource, notes));
    }
    for skipped in &input.skipped {
        agent_notes.push(format!(
            "{skipped}: not carried over; the operator makes the agent's ServiceAccount, RBAC, config and Deployment"
        ));
    }
    Ok(Migration {
        scale_agent,
        agent_notes,
        accounts,
        sources: input.sources.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> MigrateOptions {
        MigrateOptions {
            name: "armory".into(),
            namespace: Some("spinnaker".into()),
            hub_address: None,
        }
    }

    #[test]
    fn names_become_dns_labels() {
        assert_eq!(dns_label("agentAccount"), "agentaccount");
        assert_eq!(dns_label("my_k8s.account-"), "my-k8s-account");
        assert_eq!(dns_label(&"a".repeat(70)).len(), 63);
    }

    #[test]
    fn the_overlay_wins_key_by_key_and_replaces_lists() {
        let input = parse_input(&[
            (
                PathBuf::from("armory-agent.yml"),
                "clouddriver:\n  grpc: a:9091\n  insecure: true\nkubernetes:\n  accounts:\n    - name: one\n      serviceAccount: true\n".into(),
            ),
            (
                PathBuf::from("armory-agent-local.yml"),
                "clouddriver:\n  grpc: b:9091\nkubernetes:\n  accounts:\n    - name: two\n      kubeconfigFile: /kubeconfigfiles/two\n".into(),
            ),
        ])
        .unwrap();
        assert_eq!(input.config["clouddriver"]["grpc"], "b:9091");
        assert_eq!(input.config["clouddriver"]["insecure"], true);
        assert_eq!(input.config["kubernetes"]["accounts"][0]["name"], "two");
        let migration = migrate(&input, &options()).unwrap();
        assert_eq!(migration.accounts.len(), 1);
        assert_eq!(migration.scale_agent.spec.mode, Mode::Infrastructure);
        let (account, notes) = &migration.accounts[0];
        let secret = account
            .spec
            .credentials
            .kubeconfig_secret_ref
            .as_ref()
            .unwrap();
        assert_eq!(secret.name, "two-kubeconfig");
        assert!(notes.iter().any(|n| n.contains("kubectl create secret generic two-kubeconfig --from-file=kubeconfig=/kubeconfigfiles/two")), "{notes:#?}");
    }
}
