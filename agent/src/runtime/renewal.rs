//! The enrolled agent's client certificate, renewed over the stream before it expires.

use std::time::Duration;

use scale_agent_proto::v1::{self, agent_message};
use tokio::time::Instant;

use super::Runtime;
use crate::{
    enrolment::{self, CertificateFiles},
    error::Result,
    session::Session,
};

/// Resolves when an enrolled agent's certificate is due for renewal (never without one).
pub(super) async fn sleep_until_renewal(renew: &Option<(CertificateFiles, Instant)>) {
    match renew {
        Some((_, at)) => tokio::time::sleep_until(*at).await,
        None => std::future::pending().await,
    }
}

/// When the certificate in `files` is due for renewal (two thirds into its lifetime, as
/// [`enrolment::renew_at`] says); none when it cannot be read or parsed, and the stream
/// then goes on without renewing it.
pub(super) fn renewal_due(files: CertificateFiles) -> Option<(CertificateFiles, Instant)> {
    let renew_at = enrolment::renew_at(&std::fs::read(&files.cert).ok()?)?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let wait = u64::try_from(renew_at - now).unwrap_or(0);
    Some((files, Instant::now() + Duration::from_secs(wait)))
}

impl Runtime {
    /// Sends RenewCertificate with a CSR for a new key, kept until the answer arrives.
    pub(super) async fn ask_renewal(
        &mut self,
        files: CertificateFiles,
        session: &mut Session,
    ) -> Result<()> {
        let (key_pem, csr_pem) = enrolment::key_and_csr()?;
        tracing::info!(cert = %files.cert.display(), "renewing the client certificate over the stream");
        self.renewal = Some((files, key_pem));
        session
            .send(agent_message::Kind::RenewCertificate(
                v1::RenewCertificate { csr_pem },
            ))
            .await
    }

    /// Keeps a renewed certificate (used from the next connection on).
    pub(super) fn renewed(&mut self, renewal: v1::CertificateRenewal) {
        let Some((files, key_pem)) = self.renewal.take() else {
            tracing::warn!("the hub sent a certificate renewal nobody asked for; ignored");
            return;
        };
        match renewal.certificate {
            Some(certificate) => {
                match enrolment::store(&files, &key_pem, &certificate.certificate_chain_pem) {
                    Ok(()) => {
                        tracing::info!(identity = %certificate.identity, not_after = certificate.not_after_unix, "client certificate renewed; the next connection uses it")
                    }
                    Err(error) => {
                        tracing::warn!(error = %crate::error::Chain(&error), "cannot keep the renewed certificate")
                    }
                }
            }
            None => {
                tracing::warn!(reason = %renewal.refused, "the hub refused to renew the client certificate; the agent enrols again with clouddriver.auth.enrolmentTokenFile once it expires")
            }
        }
    }
}
