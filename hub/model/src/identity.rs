//! Agent identity (read from the client certificate) and the allow-list that maps
//! identities to the account names they may register.

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The identity of every agent when the hub runs with `--insecure-plaintext`.
pub const ANONYMOUS: &str = "anonymous";

/// The agent identity in a DER certificate: its first DNS subject alternative name, else its
/// subject common name.
pub fn identity_from_der(der: &[u8]) -> Result<String, String> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("cannot parse the client certificate: {e}"))?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name
                && !dns.is_empty()
            {
                return Ok((*dns).to_string());
            }
        }
    }
    cert.subject()
        .iter_common_name()
        .find_map(|cn| cn.as_str().ok().map(str::to_string))
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| {
            "the client certificate has neither a DNS subject alternative name nor a common name"
                .to_string()
        })
}

/// The serial number of a DER certificate: lowercase hex without leading zeros (the form
/// [`crate::records::AgentIdentityState`] keeps denied serials in).
pub fn certificate_serial(der: &[u8]) -> Result<String, String> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("cannot parse the client certificate: {e}"))?;
    let hex: String = cert
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stripped = hex.trim_start_matches('0');
    Ok(if stripped.is_empty() { "0" } else { stripped }.to_string())
}

/// `*` matches any run of characters (including none); everything else matches itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() {
        return false;
    }
    if !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// One `IDENTITY=PATTERN` rule: `identity` (a glob) may register accounts matching
/// `accounts` (a glob).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowRule {
    pub identity: String,
    pub accounts: String,
}

impl AllowRule {
    /// Parses `IDENTITY=PATTERN`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((identity, accounts))
                if !identity.trim().is_empty() && !accounts.trim().is_empty() =>
            {
                Ok(AllowRule {
                    identity: identity.trim().to_string(),
                    accounts: accounts.trim().to_string(),
                })
            }
            _ => Err(format!(
                "{s:?}: expected IDENTITY=ACCOUNT_PATTERN, e.g. prod-agent=prod-*"
            )),
        }
    }
}

/// Whether `identity` may register `account` under `rules` (no rules: everything allowed).
pub fn is_allowed(rules: &[AllowRule], identity: &str, account: &str) -> bool {
    rules.is_empty()
        || rules
            .iter()
            .any(|r| glob_match(&r.identity, identity) && glob_match(&r.accounts, account))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("prod-*", "prod-eu"));
        assert!(glob_match("prod-*", "prod-"));
        assert!(!glob_match("prod-*", "dev-eu"));
        assert!(glob_match("*-eu", "prod-eu"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxc"));
        assert!(!glob_match("ab*ba", "aba"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }

    #[test]
    fn allow_rules() {
        assert!(is_allowed(&[], "x", "y"));
        let rules = vec![
            AllowRule::parse("agent-a=prod-*").unwrap(),
            AllowRule::parse("*=shared").unwrap(),
        ];
        assert!(is_allowed(&rules, "agent-a", "prod-1"));
        assert!(!is_allowed(&rules, "agent-b", "prod-1"));
        assert!(is_allowed(&rules, "agent-b", "shared"));
        assert!(AllowRule::parse("no-equals").is_err());
        assert!(AllowRule::parse("=x").is_err());
    }

    #[test]
    fn identity_from_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["agent-a.example".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(identity_from_der(cert.der()).unwrap(), "agent-a.example");

        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cn-only");
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(identity_from_der(cert.der()).unwrap(), "cn-only");

        assert!(identity_from_der(b"not a certificate").is_err());
    }
}
