//! How the gRPC listener authenticates agents ([`GrpcSecurity`]): mutual TLS, plaintext, or
//! behind a TLS-terminating proxy whose forwarded certificates are trusted as
//! [`ProxyMode`] says. The hub's `Config` holds it; the hub's `config` module re-exports it.

use scale_agent_hub_model::error::{HubError, Result};
use scale_agent_hub_net::tls::{ProxyHopTls, TlsMaterial};

use crate::forwarded::ProxyTrust;

/// How the gRPC listener authenticates agents.
#[derive(Clone, Debug)]
pub enum GrpcSecurity {
    /// TLS with a client certificate required and verified against `client_ca_pem`.
    MutualTls(TlsMaterial),
    /// No TLS at all; every agent has the identity
    /// [`scale_agent_hub_model::identity::ANONYMOUS`].
    InsecurePlaintext,
    /// Behind a gRPC proxy that terminates the agents' mutual TLS and forwards their client
    /// certificate in a header, honoured only from a trusted proxy.
    TrustedProxy(ProxyMode),
}

/// The hub behind a TLS-terminating gRPC proxy.
#[derive(Clone, Debug)]
pub struct ProxyMode {
    /// Who is a trusted proxy, and how forwarded certificates are read and verified.
    pub trust: ProxyTrust,
    /// The CA(s) of `--client-ca`: forwarded certificates must chain to it or to the hub's
    /// own agent CA.
    pub client_ca_pem: Vec<u8>,
    /// TLS on the proxy-to-hub hop; `None`: plaintext (the proxy next to the hub).
    pub hop_tls: Option<ProxyHopTls>,
}

impl ProxyMode {
    /// Refuses a proxy mode that could never trust anyone, or that trusts proxy identities
    /// it could never see.
    pub fn validate(&self) -> Result<()> {
        if !self.trust.has_rules() {
            return Err(HubError::Config(
                "--forwarded-client-cert needs a trusted proxy: set --trusted-proxy-cidr to the \
                 proxy's source address range, or --trusted-proxy-identity (with --tls-cert, \
                 --tls-key and --trusted-proxy-ca) to its client certificate's identity"
                    .into(),
            ));
        }
        let proxy_certificates = self
            .hop_tls
            .as_ref()
            .is_some_and(|tls| tls.proxy_ca_pem.is_some());
        if self.trust.trusts_identities() && !proxy_certificates {
            return Err(HubError::Config(
                "--trusted-proxy-identity needs a mutual-TLS hop from the proxy: set --tls-cert \
                 and --tls-key (the hub's certificate) and --trusted-proxy-ca (the CA of the \
                 proxy's client certificate)"
                    .into(),
            ));
        }
        Ok(())
    }
}
