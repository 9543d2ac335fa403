//! Enrolment with the hub (`spec.enrolment`): the operator makes the agent's key, trades a
//! one-time enrolment token and a CSR for a certificate the hub issues (the Enroll RPC), and
//! renews it before expiry by presenting the current certificate with an empty token (item 9
//! of the stream contract). The hub, not this cluster, chooses the identity.
//!
//! The decisions and messages are pure functions; [`enroll`] is the one network call.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rcgen::{CertificateParams, DnType, KeyPair};
use scale_agent_proto::v1::{EnrollRequest, IssuedCertificate, agent_hub_client::AgentHubClient};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use x509_parser::pem::parse_x509_pem;

use crate::{
    error::Chain,
    pki::{self, CertificateInfo},
};

/// Annotation on the agent's TLS Secret when the hub issued its certificate; a certificate
/// without it (operator-signed, from before a switch to enrolment) is replaced by enrolling.
pub const ISSUED_BY_ANNOTATION: &str = "scaleagent.dev/issued-by";
/// The value of [`ISSUED_BY_ANNOTATION`] for hub-issued certificates.
pub const ISSUED_BY_HUB: &str = "hub";

/// How long one Enroll call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// What the agent's TLS Secret holds, as the enrolment sees it.
#[derive(Clone, Debug, Default)]
pub struct Current<'a> {
    pub cert_pem: Option<&'a str>,
    pub key_pem: Option<&'a str>,
    pub ca_pem: Option<&'a str>,
    /// Whether the Secret carries [`ISSUED_BY_ANNOTATION`] = hub.
    pub hub_issued: bool,
}

/// What to do with the agent's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep it until its renewal time.
    Keep(CertificateInfo),
    /// Renew it by certificate (a third of its lifetime is left, and it is still valid).
    Renew(CertificateInfo),
    /// Enrol with the token, for the given reason.
    Enrol(&'static str),
}

/// Decides from the current Secret: keep a hub-issued certificate that its CA signed, with
/// its key, until 2/3 of its lifetime; renew it until it expires; otherwise enrol.
pub fn decide(current: &Current<'_>, now: i64) -> Decision {
    let (Some(cert), Some(key), Some(ca)) = (current.cert_pem, current.key_pem, current.ca_pem)
    else {
        return Decision::Enrol("NoCertificate");
    };
    if !current.hub_issued {
        return Decision::Enrol("NotIssuedByHub");
    }
    let Some(info) = pki::parse(cert) else {
        return Decision::Enrol("UnreadableCertificate");
    };
    if !signed_by(cert, ca) || !key_matches(cert, key) {
        return Decision::Enrol("CertificateNotFromHubCa");
    }
    if now >= info.not_after {
        return Decision::Enrol("Expired");
    }
    if now >= info.renew_at() {
        return Decision::Renew(info);
    }
    Decision::Keep(info)
}

/// Whether `cert_pem`'s signature verifies with the first certificate of `ca_pem`.
pub fn signed_by(cert_pem: &str, ca_pem: &str) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        parse_x509_pem(cert_pem.as_bytes()),
        parse_x509_pem(ca_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok(cert), Ok(ca)) = (cert.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// Whether `key_pem` is the private key of `cert_pem`.
fn key_matches(cert_pem: &str, key_pem: &str) -> bool {
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    let Ok((_, cert)) = parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = cert.parse_x509() else {
        return false;
    };
    cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw()
}

/// A new key (PKCS#8 PEM) and a CSR for it (PEM). The hub ignores the CSR's names; the
/// common name only helps someone reading the request.
pub fn key_and_csr(common_name: &str) -> Result<(String, String), String> {
    let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let csr = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(|e| format!("cannot make a CSR: {e}"))?;
    Ok((key.serialize_pem(), csr))
}

/// The version of a token Secret the operator presents at most once: `<uid>/<resourceVersion>`
/// (the uid, so a deleted and re-created Secret counts as new).
pub fn token_version(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.uid().unwrap_or_default(),
        secret.resource_version().unwrap_or_default()
    )
}

/// Where to reach the hub, and how to verify it.
#[derive(Clone, Debug)]
pub struct HubEndpoint {
    /// host:port.
    pub address: String,
    /// Name to verify in the hub's certificate; the host of `address` when unset.
    pub server_name: Option<String>,
    /// PEM CA of the hub's serving certificate; the public web PKI roots when unset.
    pub ca_pem: Option<String>,
}

/// Why an Enroll call did not give a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The hub answered with a refusal: its gRPC code and message.
    Refused { code: tonic::Code, message: String },
    /// The call did not reach the hub, or the hub's answer could not be used.
    Unreachable(String),
}

impl Failure {
    /// Whether the hub saw the token (so presenting it again cannot succeed).
    pub fn token_seen(&self) -> bool {
        matches!(self, Failure::Refused { code, .. } if *code != tonic::Code::Unavailable)
    }
}

/// Calls the hub's Enroll: with `token` (enrolment), or with an empty token and `client`
/// (certificate PEM, key PEM) as the TLS client identity (renewal by certificate).
pub async fn enroll(
    hub: &HubEndpoint,
    token: &str,
    csr_pem: &str,
    client: Option<(&str, &str)>,
) -> Result<IssuedCertificate, Failure> {
    let unreachable = |what: &str, e: &dyn std::fmt::Display| {
        Failure::Unreachable(format!("{what} {}: {e}", hub.address))
    };
    let url = format!("https://{}", hub.address);
    let endpoint = Endpoint::from_shared(url)
        .map_err(|e| unreachable("invalid hub address", &e))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(CALL_TIMEOUT);
    let host = endpoint.uri().host().unwrap_or_default().to_owned();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut tls = ClientTlsConfig::new().domain_name(hub.server_name.clone().unwrap_or(host));
    tls = match &hub.ca_pem {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
        None => tls.with_webpki_roots(),
    };
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = endpoint
        .tls_config(tls)
        .map_err(|e| unreachable("TLS settings for", &Chain(&e).to_string()))?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| unreachable("cannot connect to the hub at", &Chain(&e).to_string()))?;
    let response = AgentHubClient::new(channel)
        .enroll(EnrollRequest {
            token: token.to_owned(),
            csr_pem: csr_pem.to_owned(),
        })
        .await
        .map_err(|status| match status.code() {
            // A transport failure surfaces as Unavailable or Unknown with a source chain.
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                unreachable("the call failed at", &describe_status(&status))
            }
            code => Failure::Refused {
                code,
                message: status.message().to_owned(),
            },
        })?;
    response
        .into_inner()
        .certificate
        .ok_or_else(|| Failure::Unreachable("the hub answered without a certificate".into()))
}

/// A failed call on one line: the status's message, then its causes. (`Status`'s Display
/// also prints its cause in Debug form, so [`Chain`] over the status would say it twice.)
fn describe_status(status: &tonic::Status) -> String {
    let cause = std::error::Error::source(status).map(|cause| Chain(cause).to_string());
    match (status.message(), cause) {
        ("", None) => status.code().to_string(),
        ("", Some(cause)) => cause,
        (message, None) => message.to_owned(),
        (message, Some(cause)) => format!("{message}: {cause}"),
    }
}

/// The commands that give the ScaleAgent a new token, for messages.
pub fn new_token_hint(namespace: &str, secret: &str, key: &str, identity: &str) -> String {
    format!(
        "issue a new one on the hub (`scale-agent-hub agent-token create --identity {identity} \
         --accounts <pattern> --ttl 1h --once`) and put it in the Secret (`kubectl -n \
         {namespace} create secret generic {secret} --from-literal={key}=<token> \
         --dry-run=client -o yaml | kubectl apply -f -`)"
    )
}

/// The condition message of an enrolment that did not give a certificate.
pub fn failure_message(
    failure: &Failure,
    hub_address: &str,
    namespace: &str,
    secret: &str,
    key: &str,
) -> String {
    match failure {
        Failure::Refused { code, message } => format!(
            // troubleshooting: ScaleAgent `Degraded=True`, reason `EnrolmentRefused`
            // The message carries the hub's own reason (used before, expired, unknown, or outside
            // the identity's account pattern; see the hub's section below). The operator does not
            // present that token again: issue a new one-time token on the hub and put it in the
            // Secret the ScaleAgent names; the operator enrols again.
            "the hub refused the enrolment token in Secret {namespace}/{secret} ({code:?}): \
             {message}; the operator does not present that token again: {}",
            new_token_hint(namespace, secret, key, "<identity>")
        ),
        Failure::Unreachable(reason) => format!(
            // troubleshooting: ScaleAgent `Degraded=True`, reason `EnrolmentRefused` (no hub)
            // The operator could not reach the hub to enrol the agent (DNS, network, TLS: the hub's
            // certificate must verify with the CA of `spec.hub.tls`). It retries with backoff.
            "enrolment with the hub at {hub_address} failed: {reason}; check spec.hub.address \
             and spec.hub.tls (caSecretRef, serverName); the operator retries with backoff"
        ),
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, IsCa, Issuer, KeyUsagePurpose, PublicKeyData, SanType};

    use super::*;

    #[test]
    fn a_failed_call_names_its_cause_once() {
        let cause =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let mut status = tonic::Status::unavailable("transport error");
        status.set_source(std::sync::Arc::new(cause));
        assert_eq!(
            describe_status(&status),
            "transport error: connection refused"
        );
        assert_eq!(
            describe_status(&tonic::Status::unavailable("")),
            tonic::Code::Unavailable.to_string()
        );
    }

    /// A CA and a certificate it signed for `identity` valid over [not_before, not_after]
    /// (Unix seconds): (ca PEM, cert PEM, key PEM).
    fn issued(identity: &str, not_before: i64, not_after: i64) -> (String, String, String) {
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::default();
        ca.distinguished_name.push(DnType::CommonName, "hub-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, identity);
        params.subject_alt_names = vec![SanType::DnsName(identity.try_into().expect("dns"))];
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        params.not_before = epoch + Duration::from_secs(not_before as u64);
        params.not_after = epoch + Duration::from_secs(not_after as u64);
        let cert = params.signed_by(&key, &issuer).expect("cert");
        (ca_cert.pem(), cert.pem(), key.serialize_pem())
    }

    fn current<'a>(ca: &'a str, cert: &'a str, key: &'a str) -> Current<'a> {
        Current {
            cert_pem: Some(cert),
            key_pem: Some(key),
            ca_pem: Some(ca),
            hub_issued: true,
        }
    }

    #[test]
    fn a_hub_issued_certificate_is_kept_then_renewed_then_replaced_by_enrolment() {
        let (ca, cert, key) = issued("prod-eu", 1_000, 1_900);
        let now_keep = 1_500;
        assert!(matches!(
            decide(&current(&ca, &cert, &key), now_keep),
            Decision::Keep(_)
        ));
        // Renewal from 2/3 of the lifetime: 1000 + 600.
        assert!(matches!(
            decide(&current(&ca, &cert, &key), 1_600),
            Decision::Renew(_)
        ));
        assert_eq!(
            decide(&current(&ca, &cert, &key), 1_900),
            Decision::Enrol("Expired")
        );
    }

    #[test]
    fn missing_foreign_or_mismatched_material_means_enrolment() {
        let (ca, cert, key) = issued("prod-eu", 1_000, 1_900);
        let (other_ca, _, other_key) = issued("prod-eu", 1_000, 1_900);
        assert_eq!(
            decide(&Current::default(), 1_500),
            Decision::Enrol("NoCertificate")
        );
        let mut operator_signed = current(&ca, &cert, &key);
        operator_signed.hub_issued = false;
        assert_eq!(
            decide(&operator_signed, 1_500),
            Decision::Enrol("NotIssuedByHub")
        );
        assert_eq!(
            decide(&current(&other_ca, &cert, &key), 1_500),
            Decision::Enrol("CertificateNotFromHubCa")
        );
        assert_eq!(
            decide(&current(&ca, &cert, &other_key), 1_500),
            Decision::Enrol("CertificateNotFromHubCa")
        );
        assert_eq!(
            decide(&current(&ca, "not a certificate", &key), 1_500),
            Decision::Enrol("UnreadableCertificate")
        );
    }

    #[test]
    fn the_csr_is_for_the_new_key() {
        let (key, csr) = key_and_csr("prod.scale-agent").expect("csr");
        assert!(pki::is_pkcs8_pem(&key));
        let params = rcgen::CertificateSigningRequestParams::from_pem(&csr).expect("parses");
        let key = KeyPair::from_pem(&key).expect("key");
        assert_eq!(params.public_key.der_bytes(), key.der_bytes());
    }

    #[test]
    fn refusals_say_what_to_do() {
        let refused = Failure::Refused {
            code: tonic::Code::PermissionDenied,
            message: "enrolment token abc was already used".into(),
        };
        assert!(refused.token_seen());
        let message = failure_message(&refused, "hub:9091", "team", "enrol", "token");
        assert!(message.contains("already used"), "{message}");
        assert!(message.contains("agent-token create"), "{message}");
        assert!(
            message.contains("kubectl -n team create secret generic enrol --from-literal=token="),
            "{message}"
        );
        let unreachable = Failure::Unreachable("connection refused".into());
        assert!(!unreachable.token_seen());
        let message = failure_message(&unreachable, "hub:9091", "team", "enrol", "token");
        assert!(
            message.contains("hub:9091") && message.contains("spec.hub.address"),
            "{message}"
        );
    }
}
