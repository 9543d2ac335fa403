//! The right to impersonate the people an account admits (`callers: impersonate`): a
//! ClusterRole and ClusterRoleBinding `scale-agent:<namespace>:<scaleagent>:callers` giving
//! the agent's ServiceAccount `impersonate` on exactly the prefixed users and groups its
//! accounts list, and nothing else.
//!
//! Why this is the least grant: users and groups are cluster-scoped in the API server's
//! impersonation check (no namespace), so a Role cannot hold it; RBAC matches
//! `resourceNames` exactly and has no prefixes, so the names are listed one by one
//! (`<callerPrefix><user>`, `<callerPrefix><group>`). Only `callerUsers: ["*"]` and
//! `callerGroups` need the rule on users without `resourceNames` (every user name; never
//! groups, which are always listed): a group admits its members, whose user names the
//! operator cannot know, and the API server checks `impersonate` on the user name too. The
//! agent still only ever sends `<callerPrefix><user>` of a person it admits.
//! The API server adds `system:authenticated` to an impersonated user itself, without a
//! grant. Accounts with kubeconfig credentials impersonate with that identity, which is the
//! other cluster's business, as for `impersonateServiceAccount`.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    v1alpha1::{ANY_CALLER, Callers, CredentialsType, DEFAULT_CALLER_PREFIX},
};

use super::{
    rbac::{cluster_meta, subject},
    rbac_name,
};

/// Name of the ClusterRole(Binding): `scale-agent:<namespace>:<scaleagent>:callers`.
pub fn callers_rbac_name(agent: &ScaleAgent) -> String {
    format!("{}:callers", rbac_name(agent))
}

/// Whom the accounts of an agent let it impersonate, names prefixed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Admitted {
    /// Every user name (an account lists `*`, or admits the members of `callerGroups`).
    pub any_user: bool,
    pub users: BTreeSet<String>,
    pub groups: BTreeSet<String>,
}

impl Admitted {
    pub fn is_empty(&self) -> bool {
        !self.any_user && self.users.is_empty() && self.groups.is_empty()
    }
}

/// The people the accounts of an agent in `Agent` mode admit, over the accounts that
/// impersonate their callers with the agent's own ServiceAccount.
pub fn admitted(accounts: &[&AgentAccount]) -> Admitted {
    let mut admitted = Admitted::default();
    for account in accounts {
        let spec = &account.spec;
        if spec.callers != Callers::Impersonate
            || spec.credentials.type_ != CredentialsType::ServiceAccount
        {
            continue;
        }
        let prefix = spec
            .caller_prefix
            .as_deref()
            .unwrap_or(DEFAULT_CALLER_PREFIX);
        for user in &spec.caller_users {
            if user == ANY_CALLER {
                admitted.any_user = true;
            } else {
                admitted.users.insert(format!("{prefix}{user}"));
            }
        }
        if !spec.caller_groups.is_empty() {
            // The members of these groups are admitted under their own user names.
            admitted.any_user = true;
        }
        admitted
            .groups
            .extend(spec.caller_groups.iter().map(|g| format!("{prefix}{g}")));
    }
    admitted
}

/// The ClusterRole and its binding to the agent granting `impersonate` on `admitted`;
/// `None` when no account admits anyone (then neither should exist).
pub fn callers_rbac(
    agent: &ScaleAgent,
    admitted: &Admitted,
) -> Option<(ClusterRole, ClusterRoleBinding)> {
    if admitted.is_empty() {
        return None;
    }
    let rule = |resource: &str, names: Option<&BTreeSet<String>>| PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec![resource.into()]),
        verbs: vec!["impersonate".into()],
        resource_names: names.map(|n| n.iter().cloned().collect()),
        ..Default::default()
    };
    let mut rules = vec![rule(
        "users",
        (!admitted.any_user).then_some(&admitted.users),
    )];
    if !admitted.groups.is_empty() {
        rules.push(rule("groups", Some(&admitted.groups)));
    }
    let name = callers_rbac_name(agent);
    let mut meta = cluster_meta(agent);
    meta.name = Some(name.clone());
    let role = ClusterRole {
        metadata: meta.clone(),
        rules: Some(rules),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name,
        },
        subjects: Some(vec![subject(agent)]),
    };
    Some((role, binding))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{account, agent, kubeconfig_account};

    fn impersonating(
        name: &str,
        prefix: Option<&str>,
        users: &[&str],
        groups: &[&str],
    ) -> AgentAccount {
        let mut a = account(name, "prod");
        a.spec.callers = Callers::Impersonate;
        a.spec.caller_prefix = prefix.map(str::to_string);
        a.spec.caller_users = users.iter().map(|u| u.to_string()).collect();
        a.spec.caller_groups = groups.iter().map(|g| g.to_string()).collect();
        a
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exactly_the_prefixed_users_and_groups_the_accounts_admit() {
        let a = impersonating("a", None, &["alice"], &[]);
        let b = impersonating("b", Some("scale-agent-b:"), &["bob"], &[]);
        let mut as_agent = account("c", "prod");
        as_agent.spec.caller_users = strings(&["carol"]);
        let mut kubeconfig = kubeconfig_account("d", "prod", "k");
        kubeconfig.spec.callers = Callers::Impersonate;
        kubeconfig.spec.caller_users = strings(&["dan"]);
        let admitted = admitted(&[&a, &b, &as_agent, &kubeconfig]);
        let (role, binding) = callers_rbac(&agent("prod"), &admitted).unwrap();
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("scale-agent:ns:prod:callers")
        );
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1, "{rules:?}");
        assert_eq!(rules[0].resources, Some(strings(&["users"])));
        assert_eq!(
            rules[0].resource_names,
            Some(strings(&["scale-agent-b:bob", "scale-agent:alice"]))
        );
        for rule in &rules {
            assert_eq!(rule.verbs, ["impersonate"]);
            assert_eq!(rule.api_groups, Some(strings(&[""])));
        }
        assert_eq!(binding.role_ref.name, "scale-agent:ns:prod:callers");
        assert_eq!(binding.subjects.unwrap()[0].name, "prod-agent");
    }

    #[test]
    fn nobody_admitted_grants_nothing_and_star_grants_every_user_only() {
        let plain = account("plain", "prod");
        assert!(callers_rbac(&agent("prod"), &admitted(&[&plain])).is_none());
        let star = impersonating("star", None, &["*"], &[]);
        let (role, _) = callers_rbac(&agent("prod"), &admitted(&[&star])).unwrap();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1, "no groups listed, none granted: {rules:?}");
        assert_eq!(rules[0].resource_names, None);
    }

    #[test]
    fn admitting_by_group_grants_the_listed_groups_and_every_user_name() {
        let a = impersonating("a", None, &["alice"], &["team-a"]);
        let by_group = impersonating("b", Some("scale-agent-b:"), &[], &["team-b"]);
        let (role, _) = callers_rbac(&agent("prod"), &admitted(&[&a, &by_group])).unwrap();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(rules[0].resources, Some(strings(&["users"])));
        assert_eq!(
            rules[0].resource_names, None,
            "the members of team-a and team-b, whoever they are"
        );
        assert_eq!(rules[1].resources, Some(strings(&["groups"])));
        assert_eq!(
            rules[1].resource_names,
            Some(strings(&["scale-agent-b:team-b", "scale-agent:team-a"]))
        );
    }
}
