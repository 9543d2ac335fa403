//! Who an agent stream is: the gRPC listener's TLS (client certificates optional, so that
//! enrolling and token-authenticated agents get in), the check of a presented certificate
//! chain against the hub's CA and an opted-in external CA, agent bearer tokens, and the one
//! [`authenticate`] step the service calls.
//!
//! The TLS layer proves that a client holds the key of the certificate it presents, but
//! leaves the chain to [`ClientCertificates::verify`]: a certificate the hub did not issue is
//! then refused with a gRPC status that says what to do, instead of a bare TLS alert, and the
//! same check serves a chain that reaches the hub another way (a forwarded client certificate
//! from a trusted proxy). Every RPC that needs an identity must go through [`authenticate`].

use std::sync::Arc;

use rustls::{
    DistinguishedName, RootCertStore, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    pki_types::{CertificateDer, UnixTime, pem::PemObject as _},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use scale_agent_hub_model::{
    error::{HubError, Result},
    identity::{ANONYMOUS, certificate_serial, identity_from_der},
    names::AccountGrant,
};
use scale_agent_hub_net::serve;
use tonic::{Status, metadata::MetadataMap};

use crate::{agent_tokens::AgentTokenKind, book::AuthBook, identity_states};

/// Which CA vouched for a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateOrigin {
    /// The hub's own CA (enrolment or renewal).
    Hub,
    /// The external CA of `--client-ca` (the operator-signed mode, an explicit opt-in).
    External,
}

/// The trusted issuers of client certificates.
#[derive(Debug)]
pub struct ClientCertificates {
    hub: Arc<dyn ClientCertVerifier>,
    external: Option<Arc<dyn ClientCertVerifier>>,
    /// Accepts a chain of either (for the TLS layer's root hints and signature checks).
    any: Arc<dyn ClientCertVerifier>,
}

fn roots(pem: &[u8], what: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| HubError::Config(format!("{what}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| HubError::Config(format!("{what}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(HubError::Config(format!("{what} holds no PEM certificate")));
    }
    Ok(roots)
}

fn verifier(roots: RootCertStore) -> Result<Arc<dyn ClientCertVerifier>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| HubError::Config(format!("client certificate verifier: {e}")))
}

impl ClientCertificates {
    /// Trusts certificates of the hub's CA and, when given, of an external CA.
    pub fn new(hub_ca_pem: &[u8], external_ca_pem: Option<&[u8]>) -> Result<Self> {
        let hub_roots = roots(hub_ca_pem, "the hub's agent CA")?;
        let mut any_roots = hub_roots.clone();
        let external = match external_ca_pem {
            Some(pem) => {
                let external = roots(pem, "--client-ca")?;
                any_roots.roots.extend(external.roots.iter().cloned());
                Some(verifier(external)?)
            }
            None => None,
        };
        Ok(ClientCertificates {
            hub: verifier(hub_roots)?,
            external,
            any: verifier(any_roots)?,
        })
    }

    /// Checks a presented chain (leaf first) now; returns the identity in the leaf and which
    /// CA vouched for it. The error says what to change.
    pub fn verify(
        &self,
        chain: &[CertificateDer<'_>],
    ) -> Result<(String, CertificateOrigin), String> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("no client certificate".into());
        };
        let now = UnixTime::now();
        let origin = match self.hub.verify_client_cert(leaf, intermediates, now) {
            Ok(_) => CertificateOrigin::Hub,
            Err(hub_error) => match &self.external {
                Some(external) => match external.verify_client_cert(leaf, intermediates, now) {
                    Ok(_) => CertificateOrigin::External,
                    Err(e) => {
                        return Err(format!(
                            "the client certificate is neither one this hub issued ({hub_error}) \
                             nor one the CA of --client-ca signed ({e}); enrol the agent with a \
                             one-time token (`scale-agent-hub agent-token create --once`) to \
                             get a certificate from the hub"
                        ));
                    }
                },
                None => {
                    return Err(format!(
                        // troubleshooting: an agent's stream refused: gRPC `UNAUTHENTICATED`
                        // The agent's certificate is signed by a CA the hub does not trust. Enrol
                        // the agent, or start the hub with `--client-ca` to trust the CA that
                        // signed it (the operator-signed mode, an explicit opt-in).
                        "the client certificate was not issued by this hub ({hub_error}); enrol \
                         the agent with a one-time token (`scale-agent-hub agent-token create \
                         --once`), or start the hub with --client-ca to also trust the CA that \
                         signed it (the operator-signed mode)"
                    ));
                }
            },
        };
        let identity = identity_from_der(leaf.as_ref())?;
        Ok((identity, origin))
    }
}

/// The TLS layer's view: every chain is accepted here (its holder's proof of the key is
/// checked), the chain itself by [`ClientCertificates::verify`] in [`authenticate`].
#[derive(Debug)]
struct ChainCheckedLater(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for ChainCheckedLater {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The gRPC listener's TLS configuration: the server certificate, client certificates
/// optional, HTTP/2.
pub fn server_tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    clients: &ClientCertificates,
) -> Result<Arc<rustls::ServerConfig>> {
    let names = (
        "the gRPC server certificate (--tls-cert)",
        "the gRPC server key (--tls-key)",
    );
    let verifier = Arc::new(ChainCheckedLater(clients.any.clone()));
    serve::server_config(cert_pem, key_pem, names, Some(verifier), &[b"h2"])
}

/// How the client certificate of a stream reached the hub, which says whether its holder
/// proved it has the certificate's key (issue 28, F5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presented {
    /// In the stream's own TLS handshake: the holder signed with the key.
    Direct,
    /// Forwarded by a proxy the hub trusts by its client certificate, which checked the
    /// agent's possession of the key in its own handshake.
    ByCertifiedProxy,
    /// Forwarded by a proxy trusted by its source address only: anyone who can connect
    /// from that range can send any (public) certificate in the header, so nothing proves
    /// possession of the key. Such a stream is never given a certificate (no renewal).
    ByProxyAddress,
}

/// An authenticated agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    pub identity: String,
    /// The account names its credentials grant (`--allow` applies too).
    pub grant: AccountGrant,
    /// Set when a client certificate authenticated it.
    pub certificate: Option<CertificateOrigin>,
    /// The serial of that certificate (lowercase hex).
    pub serial: Option<String>,
    /// How the certificate reached the hub (`Direct` without one).
    pub presented: Presented,
    /// How, for logs: "certificate (hub)", "token", ...
    pub via: String,
    /// The id of the agent bearer token it presented, if any: revoking that token ends the
    /// stream (F17).
    pub token_id: Option<String>,
}

impl Authenticated {
    /// Whether the stream's holder proved possession of its certificate's key, directly or
    /// through a proxy trusted by its certificate: the condition for a renewal on it.
    pub fn key_proven(&self) -> bool {
        self.presented != Presented::ByProxyAddress
    }
}

/// The bearer token in `authorization` metadata, if any.
fn bearer(metadata: &MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The identity a stream claims, before anything is verified: its certificate's, else its
/// bearer token's (as this replica knows the token). For looking the identity's state up
/// in a shared store before [`authenticate`] decides.
pub fn claimed_identity(
    book: &AuthBook,
    chain: Option<&[CertificateDer<'_>]>,
    metadata: &MetadataMap,
) -> Option<String> {
    if let Some(leaf) = chain.and_then(|c| c.first()) {
        return identity_from_der(leaf.as_ref()).ok();
    }
    let token = bearer(metadata)?;
    book.agent_tokens().find(token).map(|r| r.identity.clone())
}

/// Authenticates a stream from its client certificate chain (the TLS peer's, or one a
/// trusted proxy forwarded, as `presented` says) and its bearer token. When both are
/// presented their identities must agree. A disabled identity and a denied certificate are
/// refused; a certificate of the external CA may not take an identity this hub issues
/// credentials for (F6); what the credentials grant is decided here (F7: nothing unless
/// something grants it).
pub fn authenticate(
    book: &AuthBook,
    chain: Option<&[CertificateDer<'_>]>,
    metadata: &MetadataMap,
    presented: Presented,
) -> Result<Authenticated, Status> {
    let chain = chain.filter(|c| !c.is_empty());
    let clients = book.client_certificates();
    let from_certificate = match (chain, &clients) {
        (Some(chain), Some(clients)) => {
            let (identity, origin) = clients.verify(chain).map_err(Status::unauthenticated)?;
            let serial = certificate_serial(chain[0].as_ref()).map_err(Status::unauthenticated)?;
            Some((identity, origin, serial))
        }
        _ => None,
    };
    let from_token = match bearer(metadata) {
        None => None,
        Some(token) => {
            let now = jiff::Timestamp::now().as_second();
            let record = book
                .agent_tokens()
                .check(token, AgentTokenKind::Bearer, now)
                .map_err(|r| r.to_status())?
                .clone();
            Some(record)
        }
    };
    let (identity, certificate, serial, via) = match (from_certificate, &from_token) {
        (Some((cert_identity, _, _)), Some(token)) if cert_identity != token.identity => {
            return Err(Status::permission_denied(format!(
                // troubleshooting: an agent's stream refused: gRPC `PERMISSION_DENIED`
                // The agent presented a certificate and a bearer token of two different identities.
                "the client certificate is for identity {cert_identity:?} but the bearer token \
                 {} is for {:?}; present credentials of one identity (or only one of them)",
                token.id, token.identity
            )));
        }
        (Some((identity, origin, serial)), token) => {
            let via = match (origin, token) {
                (CertificateOrigin::Hub, None) => "certificate (hub-issued)",
                (CertificateOrigin::External, None) => "certificate (--client-ca)",
                (_, Some(_)) => "certificate and token",
            };
            (identity, Some(origin), Some(serial), via)
        }
        (None, Some(token)) => (token.identity.clone(), None, None, "token"),
        (None, None) => match clients {
            None => (
                ANONYMOUS.to_string(),
                None,
                None,
                "no credentials (--insecure-plaintext)",
            ),
            Some(_) => {
                return Err(Status::unauthenticated(
                    // troubleshooting: an agent's stream refused: gRPC `UNAUTHENTICATED`
                    // The agent presented neither a certificate the hub issued nor an agent token.
                    // Enrol it (the ScaleAgent's `spec.enrolment.tokenSecretRef`, or the agent's
                    // `clouddriver.auth.enrolmentTokenFile`) with a one-time token from
                    // `scale-agent-hub agent-token create --once`, or give it a bearer token file.
                    "the stream needs a client certificate this hub issued (enrol the agent \
                     with a one-time token: clouddriver.auth.enrolmentTokenFile) or an agent \
                     bearer token (clouddriver.auth.tokenFile); the hub's admin issues both \
                     with `scale-agent-hub agent-token create`",
                ));
            }
        },
    };
    identity_states::check(
        book.identity_states().get(&identity),
        &identity,
        serial.as_deref(),
    )
    .map_err(Status::permission_denied)?;
    let tokens = book.agent_tokens();
    if certificate == Some(CertificateOrigin::External)
        && from_token.is_none()
        && tokens.issued_to(&identity)
    {
        return Err(Status::permission_denied(format!(
            // troubleshooting: an agent's stream refused: gRPC `PERMISSION_DENIED`
            // An operator-signed certificate (the CA of `--client-ca`) names an identity that
            // enrolled at this hub or holds an agent token: the external CA may not take over a hub
            // identity.
            "identity {identity:?} belongs to this hub (it enrolled, or holds an agent token), \
             and a certificate of the external CA (--client-ca) may not take it; give the \
             operator-signed agent another identity, or enrol it with a one-time token"
        )));
    }
    let mut patterns = Vec::new();
    if let Some(token) = &from_token {
        patterns.push(token.accounts.clone());
    }
    let grant = match certificate {
        Some(CertificateOrigin::Hub) => match tokens.enrolled(&identity) {
            Some(enrolled) => {
                patterns.push(enrolled.accounts.clone());
                patterns.dedup();
                AccountGrant::Patterns(patterns)
            }
            None => AccountGrant::Nothing(format!(
                "its certificate was issued by this hub's CA, but the hub holds no enrolment of \
                 {identity:?} (another hub sharing the CA, or a store rebuilt): enrol the agent \
                 here with a one-time token (`scale-agent-hub agent-token create --identity \
                 {identity} --accounts <pattern> --ttl 1h --once`)"
            )),
        },
        _ if !patterns.is_empty() => AccountGrant::Patterns(patterns),
        _ => AccountGrant::AllowRuleOnly {
            via: via.to_string(),
        },
    };
    drop(tokens);
    let presented = if certificate.is_some() {
        presented
    } else {
        Presented::Direct
    };
    Ok(Authenticated {
        identity,
        grant,
        certificate,
        serial,
        presented,
        via: via.to_string(),
        token_id: from_token.map(|t| t.id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_in_metadata() {
        let mut m = MetadataMap::new();
        assert_eq!(bearer(&m), None);
        m.insert("authorization", "Bearer saa_x".parse().unwrap());
        assert_eq!(bearer(&m), Some("saa_x"));
        m.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(bearer(&m), None);
    }
}
