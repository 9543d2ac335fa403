//! Where a replica may send the replicas' secret (review F12). An owner's address comes from
//! the shared store (`account_owners.address`, the replicas' table), so whoever can write
//! the database could point it anywhere, `http://` included, and collect the secret (which
//! opens every account's proxy) with the client's request. A replica therefore forwards only
//! to addresses of its own scheme (`https://` whenever its HTTP listener serves TLS, which
//! its `--replica-address` must then say), inside `--replica-peer-cidrs` when given, and over
//! TLS trusts nothing but `--serving-ca` ([`super::forward::Forwarder::new`]).

use std::net::IpAddr;

use scale_agent_hub_auth::forwarded::Cidr;
use scale_agent_hub_model::{HubError, Result};

/// The addresses this replica forwards to.
#[derive(Clone, Debug)]
pub struct PeerRule {
    /// `https` or `http`: this replica's own (`--replica-address`).
    scheme: String,
    /// Empty: any host; else the host must be an IP address inside one of them.
    cidrs: Vec<Cidr>,
}

impl PeerRule {
    /// The rule of a replica reached at `own_address` (`--replica-address`), whose HTTP
    /// listener serves TLS when `serves_tls`, with `--replica-peer-cidrs`.
    pub fn new(own_address: &str, serves_tls: bool, cidrs: Vec<Cidr>) -> Result<Self> {
        let scheme = scheme_of(own_address).ok_or_else(|| {
            HubError::Config(format!(
                "--replica-address {own_address:?} must start with https:// (or http:// with \
                 --http-plaintext)"
            ))
        })?;
        if serves_tls && scheme != "https" {
            return Err(HubError::Config(format!(
                "--replica-address {own_address:?} is http:// but the HTTP listener serves \
                 TLS: replicas would send each other the replica secret in clear; give the \
                 https:// address"
            )));
        }
        Ok(Self {
            scheme: scheme.to_string(),
            cidrs,
        })
    }

    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// Whether the replica secret may go to `address`; the error says why not and what to
    /// check.
    pub fn check(&self, address: &str) -> std::result::Result<(), String> {
        let refuse = |why: String| {
            Err(format!(
                "refused to forward to {address:?}: {why}; a replica forwards only to addresses \
                 of its own scheme ({}://){} (check the other replica's --replica-address, \
                 and who can write the store's account_owners and replicas tables)",
                self.scheme,
                if self.cidrs.is_empty() {
                    String::new()
                } else {
                    format!(
                        " inside --replica-peer-cidrs ({})",
                        self.cidrs
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            ))
        };
        let uri: http::Uri = match address.parse() {
            Ok(uri) => uri,
            Err(e) => return refuse(format!("not a URL ({e})")),
        };
        match uri.scheme_str() {
            Some(scheme) if scheme.eq_ignore_ascii_case(&self.scheme) => {}
            Some(scheme) => return refuse(format!("its scheme is {scheme}://")),
            None => return refuse("it has no scheme".into()),
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return refuse(format!("it has a path ({})", uri.path()));
        }
        if self.cidrs.is_empty() {
            return Ok(());
        }
        let host = uri.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match host.parse::<IpAddr>() {
            Ok(ip) if self.cidrs.iter().any(|c| c.contains(ip)) => Ok(()),
            Ok(ip) => refuse(format!("{ip} is outside the allowed ranges")),
            Err(_) => refuse(format!(
                "its host {host:?} is not an IP address, which --replica-peer-cidrs needs"
            )),
        }
    }
}

fn scheme_of(address: &str) -> Option<&'static str> {
    let lower = address.trim().to_ascii_lowercase();
    if lower.starts_with("https://") {
        Some("https")
    } else if lower.starts_with("http://") {
        Some("http")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_replicas_refuse_http_and_addresses_outside_the_cidrs() {
        let rule = PeerRule::new(
            "https://10.1.2.3:8443",
            true,
            vec![Cidr::parse("10.0.0.0/8").unwrap()],
        )
        .unwrap();
        assert!(rule.check("https://10.9.9.9:8443").is_ok());
        let http = rule.check("http://10.9.9.9:8443").unwrap_err();
        assert!(http.contains("its scheme is http://"), "{http}");
        let outside = rule.check("https://192.168.1.1:8443").unwrap_err();
        assert!(
            outside.contains("192.168.1.1 is outside the allowed ranges")
                && outside.contains("inside --replica-peer-cidrs (10.0.0.0/8)"),
            "{outside}"
        );
        let name = rule.check("https://attacker.example:8443").unwrap_err();
        assert!(name.contains("not an IP address"), "{name}");
        assert!(rule.check("https://10.9.9.9:8443/evil").is_err());
    }

    #[test]
    fn an_http_own_address_needs_a_plaintext_listener() {
        let err = PeerRule::new("http://10.1.2.3:8443", true, vec![]).unwrap_err();
        assert!(err.to_string().contains("in clear"), "{err}");
        let plain = PeerRule::new("http://127.0.0.1:8080", false, vec![]).unwrap();
        assert!(plain.check("http://127.0.0.1:9090").is_ok());
        assert!(plain.check("https://127.0.0.1:9090").is_err());
        // No CIDRs: any host of the right scheme.
        let any = PeerRule::new("https://hub-0:8443", true, vec![]).unwrap();
        assert!(any.check("https://hub-1.hub:8443").is_ok());
    }
}
