//! Certificates and keys for one local control plane: a CA, the apiserver's serving
//! certificate, an admin client certificate in `system:masters`, and the ServiceAccount
//! token signing key. Everything is made fresh per control plane and never leaves its
//! run directory.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// A PEM certificate with its PKCS#8 PEM private key.
#[derive(Clone, Debug)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that can sign serving and client certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    pub cert_pem: String,
    /// The CA's PKCS#8 PEM private key, for handing the CA to another signer (the
    /// operator's issuer Secret).
    pub key_pem: String,
}

fn cert_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Certificate { what, source }
}

impl CertificateAuthority {
    pub fn new(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate().map_err(cert_err("CA key"))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(cert_err("CA certificate"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A serving certificate for loopback (`127.0.0.1`, `localhost`) plus `dns_names`.
    pub fn serving(&self, common_name: &str, dns_names: &[&str]) -> Result<CertifiedKey> {
        self.serving_names(common_name, dns_names, true)
    }

    /// A serving certificate for `127.0.0.1` only: a client connecting to `localhost` finds
    /// that it does not name the host.
    pub fn serving_ip_only(&self, common_name: &str) -> Result<CertifiedKey> {
        self.serving_names(common_name, &[], false)
    }

    fn serving_names(
        &self,
        common_name: &str,
        dns_names: &[&str],
        localhost: bool,
    ) -> Result<CertifiedKey> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let local: &[&str] = if localhost { &["localhost"] } else { &[] };
        params.subject_alt_names = dns_names
            .iter()
            .chain(local)
            .map(|name| {
                (*name)
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(cert_err("serving certificate name"))
            })
            .collect::<Result<_>>()?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        self.sign(params, "serving certificate")
    }

    /// A client certificate; Kubernetes reads the user from the common name and the groups
    /// from the organisations.
    pub fn client(&self, common_name: &str, organisations: &[&str]) -> Result<CertifiedKey> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        for org in organisations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *org);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(params, "client certificate")
    }

    fn sign(&self, params: CertificateParams, what: &'static str) -> Result<CertifiedKey> {
        let key = KeyPair::generate().map_err(cert_err(what))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(cert_err(what))?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// An ECDSA P-256 key pair for signing ServiceAccount tokens: the PKCS#8 PEM private key
/// (for the apiserver's signer and the controller manager) and the PEM public key (for
/// the apiserver's verifier).
pub fn signing_key_pair_pem() -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(cert_err("ServiceAccount signing key"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_certificates_and_pkcs8_keys() {
        let ca = CertificateAuthority::new("test-ca").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        let serving = ca.serving("kube-apiserver", &["kubernetes"]).unwrap();
        assert!(serving.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(serving.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let client = ca.client("admin", &["system:masters"]).unwrap();
        assert_ne!(client.cert_pem, serving.cert_pem);
        let (private, public) = signing_key_pair_pem().unwrap();
        assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
    }
}
