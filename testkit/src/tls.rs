//! rustls configurations from PEM, with the ring provider like the rest of the tree: a
//! client trusting given CAs (or the web's public roots), a server with one certificate
//! chain and key.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

/// What was wrong with the PEM or the configuration.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM bundle of CAs.
fn ca_certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError(format!("CA PEM: {e}")))
}

/// A client configuration trusting the CAs of `ca_pem` (the web's public roots when
/// `None`), without a client certificate and without ALPN (the HTTP connectors set it).
pub fn client_config(ca_pem: Option<&str>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in ca_certificates(pem)? {
                roots
                    .add(cert)
                    .map_err(|e| TlsError(format!("CA certificate: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A server configuration with the certificate chain `cert_pem` and its key `key_pem`, no
/// client authentication and no ALPN.
pub fn server_config(cert_pem: &str, key_pem: &str) -> Result<rustls::ServerConfig, TlsError> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("the certificate PEM: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| TlsError(format!("the key PEM: {e}")))?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError(format!("the certificate and key: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{ca, leaf};

    #[test]
    fn configurations_from_test_certificates() {
        let issuer = ca("tls-test-ca");
        let (cert, key) = leaf(
            &issuer,
            &["localhost"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        server_config(&cert, &key).unwrap();
        client_config(Some(&issuer.pem())).unwrap();
        client_config(None).unwrap();
        let error = server_config(&cert, "not a key").unwrap_err().to_string();
        assert!(error.starts_with("the key PEM"), "{error}");
        assert!(client_config(Some("-----BEGIN CERTIFICATE-----\n!!\n")).is_err());
    }
}
