//! Names the hub accepts and the account-name patterns identities are held to.

use crate::identity::glob_match;

/// Account names the hub accepts: 1 to 253 characters out of letters, digits, `-`, `_`, `.`.
pub fn validate_account_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!(
            "account name {name:?} must have 1 to 253 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "account name {name:?} contains {c:?}; use letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

/// Whether `account` matches every pattern (no pattern: any account). A pattern may list
/// comma-separated alternatives (`prod-eu-west-1,prod-eu-west-1-*`: the exact name and the
/// names below it, not `prod-eu-west-10`); account names hold no comma.
pub fn accounts_allow(patterns: &[String], account: &str) -> bool {
    patterns.iter().all(|p| {
        p.split(',')
            .any(|alternative| glob_match(alternative.trim(), account))
    })
}

/// Which account names a stream's credentials grant (issue 28, F7: nothing unless
/// something grants it). `--allow` rules apply on top of every grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountGrant {
    /// Names matching every pattern: those of the agent token presented and of the
    /// enrolment of a hub-issued certificate.
    Patterns(Vec<String>),
    /// Only names an `--allow` rule grants the identity: a certificate of the external CA
    /// (`--client-ca`), or `anonymous` (`--insecure-plaintext`), whose credentials carry no
    /// pattern of their own.
    AllowRuleOnly {
        /// How the stream authenticated, for the refusal.
        via: String,
    },
    /// None, and why (a hub-issued certificate this hub holds no enrolment of).
    Nothing(String),
}

impl AccountGrant {
    /// Whether `identity` may register `account` under this grant and `rules` (`--allow`);
    /// the refusal says what would grant it.
    pub fn allows(
        &self,
        rules: &[crate::identity::AllowRule],
        identity: &str,
        account: &str,
    ) -> Result<(), String> {
        let explicit = rules
            .iter()
            .any(|r| glob_match(&r.identity, identity) && glob_match(&r.accounts, account));
        if !rules.is_empty() && !explicit {
            return Err(format!(
                "identity {identity:?} may not register account {account:?} (no --allow rule \
                 matches)"
            ));
        }
        match self {
            AccountGrant::Patterns(patterns) if accounts_allow(patterns, account) => Ok(()),
            AccountGrant::Patterns(patterns) => Err(format!(
                // troubleshooting: AgentAccount `Connected=False`, reason `Rejected`
                // Each agent token or enrolment limits the account names its identity may register
                // (`--accounts`). Rename the account into the pattern, or issue a token with a
                // wider one.
                "identity {identity:?} may register accounts matching {} only (the pattern of \
                 its agent token or enrolment); issue a token with a wider --accounts pattern \
                 to serve {account:?}",
                patterns.join(" and ")
            )),
            AccountGrant::AllowRuleOnly { .. } if explicit => Ok(()),
            AccountGrant::AllowRuleOnly { via } => Err(format!(
                // troubleshooting: AgentAccount `Connected=False`, reason `Rejected`
                // An identity from an operator-signed certificate (`--client-ca`) or an
                // unauthenticated plaintext agent carries no account pattern, so the hub admits its
                // accounts only by an explicit `--allow` rule.
                "identity {identity:?} authenticated with {via}, which carries no account \
                 pattern, and no --allow rule names it: start the hub with --allow \
                 '{identity}={account}' (or a pattern with a separator, e.g. \
                 '{identity}={account}-*') to let it serve {account:?}"
            )),
            AccountGrant::Nothing(reason) => Err(format!(
                "identity {identity:?} may register no account: {reason}"
            )),
        }
    }
}
