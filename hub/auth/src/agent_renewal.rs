//! Renewal by certificate over the unary Enroll call (item 9 of the stream contract): an
//! Enroll with an empty token from a client presenting a certificate this hub issued gets a
//! new certificate for that certificate's identity. It lets whoever holds an agent's key and
//! certificate (the operator, which wrote them to the agent's Secret) extend them without a
//! new token; the identity never changes and certificates of an external CA
//! (`--client-ca`) are not extended.

use std::time::Duration;

use rustls::pki_types::CertificateDer;
use scale_agent_hub_model::{
    identity::certificate_serial,
    records::{AgentIdentityState, EnrolledIdentity},
};
use tonic::Status;

use crate::{
    agent_auth::{CertificateOrigin, ClientCertificates},
    agent_ca::{AgentCa, Issued},
    identity_states,
};

/// How long the certificates the hub issues live, and how long an enrolment may be
/// extended by renewals (issue 28, F4: a stolen key renews itself until then at most).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewalPolicy {
    /// `--agent-cert-lifetime`.
    pub lifetime: Duration,
    /// `--agent-max-enrolment-age`: no certificate of an enrolment outlives its enrolment
    /// by more than this; then the agent enrols again with a one-time token.
    pub max_enrolment_age: Duration,
}

fn time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2)
}

/// The lifetime of a renewed certificate of `identity`, or why it gets none: the identity
/// must be enabled, the certificate presented (serial `serial`) not denied, the identity
/// enrolled at this hub, and its enrolment younger than the policy's maximum age; the new
/// certificate ends by then at the latest.
pub fn renewal_lifetime(
    identity: &str,
    serial: Option<&str>,
    state: Option<&AgentIdentityState>,
    enrolled: Option<&EnrolledIdentity>,
    policy: RenewalPolicy,
    now_unix: i64,
) -> Result<Duration, Status> {
    identity_states::check(state, identity, serial).map_err(Status::permission_denied)?;
    let enrol_again = format!(
        "enrol the agent again with a one-time token (`scale-agent-hub agent-token create \
         --identity {identity} --accounts <pattern> --ttl 1h --once`)"
    );
    let Some(enrolled) = enrolled else {
        return Err(Status::permission_denied(format!(
            // troubleshooting: certificate renewal refused: gRPC `PERMISSION_DENIED`, `CertificateRenewal.refused`
            // The certificate was issued by the agent CA, but this hub has no record of the
            // identity's enrolment, so it cannot tell whether the enrolment still holds.
            "the hub holds no enrolment of identity {identity:?} (another hub sharing the agent \
             CA issued the certificate, or the store was rebuilt), so it renews nothing for it; \
             {enrol_again}"
        )));
    };
    let deadline = enrolled
        .enrolled
        .saturating_add(secs(policy.max_enrolment_age));
    let left = deadline.saturating_sub(now_unix);
    // Less than a minute left: a certificate that short is of no use to anyone.
    if left < 60 {
        return Err(Status::permission_denied(format!(
            "identity {identity:?} enrolled at {}, and certificates of one enrolment are \
             renewed until {} at most (--agent-max-enrolment-age); {enrol_again}",
            time(enrolled.enrolled),
            time(deadline)
        )));
    }
    let left = Duration::from_secs(u64::try_from(left).unwrap_or(0));
    Ok(policy.lifetime.min(left))
}

/// Issues a certificate for the identity of the verified client certificate `chain` (leaf
/// first) and the key of `csr_pem`, if [`renewal_lifetime`] allows one (`state` and
/// `enrolled` are looked up for the chain's identity). Every refusal says what to do
/// instead.
pub fn renew_by_certificate(
    clients: Option<&ClientCertificates>,
    ca: &AgentCa,
    policy: RenewalPolicy,
    chain: &[CertificateDer<'_>],
    csr_pem: &str,
    lookup: impl FnOnce(&str) -> (Option<AgentIdentityState>, Option<EnrolledIdentity>),
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
            // troubleshooting: certificate renewal refused: gRPC `PERMISSION_DENIED`
            // Renewal by certificate (Enroll without a token) extends hub-issued certificates only;
            // operator-signed certificates (`--client-ca`) are renewed by their own CA.
            "renewal by certificate extends certificates this hub issued, and the one for \
             identity {identity:?} was signed by the CA of --client-ca; enrol with a one-time \
             token instead (`scale-agent-hub agent-token create --identity {identity} \
             --accounts <pattern> --ttl 1h --once`)"
        )));
    }
    let serial = chain
        .first()
        .map(|leaf| certificate_serial(leaf.as_ref()))
        .transpose()
        .map_err(Status::unauthenticated)?;
    let (state, enrolled) = lookup(&identity);
    let lifetime = renewal_lifetime(
        &identity,
        serial.as_deref(),
        state.as_ref(),
        enrolled.as_ref(),
        policy,
        jiff::Timestamp::now().as_second(),
    )?;
    ca.issue(csr_pem, &identity, lifetime)
        .map_err(Status::invalid_argument)
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    use x509_parser::pem::parse_x509_pem;

    use super::*;

    const LIFETIME: Duration = Duration::from_secs(3600);
    const POLICY: RenewalPolicy = RenewalPolicy {
        lifetime: LIFETIME,
        max_enrolment_age: Duration::from_secs(365 * 24 * 3600),
    };

    /// An identity enrolled a moment ago, with no admin decision.
    fn enrolled_now(identity: &str) -> (Option<AgentIdentityState>, Option<EnrolledIdentity>) {
        (
            None,
            Some(EnrolledIdentity {
                identity: identity.to_string(),
                accounts: "*".into(),
                enrolled: jiff::Timestamp::now().as_second() - 10,
                token_id: "t".into(),
            }),
        )
    }

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
            POLICY,
            &[der(&first.certificate_pem)],
            &csr("someone-else"),
            enrolled_now,
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
        let refused =
            renew_by_certificate(Some(&clients), &ca, POLICY, &chain, &csr("x"), enrolled_now)
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
        let refused =
            renew_by_certificate(Some(&clients), &ca, POLICY, &chain, &csr("x"), enrolled_now)
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
        let refused = renew_by_certificate(None, &ca, POLICY, &chain, &csr("x"), enrolled_now)
            .expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("start it with TLS"),
            "{}",
            refused.message()
        );
    }

    #[test]
    fn renewals_stop_for_disabled_identities_denied_serials_and_old_enrolments() {
        let now = 1_000_000;
        let enrolled = |at: i64| EnrolledIdentity {
            identity: "prod".into(),
            accounts: "prod".into(),
            enrolled: at,
            token_id: "t".into(),
        };
        // Capped so that the certificate ends with the enrolment's maximum age.
        let policy = RenewalPolicy {
            lifetime: Duration::from_secs(30 * 24 * 3600),
            max_enrolment_age: Duration::from_secs(40 * 24 * 3600),
        };
        let lifetime =
            renewal_lifetime("prod", None, None, Some(&enrolled(now)), policy, now).unwrap();
        assert_eq!(lifetime, policy.lifetime);
        let late = now + 20 * 24 * 3600;
        let lifetime =
            renewal_lifetime("prod", None, None, Some(&enrolled(now)), policy, late).unwrap();
        assert_eq!(lifetime, Duration::from_secs(20 * 24 * 3600));
        let too_late = now + 40 * 24 * 3600;
        let refused = renewal_lifetime("prod", None, None, Some(&enrolled(now)), policy, too_late)
            .unwrap_err();
        assert!(
            refused.message().contains("--agent-max-enrolment-age")
                && refused.message().contains("--once"),
            "{}",
            refused.message()
        );
        // No enrolment at this hub: nothing.
        let refused = renewal_lifetime("prod", None, None, None, policy, now).unwrap_err();
        assert!(
            refused.message().contains("no enrolment"),
            "{}",
            refused.message()
        );
        // Disabled, or the presented certificate denied.
        let mut states = crate::identity_states::IdentityStates::default();
        states.deny_serial("prod", "ab", now);
        let state = states.get("prod").cloned();
        let refused = renewal_lifetime(
            "prod",
            Some("ab"),
            state.as_ref(),
            Some(&enrolled(now)),
            policy,
            now,
        )
        .unwrap_err();
        assert!(
            refused.message().contains("serial ab"),
            "{}",
            refused.message()
        );
        states.disable("prod", "", now);
        let state = states.get("prod").cloned();
        let refused = renewal_lifetime(
            "prod",
            Some("cd"),
            state.as_ref(),
            Some(&enrolled(now)),
            policy,
            now,
        )
        .unwrap_err();
        assert!(
            refused.message().contains("disabled"),
            "{}",
            refused.message()
        );
    }
}
