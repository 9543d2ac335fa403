//! The hub's own CA for agent client certificates. Its key never leaves the hub: it is made at
//! first start in the data directory (mode 0600) or read from files the flags name (a Secret in
//! Spinnaker's cluster). Agents get certificates from it by enrolment (a one-time token and a
//! CSR) and renew them over their stream; the identity inside is always the one the hub
//! chose, never a name from the CSR.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use scale_agent_hub_model::error::{HubError, Result};
use x509_parser::pem::parse_x509_pem;

/// File names of a CA made in the data directory.
pub const CA_CERT_FILE: &str = "agent-ca.crt";
pub const CA_KEY_FILE: &str = "agent-ca.key";
/// Lifetime of a CA the hub makes itself.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Where the hub's CA comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AgentCaSource {
    /// `<data-dir>/agent-ca.crt` and `agent-ca.key`, made at first start.
    #[default]
    DataDir,
    /// A certificate and a PKCS#8 key given by flags (for example a mounted Secret).
    Files { cert: PathBuf, key: PathBuf },
}

/// A certificate the hub issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub certificate_pem: String,
    pub identity: String,
    /// Unix seconds.
    pub not_after: i64,
    /// The certificate's serial number (lowercase hex, as `agent deny-certificate` takes
    /// it): random, so that each certificate can be denied on its own.
    pub serial: String,
}

/// The CA.
pub struct AgentCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: Vec<u8>,
}

impl std::fmt::Debug for AgentCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentCa").finish_non_exhaustive()
    }
}

impl AgentCa {
    /// Loads the CA from its source, making it first when the source is the data directory and
    /// it has none yet.
    pub fn load(source: &AgentCaSource, data_dir: &Path) -> Result<Self> {
        let (cert, key) = match source {
            AgentCaSource::Files { cert, key } => (cert.clone(), key.clone()),
            AgentCaSource::DataDir => {
                let cert = data_dir.join(CA_CERT_FILE);
                let key = data_dir.join(CA_KEY_FILE);
                match (cert.exists(), key.exists()) {
                    (false, false) => {
                        Self::create(&cert, &key)?;
                        tracing::info!(cert = %cert.display(), "created the hub's agent CA (its key stays in the data directory)");
                    }
                    (true, true) => {}
                    _ => {
                        // A new CA would silently invalidate every certificate issued so far.
                        return Err(HubError::Config(format!(
                            "the data directory holds only one of {} and {}: restore the \
                             missing one (certificates the hub issued depend on that CA), or \
                             remove both to make a new CA (every agent then enrols again)",
                            cert.display(),
                            key.display()
                        )));
                    }
                }
                (cert, key)
            }
        };
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| HubError::ReadFile {
                path: path.to_path_buf(),
                source,
            })
        };
        Self::from_pem(&read(&cert)?, &read(&key)?).map_err(|message| {
            HubError::Config(format!(
                "the agent CA ({} and {}): {message}",
                cert.display(),
                key.display()
            ))
        })
    }

    fn create(cert: &Path, key: &Path) -> Result<()> {
        let made = (|| {
            let key_pair = KeyPair::generate()?;
            let mut params = CertificateParams::default();
            params
                .distinguished_name
                .push(DnType::CommonName, "scale-agent-hub agent CA");
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let now = jiff::Timestamp::now().as_second();
            let epoch = rcgen::date_time_ymd(1970, 1, 1);
            params.not_before = epoch + since_epoch(now - 300);
            params.not_after = epoch + since_epoch(now + secs(CA_LIFETIME));
            let cert = params.self_signed(&key_pair)?;
            Ok::<_, rcgen::Error>((cert.pem(), key_pair.serialize_pem()))
        })()
        .map_err(|e| HubError::Config(format!("cannot make the agent CA: {e}")))?;
        let write = |path: &Path, bytes: &[u8]| {
            scale_agent_runtime::write_private(path, bytes).map_err(|source| HubError::Io {
                context: format!("cannot write {}", path.display()),
                source,
            })
        };
        write(key, made.1.as_bytes())?;
        write(cert, made.0.as_bytes())
    }

    /// A CA from PEM certificate and PEM PKCS#8 key; the message says what is wrong.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, String> {
        let (_, pem) = parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| format!("the certificate is not PEM ({e})"))?;
        let cert = pem
            .parse_x509()
            .map_err(|e| format!("the certificate does not parse ({e})"))?;
        if !cert.is_ca() {
            return Err("the certificate is not a CA (basicConstraints CA:TRUE is missing)".into());
        }
        let key = KeyPair::from_pem(key_pem).map_err(|e| {
            format!(
                "the private key does not load ({e}); it must be an unencrypted PKCS#8 PEM key \
                 ('BEGIN PRIVATE KEY')"
            )
        })?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| format!("the certificate and key do not form an issuer ({e})"))?;
        Ok(AgentCa {
            issuer,
            cert_pem: cert_pem.to_string(),
            cert_der: pem.contents.clone(),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Issues a client certificate for `identity` (DNS SAN and common name) for the key of a
    /// PKCS#10 CSR. The CSR's signature must verify (its holder has the key); its subject and
    /// names are ignored.
    pub fn issue(
        &self,
        csr_pem: &str,
        identity: &str,
        lifetime: Duration,
    ) -> Result<Issued, String> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| {
            // troubleshooting: enrolment refused: gRPC `INVALID_ARGUMENT`
            // The agent's certificate signing request does not parse or its signature does not
            // verify (a corrupted or hand-made request); the agent makes one itself.
            format!("the CSR is not a valid PEM PKCS#10 request with a verifying signature ({e})")
        })?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, identity);
        let san = identity
            .try_into()
            .map_err(|e| format!("identity {identity:?} is not a DNS name ({e})"))?;
        params.subject_alt_names = vec![SanType::DnsName(san)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let now = jiff::Timestamp::now().as_second();
        // Only hubs verify these certificates, with their own clocks: a few seconds of
        // back-dating absorb the skew between hub replicas, and keep not_before close to the
        // issue time, which agents count their renewal (at 2/3 of the lifetime) from.
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        params.not_before = epoch + since_epoch(now - 5);
        let not_after = now + secs(lifetime);
        params.not_after = epoch + since_epoch(not_after);
        // rcgen's default serial is a hash of the public key: a renewal with the same key
        // would repeat it. A random one (MSB clear: a positive integer of 16 bytes).
        let mut serial = crate::tokens::random_bytes::<16>()
            .map_err(|e| format!("cannot draw a serial number ({e})"))?;
        serial[0] &= 0x7f;
        serial[0] |= 0x01;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| format!("cannot sign the certificate ({e})"))?;
        let serial = scale_agent_hub_model::identity::certificate_serial(cert.der())?;
        Ok(Issued {
            certificate_pem: cert.pem(),
            identity: identity.to_string(),
            not_after,
            serial,
        })
    }
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2)
}

/// The duration since the Unix epoch (rcgen's dates are the epoch plus a duration).
fn since_epoch(unix: i64) -> Duration {
    Duration::from_secs(u64::try_from(unix).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use scale_agent_hub_model::identity::identity_from_der;

    #[test]
    fn issues_for_the_identity_it_chose_not_the_csr_names() {
        let dir = std::env::temp_dir().join(format!("agent-ca-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = AgentCa::load(&AgentCaSource::DataDir, &dir).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Loading again keeps the same CA.
        let again = AgentCa::load(&AgentCaSource::DataDir, &dir).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());

        let key = KeyPair::generate().unwrap();
        let csr = CertificateParams::new(vec!["admin.evil".to_string()])
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let issued = ca
            .issue(&csr, "prod-agent", Duration::from_secs(3600))
            .unwrap();
        let (_, pem) = parse_x509_pem(issued.certificate_pem.as_bytes()).unwrap();
        assert_eq!(identity_from_der(&pem.contents).unwrap(), "prod-agent");
        let cert = pem.parse_x509().unwrap();
        let (_, ca_cert) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
        assert!(cert.verify_signature(Some(ca_cert.public_key())).is_ok());
        assert!(!format!("{:?}", cert.subject_alternative_name()).contains("evil"));
        assert!((issued.not_after - jiff::Timestamp::now().as_second() - 3600).abs() < 5);

        let err = ca
            .issue("not a csr", "prod-agent", Duration::from_secs(60))
            .unwrap_err();
        assert!(err.contains("PKCS#10"), "{err}");

        // Half a CA is not replaced by a new one.
        std::fs::remove_file(dir.join(CA_CERT_FILE)).unwrap();
        let err = AgentCa::load(&AgentCaSource::DataDir, &dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("restore the missing one"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
