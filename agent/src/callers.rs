//! Who the account's cluster sees for a tunnelled request: the agent itself, or, for an
//! account with `callers: impersonate`, the person who called through the hub
//! (`Impersonate-User: <prefix><user>`, `Impersonate-Group: <prefix><group>`), so the
//! cluster's own RBAC decides and its audit log names the person.
//!
//! The hub says who called in the request head ([`pb::ProxyCaller`]); a hub that predates
//! the field sends none, and the request then runs as the agent, as before. Clouddriver's
//! machine token (`person: false`) always runs as the agent (its writes as the account's
//! `impersonateServiceAccount` when set). A person is admitted when their user is in
//! `callerUsers` (`*`: everyone) or one of their groups is in `callerGroups`, names as the
//! hub knows them (before `callerPrefix`). A person the account does not admit is refused by
//! the agent: running them as the agent would give them more than the account meant to.

use scale_agent_crds::{
    agent_config::AccountConfig,
    v1alpha1::{ANY_CALLER, Callers, DEFAULT_CALLER_PREFIX},
};
use scale_agent_proto::v1 as pb;

/// The identity a request is replayed as, names already prefixed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Impersonation {
    pub user: String,
    pub groups: Vec<String>,
}

impl Impersonation {
    /// The headers that ask the API server to act as this identity.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        std::iter::once(("Impersonate-User", self.user.as_str())).chain(
            self.groups
                .iter()
                .map(|group| ("Impersonate-Group", group.as_str())),
        )
    }
}

/// Whom a tunnelled request runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acting {
    /// The agent (its writes as `impersonateServiceAccount` when set): today's behaviour.
    Agent,
    /// The calling person.
    Person(Impersonation),
    /// Refused by the agent with a 403 and this message.
    Refused(String),
}

/// Whom a request to `account` from `caller` runs as.
pub fn acting(account: &AccountConfig, caller: Option<&pb::ProxyCaller>) -> Acting {
    if account.callers != Callers::Impersonate {
        return Acting::Agent;
    }
    let Some(caller) = caller.filter(|c| c.person) else {
        return Acting::Agent;
    };
    let admitted_user = account
        .caller_users
        .iter()
        .any(|u| u == ANY_CALLER || *u == caller.user);
    let admitted_group = caller
        .groups
        .iter()
        .any(|g| account.caller_groups.contains(g));
    if !admitted_user && !admitted_group {
        return Acting::Refused(format!(
            "{:?} (groups {:?}) may not use account {:?} through the Scale Agent hub: the \
             account impersonates its callers and admits only the users {:?} (its \
             AgentAccount's callerUsers) and the members of the groups {:?} (callerGroups)",
            caller.user, caller.groups, account.name, account.caller_users, account.caller_groups
        ));
    }
    let prefix = account
        .caller_prefix
        .as_deref()
        .unwrap_or(DEFAULT_CALLER_PREFIX);
    // The CRD's pattern, for configs written by hand: any other prefix could name the
    // cluster's own users and groups.
    let tail = prefix
        .strip_prefix("scale-agent")
        .and_then(|t| t.strip_suffix(':'));
    if !tail.is_some_and(|t| {
        t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    }) {
        return Acting::Refused(format!(
            "account {:?} has callerPrefix {prefix:?}, which must start with `scale-agent` and \
             end with `:` (e.g. `scale-agent:`) so that no caller is impersonated as one of the \
             cluster's own users or groups: fix the agent's config",
            account.name
        ));
    }
    Acting::Person(Impersonation {
        user: format!("{prefix}{}", caller.user),
        groups: caller
            .groups
            .iter()
            .filter(|g| account.caller_groups.contains(g))
            .map(|g| format!("{prefix}{g}"))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(user: &str, groups: &[&str], person: bool) -> pb::ProxyCaller {
        pb::ProxyCaller {
            user: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            person,
        }
    }

    fn impersonating(users: &[&str], groups: &[&str]) -> AccountConfig {
        AccountConfig {
            name: "prod".into(),
            callers: Callers::Impersonate,
            caller_users: users.iter().map(|u| u.to_string()).collect(),
            caller_groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn callers_agent_and_machine_tokens_act_as_the_agent() {
        let alice = caller("alice", &["team-a"], true);
        assert_eq!(
            acting(&AccountConfig::default(), Some(&alice)),
            Acting::Agent
        );
        let account = impersonating(&["alice"], &[]);
        let clouddriver = caller("clouddriver", &[], false);
        assert_eq!(acting(&account, Some(&clouddriver)), Acting::Agent);
        assert_eq!(acting(&account, None), Acting::Agent);
    }

    #[test]
    fn a_person_is_impersonated_prefixed_with_only_the_admitted_groups() {
        let account = impersonating(&["alice"], &["team-a"]);
        let alice = caller("alice", &["team-a", "system:masters"], true);
        let Acting::Person(identity) = acting(&account, Some(&alice)) else {
            panic!("alice is admitted");
        };
        assert_eq!(identity.user, "scale-agent:alice");
        assert_eq!(identity.groups, ["scale-agent:team-a"]);
        let headers: Vec<_> = identity.headers().collect();
        assert_eq!(
            headers,
            [
                ("Impersonate-User", "scale-agent:alice"),
                ("Impersonate-Group", "scale-agent:team-a")
            ]
        );
        let custom = AccountConfig {
            caller_prefix: Some("scale-agent-prod:".into()),
            ..account.clone()
        };
        let Acting::Person(identity) = acting(&custom, Some(&alice)) else {
            panic!("alice is admitted");
        };
        assert_eq!(identity.user, "scale-agent-prod:alice");
        for prefix in ["system:", "", "scale-agent", "scale-agent:x:"] {
            let unsafe_prefix = AccountConfig {
                caller_prefix: Some(prefix.into()),
                ..account.clone()
            };
            assert!(
                matches!(acting(&unsafe_prefix, Some(&alice)), Acting::Refused(_)),
                "{prefix:?}"
            );
        }
    }

    #[test]
    fn a_person_not_admitted_is_refused_and_star_admits_everyone() {
        let bob = caller("bob", &[], true);
        let Acting::Refused(message) = acting(&impersonating(&["alice"], &[]), Some(&bob)) else {
            panic!("bob is not admitted");
        };
        assert!(message.contains("callerUsers"), "{message}");
        assert!(matches!(
            acting(&impersonating(&["*"], &[]), Some(&bob)),
            Acting::Person(_)
        ));
    }

    #[test]
    fn a_person_is_admitted_by_group_alone() {
        let account = impersonating(&[], &["team-a"]);
        let carol = caller("carol", &["team-b", "team-a"], true);
        let Acting::Person(identity) = acting(&account, Some(&carol)) else {
            panic!("carol is admitted by team-a");
        };
        assert_eq!(identity.user, "scale-agent:carol");
        assert_eq!(identity.groups, ["scale-agent:team-a"]);
        // Another group, or a group only as a prefix of a listed one, admits nobody.
        for groups in [&["team-b"][..], &["team"], &[]] {
            let dave = caller("dave", groups, true);
            let Acting::Refused(message) = acting(&account, Some(&dave)) else {
                panic!("dave in {groups:?} is not admitted");
            };
            assert!(message.contains("callerGroups"), "{message}");
            assert!(message.contains("\"dave\""), "{message}");
        }
        // A machine token in the group still acts as the agent.
        let machine = caller("clouddriver", &["team-a"], false);
        assert_eq!(acting(&account, Some(&machine)), Acting::Agent);
    }

    fn header(name: &str, value: &str) -> pb::HttpHeader {
        pb::HttpHeader {
            name: name.into(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_agent_adds_its_own_identity_and_the_hubs_audit_id() {
        let head = pb::HttpRequestHead {
            account: "a".into(),
            method: "GET".into(),
            path_and_query: "/api/v1/namespaces/x/pods".into(),
            headers: vec![
                header("Impersonate-User", "admin"),
                header("Impersonate-Group", "system:masters"),
                header("Audit-ID", "made-up-by-the-client"),
            ],
            end_of_body: true,
            audit_id: "hub-request-1".into(),
            ..Default::default()
        };
        let identity = Impersonation {
            user: "scale-agent:alice".into(),
            groups: vec!["scale-agent:team-a".into()],
        };
        let request =
            crate::tunnel::build_request(&head, bytes::Bytes::new(), Some(&identity)).unwrap();
        let values = |name: &str| -> Vec<&str> {
            request
                .headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(values("impersonate-user"), ["scale-agent:alice"]);
        assert_eq!(values("impersonate-group"), ["scale-agent:team-a"]);
        assert_eq!(values("audit-id"), ["hub-request-1"]);
        // Without the hub's id, a client's Audit-ID passes as before; without an identity,
        // no Impersonate-* header at all.
        let as_agent = pb::HttpRequestHead {
            audit_id: String::new(),
            ..head
        };
        let request = crate::tunnel::build_request(&as_agent, bytes::Bytes::new(), None).unwrap();
        let names: Vec<&str> = request.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["audit-id"]);
    }
}
