//! Renewal by certificate over the unary Enroll call (item 9 of the stream contract): an
//! Enroll with an empty token from a client presenting a certificate this hub issued gets a
//! new certificate for that certificate's identity. It lets whoever holds an agent's key and
//! certificate (the operator, which wrote them to the agent's Secret) extend them without a
//! new token; the identity never changes and certificates of an external CA
//! (`--client-ca`) are not extended.

use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tonic::Status;

use crate::{
    agent_auth::{CertificateOrigin, ClientCertificates},
    agent_ca::{AgentCa, Issued},
};

/// Issues a certificate for the identity of the verified client certificate `chain` (leaf
/// first) and the key of `csr_pem`. Every refusal says what to do instead.
pub fn renew_by_certificate(
    clients: Option<&ClientCertificates>,
    ca: &AgentCa,
    lifetime: Duration,
    chain: &[CertificateDer<'_>],
    csr_pem: &str,
) -> Result<Issued, Status> {
    let Some(clients) = clients else {
        return Err(Status::failed_precondition(
            "this hub serves gRPC without TLS (--insecure-plaintext) and issues no \
             certificates; start it with TLS to enrol and renew agents",
        ));
    };
    let (identity, origin) = clients.verify(chain).map_err(|reason| {
        Status::unauthenticated(format!("renewal by certificate refused: {reason}"))
    })?;
    if origin != CertificateOrigin::Hub {
        return Err(Status::permission_denied(format!(
            "renewal by certificate extends certificates this hub issued, and the one for \
             identity {identity:?} was signed by the CA of --client-ca; enrol with a one-time \
             token instead (`scale-agent-hub agent-token create --identity {identity} \
             --accounts <pattern> --ttl 1h --once`)"
        )));
    }
    ca.issue(csr_pem, &identity, lifetime)
        .map_err(Status::invalid_argument)
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    use x509_parser::pem::parse_x509_pem;

    use super::*;

    const LIFETIME: Duration = Duration::from_secs(3600);

    /// A self-signed CA: (certificate PEM, key PEM).
    fn ca_pem(name: &str) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-signed");
        (cert.pem(), key.serialize_pem())
    }

    fn csr(name: &str) -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        let (_, pem) = parse_x509_pem(pem.as_bytes()).expect("pem");
        CertificateDer::from(pem.contents)
    }

    fn identity_of(pem: &str) -> String {
        scale_agent_hub_model::identity::identity_from_der(der(pem).as_ref()).expect("identity")
    }

    #[test]
    fn a_hub_issued_certificate_is_renewed_for_its_own_identity() {
        let (cert, key) = ca_pem("hub-agent-ca");
        let ca = AgentCa::from_pem(&cert, &key).expect("ca");
        let clients = ClientCertificates::new(cert.as_bytes(), None).expect("clients");
        let first = ca
            .issue(&csr("ignored"), "prod-eu", LIFETIME)
            .expect("issued");
        // The CSR asks for another name; the identity stays the certificate's.
        let renewed = renew_by_certificate(
            Some(&clients),
            &ca,
            LIFETIME,
            &[der(&first.certificate_pem)],
            &csr("someone-else"),
        )
        .expect("renewed");
        assert_eq!(renewed.identity, "prod-eu");
        assert_eq!(identity_of(&renewed.certificate_pem), "prod-eu");
        assert_ne!(renewed.certificate_pem, first.certificate_pem);
    }

    #[test]
    fn certificates_of_other_cas_and_plaintext_hubs_are_refused_with_what_to_do() {
        let (cert, key) = ca_pem("hub-agent-ca");
        let ca = AgentCa::from_pem(&cert, &key).expect("ca");
        let (external_cert, external_key) = ca_pem("operator-ca");
        let external = AgentCa::from_pem(&external_cert, &external_key).expect("external ca");
        let foreign = external
            .issue(&csr("x"), "prod-eu", LIFETIME)
            .expect("issued by the external CA");
        let chain = [der(&foreign.certificate_pem)];

        // Not trusted at all.
        let clients = ClientCertificates::new(cert.as_bytes(), None).expect("clients");
        let refused = renew_by_certificate(Some(&clients), &ca, LIFETIME, &chain, &csr("x"))
            .expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(
            refused.message().contains("agent-token create --once"),
            "{}",
            refused.message()
        );

        // Trusted by --client-ca, but only hub-issued certificates are renewed.
        let clients = ClientCertificates::new(cert.as_bytes(), Some(external_cert.as_bytes()))
            .expect("clients");
        let refused = renew_by_certificate(Some(&clients), &ca, LIFETIME, &chain, &csr("x"))
            .expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(
            refused.message().contains("--client-ca")
                && refused
                    .message()
                    .contains("agent-token create --identity prod-eu"),
            "{}",
            refused.message()
        );

        // A plaintext hub issues nothing.
        let refused =
            renew_by_certificate(None, &ca, LIFETIME, &chain, &csr("x")).expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("start it with TLS"),
            "{}",
            refused.message()
        );
    }
}
