//! How the config the operator renders from the migrated resources differs from Armory's, in
//! what the agent does (the round-trip check of `e2e/tests/migrate.rs`).

use scale_agent_crds::agent_config::{AccountConfig, AgentConfig};

use super::{dns_label, whole_seconds};

/// How `rendered` (the config the operator renders from the migrated resources) differs
/// from the Armory config it came from, in what the agent does; empty when equivalent.
/// Account names compare as [`dns_label`]s and kubeconfig paths by presence (the operator
/// mounts Secrets at its own paths); settings noted as having no equivalent are skipped.
pub fn differences(armory: &AgentConfig, rendered: &AgentConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut differ = |what: &str, a: String, b: String| {
        if a != b {
            out.push(format!("{what}: {a} became {b}"));
        }
    };
    let (a, b) = (&armory.clouddriver, &rendered.clouddriver);
    differ(
        "clouddriver.grpc",
        a.grpc
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .into(),
        b.grpc.clone(),
    );
    differ(
        "plaintext",
        a.plaintext().to_string(),
        b.plaintext().to_string(),
    );
    differ(
        "tls.serverName",
        format!("{:?}", a.tls.server_name),
        format!("{:?}", b.tls.server_name),
    );
    differ(
        "backoff",
        format!(
            "{} {} {} {}",
            whole_seconds(a.backoff.base_delay),
            a.backoff.multiplier,
            a.backoff.jitter,
            whole_seconds(a.backoff.max_delay)
        ),
        format!(
            "{} {} {} {}",
            whole_seconds(b.backoff.base_delay),
            b.backoff.multiplier,
            b.backoff.jitter,
            whole_seconds(b.backoff.max_delay)
        ),
    );
    // Armory's 0 and the ScaleAgent's largest limit both mean no limit.
    let unlimited = |limit: u32| {
        if limit == 0 || limit >= i32::MAX as u32 {
            u32::MAX
        } else {
            limit
        }
    };
    let (ta, tb) = (&armory.tasks, &rendered.tasks);
    differ(
        "tasks",
        format!(
            "{} {}",
            unlimited(ta.total_budget),
            unlimited(ta.budget_per_account).min(unlimited(ta.total_budget))
        ),
        format!(
            "{} {}",
            unlimited(tb.total_budget),
            unlimited(tb.budget_per_account)
        ),
    );
    let mut armory_accounts: Vec<&AccountConfig> = armory.kubernetes.accounts.iter().collect();
    armory_accounts.sort_by_key(|a| dns_label(&a.name));
    let names = |accounts: &[&AccountConfig]| -> Vec<String> {
        accounts.iter().map(|a| dns_label(&a.name)).collect()
    };
    let rendered_accounts: Vec<&AccountConfig> = rendered.kubernetes.accounts.iter().collect();
    differ(
        "accounts",
        names(&armory_accounts).join(","),
        names(&rendered_accounts).join(","),
    );
    for (a, b) in armory_accounts.iter().zip(&rendered_accounts) {
        let name = &b.name;
        let key = |account: &AccountConfig| {
            let mut permissions = account.permissions.clone();
            for roles in permissions.values_mut() {
                *roles = roles.iter().map(|r| r.trim().to_owned()).collect();
            }
            let omit_kinds = if account.kinds.is_empty() {
                account.omit_kinds.clone()
            } else {
                Vec::new()
            };
            let crds: Vec<String> = account
                .custom_resource_definitions
                .iter()
                .map(|c| format!("{} {:?} {:?}", c.kind, c.version, c.scope))
                .collect();
            format!(
                "kubeconfig={} serviceAccount={} context={:?} namespaces={:?} kinds={:?} omitKinds={:?} onlyNamespaced={} crds={crds:?} metrics={} permissions={permissions:?}",
                account.kubeconfig_file.is_some(),
                account.kubeconfig_file.is_none(),
                account.context,
                account.namespaces,
                account.kinds,
                omit_kinds,
                account.only_namespaced_resources,
                account.metrics,
            )
        };
        differ(&format!("account {name}"), key(a), key(b));
    }
    out
}
