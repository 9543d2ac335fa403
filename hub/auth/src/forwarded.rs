//! Agents behind a TLS-terminating gRPC proxy: the proxy verifies the agent's client
//! certificate and forwards it in a header (Envoy's `x-forwarded-client-cert`, nginx's
//! `$ssl_client_escaped_cert`). The header is honoured only on connections from a trusted
//! proxy (a source address range, or the proxy's own client certificate on a mutual-TLS hop),
//! and the forwarded certificate is verified again here, against the hub's client CA, so the
//! proxy can mislay trust but not invent an identity the CA never signed.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use crate::agent_auth::Presented;
use percent_encoding::percent_decode_str;
use rustls::{
    RootCertStore,
    pki_types::{CertificateDer, UnixTime, pem::PemObject as _},
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
};
use scale_agent_hub_model::identity::{glob_match, identity_from_der};

/// How the proxy encodes the client certificate in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedFormat {
    /// Envoy's `x-forwarded-client-cert`: `By=..;Hash=..;Cert="<url-encoded PEM>";..`
    /// elements, comma-separated when several proxies appended one.
    Xfcc,
    /// A url-encoded PEM certificate, as nginx's `$ssl_client_escaped_cert`.
    EscapedPem,
}

impl ForwardedFormat {
    /// The header the proxy's documented configuration sets.
    pub fn default_header(self) -> &'static str {
        match self {
            ForwardedFormat::Xfcc => "x-forwarded-client-cert",
            ForwardedFormat::EscapedPem => "x-ssl-client-cert",
        }
    }
}

/// An IPv4 or IPv6 address range such as `10.0.0.0/8` or `fd00::/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ADDRESS/PREFIX`, or a single address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (address, prefix) = match s.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (s, None),
        };
        let network: IpAddr = address.parse().map_err(|_| {
            format!("{s:?} is not an address range: expected e.g. 10.0.0.0/8 or 127.0.0.2")
        })?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { network, prefix })
    }

    /// Whether `addr` is in the range (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, addr.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Why a connection in proxy mode was refused; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The forwarded-certificate header came from a peer that is not a trusted proxy.
    UntrustedHeader { header: String, peer: String },
    /// A peer that is not a trusted proxy connected directly.
    NotThroughProxy { peer: String },
    /// A trusted proxy sent no forwarded certificate.
    MissingHeader { header: String },
    /// The header is there but holds no usable certificate.
    Malformed { header: String, reason: String },
    /// The forwarded certificate does not verify against the client CA.
    Invalid { reason: String },
    /// In `escaped-pem` mode, the header came more than once (or as a list): a proxy that
    /// appends its value to the client's own instead of replacing it.
    SeveralValues { header: String, count: usize },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::UntrustedHeader { header, peer } => write!(
                f,
                // troubleshooting: an agent's stream refused (behind a gRPC proxy): gRPC `UNAUTHENTICATED`
                // The forwarded-certificate header came from a peer that is not a trusted proxy
                // (`--trusted-proxy-cidr`, `--trusted-proxy-identity`).
                "the {header} header is honoured only from a trusted proxy, and {peer} is not \
                 one: connect agents through the TLS-terminating gRPC proxy, or, if {peer} is \
                 that proxy, add its address range to --trusted-proxy-cidr or its certificate \
                 identity to --trusted-proxy-identity"
            ),
            Refusal::NotThroughProxy { peer } => write!(
                f,
                // troubleshooting: an agent's stream refused (behind a gRPC proxy): gRPC `UNAUTHENTICATED`
                // The hub runs with `--forwarded-client-cert`, and an agent connected directly, not
                // through the proxy.
                "this hub accepts agents only through its TLS-terminating gRPC proxy, and \
                 {peer} is not a trusted proxy: connect the agent to the proxy's address, or, \
                 if {peer} is that proxy, add its address range to --trusted-proxy-cidr or its \
                 certificate identity to --trusted-proxy-identity"
            ),
            Refusal::MissingHeader { header } => write!(
                f,
                // troubleshooting: an agent's stream refused (behind a gRPC proxy): gRPC `UNAUTHENTICATED`
                // A trusted proxy sent the stream without the forwarded-certificate header: the
                // proxy does not require client certificates, or uses another header.
                "the trusted proxy forwarded no client certificate in the {header} header: \
                 make the proxy ask for client certificates and forward them (nginx: \
                 ssl_verify_client optional or on; grpc_set_header {header} \
                 $ssl_client_escaped_cert; \
                 Envoy: forward_client_cert_details: SANITIZE_SET with \
                 set_current_client_cert_details: {{cert: true}}), or set \
                 --forwarded-client-cert-header to the header it uses"
            ),
            Refusal::Malformed { header, reason } => write!(
                f,
                // troubleshooting: an agent's stream refused (behind a gRPC proxy): gRPC `UNAUTHENTICATED`
                // The forwarded-certificate header does not hold a certificate in the format
                // `--forwarded-client-cert` names.
                "the {header} header holds no usable client certificate ({reason}): check \
                 --forwarded-client-cert (xfcc for Envoy, escaped-pem for nginx's \
                 $ssl_client_escaped_cert) against what the proxy sends"
            ),
            Refusal::SeveralValues { header, count } => write!(
                f,
                // troubleshooting: an agent's stream refused (behind a gRPC proxy): gRPC `UNAUTHENTICATED`
                // The header came more than once (or as a list in one line): a proxy that appends
                // its value to the client's own.
                "the {header} header came with {count} values, and in escaped-pem mode the hub \
                 takes exactly one: the proxy appends its certificate to one the client sent \
                 instead of replacing it, so the client could choose its identity. Make the \
                 proxy set the header (nginx: grpc_set_header {header} \
                 $ssl_client_escaped_cert, which replaces the client's own)"
            ),
            Refusal::Invalid { reason } => write!(
                f,
                // troubleshooting: an agent's stream refused (behind a gRPC proxy): gRPC `UNAUTHENTICATED`
                // The forwarded certificate is of another CA, expired, or not for client
                // authentication.
                "the forwarded client certificate is not valid ({reason}): the agent needs a \
                 current certificate for client authentication signed by the CA the hub's \
                 --client-ca names"
            ),
        }
    }
}

/// What the hub knows about the connection a stream arrived on.
#[derive(Debug, Clone, Copy)]
pub struct Peer<'a> {
    /// The TCP source address.
    pub addr: Option<SocketAddr>,
    /// The leaf certificate the peer presented on a mutual-TLS hop (DER).
    pub certificate: Option<&'a [u8]>,
}

/// The trust rules of proxy mode and the verifier of forwarded certificates.
#[derive(Clone)]
pub struct ProxyTrust {
    format: ForwardedFormat,
    header: String,
    cidrs: Vec<Cidr>,
    identities: Vec<String>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl fmt::Debug for ProxyTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyTrust")
            .field("format", &self.format)
            .field("header", &self.header)
            .field("cidrs", &self.cidrs)
            .field("identities", &self.identities)
            .finish_non_exhaustive()
    }
}

impl ProxyTrust {
    /// `client_ca_pem`: the CA (or CAs) that sign agents' certificates. `header`: default
    /// [`ForwardedFormat::default_header`]. Errors say what to change.
    pub fn new(
        format: ForwardedFormat,
        header: Option<&str>,
        client_ca_pem: &[u8],
        cidrs: Vec<Cidr>,
        identities: Vec<String>,
    ) -> Result<Self, String> {
        let header = header
            .unwrap_or(format.default_header())
            .trim()
            .to_ascii_lowercase();
        if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
            return Err(format!(
                "--forwarded-client-cert-header {header:?} is not a valid header name"
            ));
        }
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(client_ca_pem) {
            let cert = cert.map_err(|e| format!("--client-ca is not PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("--client-ca holds an unusable CA certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err("--client-ca holds no PEM certificate".into());
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .map_err(|e| format!("cannot verify client certificates with --client-ca: {e}"))?;
        Ok(ProxyTrust {
            format,
            header,
            cidrs,
            identities,
            verifier,
        })
    }

    /// The header the forwarded certificate arrives in (lower case).
    pub fn header(&self) -> &str {
        &self.header
    }

    /// Whether any trust rule exists (without one, no connection could ever be trusted).
    pub fn has_rules(&self) -> bool {
        !self.cidrs.is_empty() || !self.identities.is_empty()
    }

    /// Whether proxies are trusted by their certificate identity (needs a mutual-TLS hop).
    pub fn trusts_identities(&self) -> bool {
        !self.identities.is_empty()
    }

    /// Whether only certificate identities are trusted (no address range): then a peer
    /// without a certificate can never be trusted, and TLS may as well require one.
    pub fn trusts_only_identities(&self) -> bool {
        self.cidrs.is_empty() && !self.identities.is_empty()
    }

    /// Whether `peer` is a trusted proxy: its address is in a trusted range, or it
    /// presented a certificate whose identity matches a trusted one.
    pub fn is_trusted(&self, peer: Peer<'_>) -> bool {
        let by_addr = peer
            .addr
            .is_some_and(|a| self.cidrs.iter().any(|c| c.contains(a.ip())));
        by_addr || self.trusted_by_certificate(peer)
    }

    /// Whether `peer` is trusted by the identity of the client certificate it presented
    /// on the hop (then it checked the agent's possession of the key in its own handshake;
    /// a proxy trusted by address only proves nothing of the kind: issue 28, F5).
    pub fn trusted_by_certificate(&self, peer: Peer<'_>) -> bool {
        peer.certificate
            .and_then(|der| identity_from_der(der).ok())
            .is_some_and(|id| self.identities.iter().any(|p| glob_match(p, &id)))
    }

    /// The agent's identity on a stream that arrived from `peer` with `header_values` (every
    /// value of the forwarded-certificate header, in order), or why it is refused: the
    /// forwarded certificate checked against this trust's CA.
    pub fn identity(&self, peer: Peer<'_>, header_values: &[&str]) -> Result<String, Refusal> {
        let chain = self.forwarded_chain(peer, header_values)?;
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(Refusal::Invalid {
                reason: "no certificate".into(),
            });
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| Refusal::Invalid {
                reason: e.to_string(),
            })?;
        identity_from_der(leaf.as_ref()).map_err(|reason| Refusal::Invalid { reason })
    }

    /// The forwarded certificate chain (leaf first), not yet verified, of a stream that
    /// arrived from a trusted proxy; refused when the peer is not trusted, the header is
    /// missing, or it holds no certificate.
    pub fn forwarded_chain(
        &self,
        peer: Peer<'_>,
        header_values: &[&str],
    ) -> Result<Vec<CertificateDer<'static>>, Refusal> {
        let peer_name = peer
            .addr
            .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
        match (self.is_trusted(peer), header_values.is_empty()) {
            (false, false) => {
                return Err(Refusal::UntrustedHeader {
                    header: self.header.clone(),
                    peer: peer_name,
                });
            }
            (false, true) => return Err(Refusal::NotThroughProxy { peer: peer_name }),
            (true, true) => {
                return Err(Refusal::MissingHeader {
                    header: self.header.clone(),
                });
            }
            (true, false) => {}
        }
        let malformed = |reason: String| Refusal::Malformed {
            header: self.header.clone(),
            reason,
        };
        // escaped-pem carries one certificate and no list syntax (the escaped PEM holds no
        // `,`): several lines, or a list in one, mean the proxy appended its value to one the
        // client sent, and the first would be the client's choice (F22). XFCC is a list by
        // design; its last element is the trusted proxy's.
        if self.format == ForwardedFormat::EscapedPem {
            let count = header_values
                .iter()
                .map(|v| {
                    v.split(',')
                        .filter(|part| !part.trim().is_empty())
                        .count()
                        .max(1)
                })
                .sum::<usize>();
            if count > 1 {
                return Err(Refusal::SeveralValues {
                    header: self.header.clone(),
                    count,
                });
            }
        }
        // Several header lines are one comma-separated list (RFC 9110, 5.3).
        let value = header_values.join(",");
        let (leaf_pem, chain_pem) = match self.format {
            ForwardedFormat::Xfcc => {
                let element = last_xfcc_element(&value).map_err(malformed)?;
                let cert = element.cert.ok_or_else(|| {
                    malformed(
                        "its last element has no Cert field: set \
                         set_current_client_cert_details: {cert: true} in Envoy"
                            .into(),
                    )
                })?;
                (cert, element.chain)
            }
            ForwardedFormat::EscapedPem => (value.trim().to_string(), None),
        };
        let leaf = decode_pem_certificates(&leaf_pem)
            .map_err(malformed)?
            .into_iter()
            .next()
            .ok_or_else(|| malformed("no PEM certificate in it".into()))?;
        let intermediates: Vec<CertificateDer<'static>> = match chain_pem {
            Some(chain) => decode_pem_certificates(&chain)
                .map_err(malformed)?
                .into_iter()
                .filter(|c| c.as_ref() != leaf.as_ref())
                .collect(),
            None => Vec::new(),
        };
        let mut chain = vec![leaf];
        chain.extend(intermediates);
        Ok(chain)
    }

    /// [`Self::forwarded_chain`] for a gRPC request; a refusal is logged at warn with the
    /// peer's address and becomes `unauthenticated` with the refusal's message. The chain is
    /// then verified like a directly presented one.
    /// With the chain: how it was presented (by a proxy trusted by its certificate, or by
    /// address only).
    pub fn request_chain<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<(Vec<CertificateDer<'static>>, Presented), tonic::Status> {
        let certs = request.peer_certs();
        let peer = Peer {
            addr: request.remote_addr(),
            certificate: certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref()),
        };
        let values: Vec<&str> = request
            .metadata()
            .get_all(self.header.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let presented = if self.trusted_by_certificate(peer) {
            Presented::ByCertifiedProxy
        } else {
            Presented::ByProxyAddress
        };
        self.forwarded_chain(peer, &values)
            .map(|chain| (chain, presented))
            .map_err(|refusal| {
                let peer = peer.addr.map(|a| a.to_string()).unwrap_or_default();
                tracing::warn!(%peer, header = %self.header, "agent refused: {refusal}");
                tonic::Status::unauthenticated(refusal.to_string())
            })
    }
}

/// The fields of one XFCC element the hub uses (values unquoted, still url-encoded).
#[derive(Debug, Default, PartialEq, Eq)]
struct XfccElement {
    cert: Option<String>,
    chain: Option<String>,
}

/// The last element of an `x-forwarded-client-cert` value.
///
/// Why the last: every Envoy in the path appends (APPEND_FORWARD) or replaces with
/// (SANITIZE_SET) one element describing the client of *its* downstream connection, so the
/// last element is the one written by the proxy that connects to the hub — the only proxy the
/// trust rules vouch for. Earlier elements came from that proxy's own clients, which the hub
/// has no reason to believe.
fn last_xfcc_element(value: &str) -> Result<XfccElement, String> {
    let elements = split_outside_quotes(value, ',');
    let last = elements
        .iter()
        .rev()
        .find(|e| !e.trim().is_empty())
        .ok_or("the header is empty")?;
    let mut element = XfccElement::default();
    for pair in split_outside_quotes(last, ';') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let (key, raw) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not KEY=VALUE"))?;
        let value = unquote(raw.trim())?;
        match key.trim().to_ascii_lowercase().as_str() {
            "cert" => element.cert = Some(value),
            "chain" => element.chain = Some(value),
            // By, Hash, Subject, URI, DNS: the hub derives the identity from the certificate
            // itself, exactly as for a direct mutual-TLS connection.
            _ => {}
        }
    }
    Ok(element)
}

/// Splits at `separator` except inside double quotes (where `\"` and `\\` are escapes).
fn split_outside_quotes(s: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == separator && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A value as written (`abc`) or double-quoted (`"a\"b"`).
fn unquote(raw: &str) -> Result<String, String> {
    let Some(inner) = raw.strip_prefix('"') else {
        return Ok(raw.to_string());
    };
    let inner = inner
        .strip_suffix('"')
        .ok_or_else(|| format!("unterminated quoted value {raw:?}"))?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.extend(chars.next());
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// The certificates of a url-encoded PEM bundle.
fn decode_pem_certificates(encoded: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = percent_decode_str(encoded)
        .decode_utf8()
        .map_err(|_| "the url-decoded certificate is not text".to_string())?;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))
}

#[cfg(test)]
mod tests;
