//! The agent's credentials from the hub: its bearer token (`clouddriver.auth.tokenFile` or
//! Armory's literal `clouddriver.auth.token`), and enrolment: with
//! `clouddriver.auth.enrolmentTokenFile` set, an agent without a valid client certificate
//! makes a key, trades the one-time token and a CSR for a certificate the hub issues, and
//! renews it over its stream at two thirds of its lifetime.
//!
//! The key and certificate are kept in files (`clouddriver.tls.clientKeyFile` and
//! `clientCertFile`), not only in memory: the enrolment token works once, so an agent that
//! restarted with its certificate in memory only could not get back in. Every connection
//! reads them from disk, so a renewed certificate is used from the next connection on.

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use rcgen::{CertificateParams, KeyPair};
use scale_agent_crds::agent_config::HubConnection;
use scale_agent_proto::v1::{self as pb, agent_hub_client::AgentHubClient};

use crate::{
    error::{Error, Result},
    hub_conn::{connect_with, describe_hub_error},
};

/// Where an enrolled agent keeps its key and certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateFiles {
    pub token: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertificateFiles {
    /// Set when the config asks for enrolment; the error says what else to set.
    pub fn from_config(hub: &HubConnection) -> Result<Option<Self>> {
        let Some(token) = &hub.auth.enrolment_token_file else {
            return Ok(None);
        };
        match (&hub.tls.client_cert_file, &hub.tls.client_key_file) {
            (Some(cert), Some(key)) => Ok(Some(CertificateFiles {
                token: token.into(),
                cert: cert.into(),
                key: key.into(),
            })),
            _ => Err(Error::InvalidConfig(
                "clouddriver.auth.enrolmentTokenFile needs clouddriver.tls.clientCertFile and \
                 clientKeyFile: the files (in a writable directory) where the agent keeps the \
                 key it makes and the certificate the hub issues"
                    .into(),
            )),
        }
    }
}

/// Validity of a PEM certificate, Unix seconds.
fn validity(cert_pem: &[u8]) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some((
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    ))
}

/// When to renew a certificate: at two thirds of its lifetime.
pub fn renew_at(cert_pem: &[u8]) -> Option<i64> {
    let (not_before, not_after) = validity(cert_pem)?;
    Some(not_before + (not_after - not_before) * 2 / 3)
}

/// Whether the files hold a key and a certificate that has not expired.
pub fn has_valid_certificate(files: &CertificateFiles) -> bool {
    let (Ok(cert), true) = (std::fs::read(&files.cert), files.key.exists()) else {
        return false;
    };
    validity(&cert).is_some_and(|(_, not_after)| not_after > Timestamp::now().as_second())
}

/// A new key (PKCS#8 PEM) and a CSR for it. The CSR names nothing: the hub chooses the
/// identity.
pub fn key_and_csr() -> Result<(String, String)> {
    let failed = |e: rcgen::Error| Error::Enrolment(format!("cannot make a key and CSR: {e}"));
    let key = KeyPair::generate().map_err(failed)?;
    let csr = CertificateParams::default()
        .serialize_request(&key)
        .map_err(failed)?
        .pem()
        .map_err(failed)?;
    Ok((key.serialize_pem(), csr))
}

/// Writes `bytes` to `path` atomically, readable by the owner only, making its directory
/// if needed (an emptyDir's subdirectory on the first enrolment).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    scale_agent_runtime::write_private(path, bytes)
}

/// Keeps a key and its certificate: the key first, so a certificate on disk always has its
/// key beside it.
pub fn store(files: &CertificateFiles, key_pem: &str, cert_pem: &str) -> Result<()> {
    for (path, bytes) in [(&files.key, key_pem), (&files.cert, cert_pem)] {
        write_private(path, bytes.as_bytes()).map_err(|e| {
            Error::Enrolment(format!(
                "cannot write {} ({e}); clouddriver.tls.clientCertFile and clientKeyFile must be \
                 in a writable directory",
                path.display()
            ))
        })?;
    }
    Ok(())
}

/// Enrols when the files hold no valid certificate; does nothing otherwise.
pub async fn ensure_certificate(hub: &HubConnection, files: &CertificateFiles) -> Result<()> {
    if has_valid_certificate(files) {
        return Ok(());
    }
    let token = std::fs::read_to_string(&files.token).map_err(|e| {
        Error::Enrolment(format!(
            "the agent has no valid client certificate and cannot read its enrolment token \
             {} ({e}): set clouddriver.auth.enrolmentTokenFile to a file holding a one-time \
             token (`scale-agent-hub agent-token create --once`)",
            files.token.display()
        ))
    })?;
    let (key_pem, csr_pem) = key_and_csr()?;
    let channel = connect_with(hub, false).await?;
    let answer = AgentHubClient::new(channel)
        .enroll(pb::EnrollRequest {
            token: token.trim().to_string(),
            csr_pem,
        })
        .await
        .map_err(|status| {
            Error::Enrolment(format!(
                "the hub refused the enrolment ({:?}): {}. Put a new one-time token (`scale-agent-hub \
                 agent-token create --once`) into {}",
                status.code(),
                if status.message().is_empty() {
                    describe_hub_error(&status)
                } else {
                    status.message().to_string()
                },
                files.token.display()
            ))
        })?
        .into_inner();
    let certificate = answer
        .certificate
        .ok_or_else(|| Error::Enrolment("the hub answered Enroll without a certificate".into()))?;
    store(files, &key_pem, &certificate.certificate_chain_pem)?;
    tracing::info!(identity = %certificate.identity, not_after = certificate.not_after_unix, cert = %files.cert.display(), "enrolled with the hub: certificate issued");
    Ok(())
}

/// The bearer token to present, read now: `tokenFile` first, else the literal `token`.
pub fn bearer_token(hub: &HubConnection) -> Result<Option<String>> {
    if let Some(path) = &hub.auth.token_file {
        let token = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            what: "agent token (clouddriver.auth.tokenFile)",
            path: path.into(),
            source,
        })?;
        return Ok(Some(token.trim().to_string()).filter(|t| !t.is_empty()));
    }
    Ok(hub.auth.token.clone().filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_keys_and_renewal_times() {
        let mut hub = HubConnection::default();
        assert_eq!(CertificateFiles::from_config(&hub).unwrap(), None);
        hub.auth.enrolment_token_file = Some("/t".into());
        let err = CertificateFiles::from_config(&hub).unwrap_err().to_string();
        assert!(err.contains("clientCertFile"), "{err}");

        let dir = std::env::temp_dir().join(format!("agent-enrol-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        hub.tls.client_cert_file = Some(dir.join("c/tls.crt").display().to_string());
        hub.tls.client_key_file = Some(dir.join("c/tls.key").display().to_string());
        let files = CertificateFiles::from_config(&hub).unwrap().unwrap();
        assert!(!has_valid_certificate(&files));

        let (key_pem, csr) = key_and_csr().unwrap();
        assert!(csr.contains("CERTIFICATE REQUEST"));
        let key = KeyPair::from_pem(&key_pem).unwrap();
        let mut params = CertificateParams::new(vec!["a".to_string()]).unwrap();
        let now = Timestamp::now().as_second();
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        params.not_before = epoch + std::time::Duration::from_secs(now as u64);
        params.not_after = epoch + std::time::Duration::from_secs(now as u64 + 300);
        let cert = params.self_signed(&key).unwrap().pem();
        store(&files, &key_pem, &cert).unwrap();
        assert!(has_valid_certificate(&files));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(renew_at(cert.as_bytes()), Some(now + 200));

        hub.auth.token = Some("literal".into());
        assert_eq!(bearer_token(&hub).unwrap().as_deref(), Some("literal"));
        let token_file = dir.join("token");
        std::fs::write(&token_file, "from-file\n").unwrap();
        hub.auth.token_file = Some(token_file.display().to_string());
        assert_eq!(bearer_token(&hub).unwrap().as_deref(), Some("from-file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
