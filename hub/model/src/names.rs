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

/// Whether `account` matches every pattern (no pattern: any account).
pub fn accounts_allow(patterns: &[String], account: &str) -> bool {
    patterns.iter().all(|p| glob_match(p, account))
}
