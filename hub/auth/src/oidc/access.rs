//! `--oidc-access`: which accounts a person signed in with OIDC may reach through the proxy,
//! and which role they get on the HTTP API. A YAML list of rules; a rule applies to a person
//! whose username matches one of its `users` or one of whose groups matches one of its
//! `groups` (names after the issuer's prefixes; `*` matches any run of characters):
//!
//! ```yaml
//! - groups: ["oidc:team-a"]
//!   accounts: ["team-a-*"]   # proxy: these accounts
//!   role: reader             # API: this role, on these accounts' routes (optional)
//! ```
//!
//! A person reaches an account when some rule that applies lists it; nothing is reached by
//! default. Their API role is the largest of the applying rules' roles, limited to the
//! accounts of the rules that grant one.

use scale_agent_hub_model::{auth::Role, identity::glob_match};
use serde::Deserialize;

use super::claims::Person;

/// One rule of the file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    /// Globs of the accounts it opens.
    pub accounts: Vec<String>,
    /// The HTTP API role it grants; `None`: none (proxy only).
    #[serde(default)]
    pub role: Option<Role>,
}

impl Rule {
    fn applies(&self, person: &Person) -> bool {
        self.users.iter().any(|u| glob_match(u, &person.user))
            || self
                .groups
                .iter()
                .any(|g| person.groups.iter().any(|have| glob_match(g, have)))
    }
}

/// The rules, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    rules: Vec<Rule>,
}

impl Access {
    /// Parses the file's text; errors name the rule at fault.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rules: Vec<Rule> = if text.trim().is_empty() {
            Vec::new()
        } else {
            serde_saphyr::from_str(text).map_err(|e| match e.location() {
                Some(at) => format!("line {}: {e}", at.line()),
                None => e.to_string(),
            })?
        };
        for (i, rule) in rules.iter().enumerate() {
            if rule.users.is_empty() && rule.groups.is_empty() {
                return Err(format!(
                    "rule {}: name the users or groups it applies to",
                    i + 1
                ));
            }
            if rule.accounts.is_empty() {
                return Err(format!(
                    "rule {}: name the accounts it opens (`accounts: [\"*\"]` for all)",
                    i + 1
                ));
            }
        }
        Ok(Access { rules })
    }

    /// Whether `person` may reach `account` through the proxy; the refusal says why.
    pub fn admits(&self, person: &Person, account: &str) -> Result<(), String> {
        if self
            .rules
            .iter()
            .filter(|r| r.applies(person))
            .any(|r| r.accounts.iter().any(|a| glob_match(a, account)))
        {
            return Ok(());
        }
        Err(format!(
            // troubleshooting: proxy: HTTP 403 for an OIDC user
            // The OIDC ID token is valid but no rule of the hub's `--oidc-access` file admits the
            // user or one of their groups to this account.
            "{} (groups {:?}) may not reach account {account:?}: no rule of the hub's \
             --oidc-access file admits that user or one of those groups to it",
            person.user, person.groups
        ))
    }

    /// The API role of `person` and the account globs it is limited to; `None`: no API
    /// access.
    pub fn api_role(&self, person: &Person) -> Option<(Role, Vec<String>)> {
        let granting: Vec<&Rule> = self
            .rules
            .iter()
            .filter(|r| r.role.is_some() && r.applies(person))
            .collect();
        let role = granting.iter().filter_map(|r| r.role).max()?;
        let mut accounts: Vec<String> = granting
            .iter()
            .flat_map(|r| r.accounts.iter().cloned())
            .collect();
        accounts.sort();
        accounts.dedup();
        // `*` among them: every account, which an empty list says.
        if accounts.iter().any(|a| a == "*") {
            accounts.clear();
        }
        Some((role, accounts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn person(groups: &[&str]) -> Person {
        Person {
            user: "oidc:alice".into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            issuer: "https://issuer".into(),
            expires: 0,
        }
    }

    #[test]
    fn groups_open_their_accounts_and_nothing_else() {
        let access = Access::parse(
            "- {groups: [\"oidc:team-a\"], accounts: [\"team-a-*\"], role: operator}\n\
             - {users: [\"oidc:bob\"], accounts: [\"*\"]}\n",
        )
        .unwrap();
        let alice = person(&["oidc:team-a"]);
        assert!(access.admits(&alice, "team-a-prod").is_ok());
        let refused = access.admits(&alice, "team-b").unwrap_err();
        assert!(
            refused.contains("--oidc-access") && refused.contains("team-b"),
            "{refused}"
        );
        assert_eq!(
            access.api_role(&alice),
            Some((Role::Operator, vec!["team-a-*".to_string()]))
        );
        assert_eq!(access.api_role(&person(&[])), None);
        assert!(
            Access::parse("- {accounts: [x]}\n")
                .unwrap_err()
                .contains("users or groups")
        );
        assert!(Access::parse("- {groups: [x], accounts: [x], extra: 1}\n").is_err());
    }
}
