//! The agent's client certificate: issuing it from the ScaleAgent's CA, reading an existing
//! one back, and deciding when to renew it. Pure functions; no client.

use std::time::Duration;

use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use x509_parser::{certificate::X509Certificate, extensions::GeneralName, pem::parse_x509_pem};

/// A CA that signs agent client certificates, loaded from the issuer Secret.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate as PEM, written to the agent Secret's `ca.crt`.
    pub cert_pem: String,
    cert_der: Vec<u8>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// Why a CA could not be loaded; the text says what to fix in the issuer Secret.
pub type CaError = String;

impl Ca {
    /// Loads a CA from PEM certificate and PEM PKCS#8 private key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let (_, pem) = parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| format!("the CA certificate is not PEM ({e})"))?;
        let cert = pem
            .parse_x509()
            .map_err(|e| format!("the CA certificate does not parse ({e})"))?;
        if !cert.is_ca() {
            return Err("the certificate is not a CA (basicConstraints CA:TRUE is missing)".into());
        }
        let key = KeyPair::from_pem(key_pem).map_err(|e| {
            format!(
                "the CA private key does not load ({e}); it must be an unencrypted PKCS#8 PEM \
                 key ('BEGIN PRIVATE KEY'), convert it with `openssl pkcs8 -topk8 -nocrypt`"
            )
        })?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| format!("the CA certificate and key do not form an issuer ({e})"))?;
        Ok(Self {
            issuer,
            cert_pem: cert_pem.to_owned(),
            cert_der: pem.contents.clone(),
        })
    }

    /// Issues a client certificate for `identity` (common name and DNS SAN), valid from
    /// `now_unix` for `lifetime`, with a fresh ECDSA P-256 key serialised as PKCS#8 PEM.
    pub fn issue(
        &self,
        identity: &str,
        lifetime: Duration,
        now_unix: i64,
    ) -> Result<IssuedCertificate, String> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, identity);
        let san = identity
            .try_into()
            .map_err(|e| format!("identity '{identity}' is not a DNS name ({e})"))?;
        params.subject_alt_names = vec![SanType::DnsName(san)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let now = u64::try_from(now_unix).map_err(|_| "the clock is before 1970".to_owned())?;
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        params.not_before = epoch + Duration::from_secs(now);
        params.not_after = epoch + Duration::from_secs(now) + lifetime;
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| e.to_string())?;
        let lifetime_secs = i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX);
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            info: CertificateInfo {
                common_name: Some(identity.to_owned()),
                dns_names: vec![identity.to_owned()],
                not_before: now_unix,
                not_after: now_unix.saturating_add(lifetime_secs),
            },
        })
    }

    /// Whether `cert_pem` was signed by this CA.
    pub fn signed(&self, cert_pem: &str) -> bool {
        let Ok((_, ca)) = x509_parser::parse_x509_certificate(&self.cert_der) else {
            return false;
        };
        let Ok((_, pem)) = parse_x509_pem(cert_pem.as_bytes()) else {
            return false;
        };
        let Ok(cert) = pem.parse_x509() else {
            return false;
        };
        cert.verify_signature(Some(ca.public_key())).is_ok()
    }
}

/// A freshly issued certificate and key.
#[derive(Clone, Debug)]
pub struct IssuedCertificate {
    /// PEM certificate.
    pub cert_pem: String,
    /// PEM PKCS#8 private key.
    pub key_pem: String,
    /// What the certificate says.
    pub info: CertificateInfo,
}

/// What the operator reads back from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// Subject common name.
    pub common_name: Option<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
}

impl CertificateInfo {
    /// When to renew: when a third of the lifetime remains.
    pub fn renew_at(&self) -> i64 {
        let lifetime = self.not_after.saturating_sub(self.not_before).max(0);
        self.not_after - lifetime / 3
    }

    /// Whether the certificate names `identity` as its common name and only DNS name.
    pub fn has_identity(&self, identity: &str) -> bool {
        self.common_name.as_deref() == Some(identity) && self.dns_names == [identity]
    }
}

/// Parses a PEM certificate; `None` when it is not one.
pub fn parse(cert_pem: &str) -> Option<CertificateInfo> {
    let (_, pem) = parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(info(&cert))
}

fn info(cert: &X509Certificate<'_>) -> CertificateInfo {
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    let dns_names = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    CertificateInfo {
        common_name,
        dns_names,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    }
}

/// Whether the private key PEM is PKCS#8 (`BEGIN PRIVATE KEY`).
pub fn is_pkcs8_pem(key_pem: &str) -> bool {
    key_pem
        .trim_start()
        .starts_with("-----BEGIN PRIVATE KEY-----")
}

/// What to do with the certificate found in the agent's Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep it; renew at the given Unix time.
    Keep(CertificateInfo),
    /// Issue a new one, for the given reason (for the Event).
    Issue(&'static str),
}

/// Decides whether the existing certificate (and key) may stay.
pub fn decide(
    ca: &Ca,
    existing_cert: Option<&str>,
    existing_key: Option<&str>,
    identity: &str,
    now_unix: i64,
) -> Decision {
    let (Some(cert_pem), Some(key_pem)) = (existing_cert, existing_key) else {
        return Decision::Issue("NoCertificate");
    };
    let Some(info) = parse(cert_pem) else {
        return Decision::Issue("UnreadableCertificate");
    };
    if !is_pkcs8_pem(key_pem) {
        return Decision::Issue("KeyNotPkcs8");
    }
    if !info.has_identity(identity) {
        return Decision::Issue("IdentityChanged");
    }
    if !ca.signed(cert_pem) {
        return Decision::Issue("IssuerChanged");
    }
    if now_unix >= info.renew_at() {
        return Decision::Issue("RenewalDue");
    }
    Decision::Keep(info)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{BasicConstraints, IsCa};

    pub(crate) fn test_ca(name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn issues_a_client_certificate_with_the_identity() {
        let (cert, key) = test_ca("agents");
        let ca = Ca::from_pem(&cert, &key).unwrap();
        let issued = ca
            .issue("prod.spinnaker", Duration::from_secs(3600), NOW)
            .unwrap();
        assert!(is_pkcs8_pem(&issued.key_pem));
        let info = parse(&issued.cert_pem).unwrap();
        assert_eq!(info, issued.info);
        assert!(info.has_identity("prod.spinnaker"));
        assert_eq!(info.not_after - info.not_before, 3600);
        assert_eq!(info.renew_at(), NOW + 2400);
        assert!(ca.signed(&issued.cert_pem));
        let (other_cert, other_key) = test_ca("other");
        let other = Ca::from_pem(&other_cert, &other_key).unwrap();
        assert!(!other.signed(&issued.cert_pem));
    }

    #[test]
    fn decides_when_to_renew() {
        let (cert, key) = test_ca("agents");
        let ca = Ca::from_pem(&cert, &key).unwrap();
        let issued = ca.issue("a.ns", Duration::from_secs(300), NOW).unwrap();
        let decide_at = |now, identity| {
            decide(
                &ca,
                Some(&issued.cert_pem),
                Some(&issued.key_pem),
                identity,
                now,
            )
        };
        assert_eq!(
            decide_at(NOW + 10, "a.ns"),
            Decision::Keep(issued.info.clone())
        );
        assert_eq!(
            decide_at(NOW + 199, "a.ns"),
            Decision::Keep(issued.info.clone())
        );
        assert_eq!(decide_at(NOW + 200, "a.ns"), Decision::Issue("RenewalDue"));
        assert_eq!(decide_at(NOW, "b.ns"), Decision::Issue("IdentityChanged"));
        assert_eq!(
            decide(&ca, None, None, "a.ns", NOW),
            Decision::Issue("NoCertificate")
        );
        let (other_cert, other_key) = test_ca("rotated");
        let rotated = Ca::from_pem(&other_cert, &other_key).unwrap();
        assert_eq!(
            decide(
                &rotated,
                Some(&issued.cert_pem),
                Some(&issued.key_pem),
                "a.ns",
                NOW
            ),
            Decision::Issue("IssuerChanged")
        );
    }

    #[test]
    fn rejects_bad_issuers_with_a_hint() {
        let (cert, key) = test_ca("agents");
        assert!(Ca::from_pem("nope", &key).unwrap_err().contains("PEM"));
        assert!(Ca::from_pem(&cert, "nope").unwrap_err().contains("PKCS#8"));
        let ca = Ca::from_pem(&cert, &key).unwrap();
        let leaf = ca.issue("leaf", Duration::from_secs(60), NOW).unwrap();
        assert!(
            Ca::from_pem(&leaf.cert_pem, &leaf.key_pem)
                .unwrap_err()
                .contains("not a CA")
        );
    }
}
