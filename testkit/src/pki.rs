//! Certificates and keys made at test time with rcgen, never written outside a test's
//! directory:
//!
//! - [`CertificateAuthority`], fallible: a CA signing serving and client certificates (a
//!   local control plane's, the demo's), with [`signing_key_pair_pem`];
//! - [`ca`], [`leaf`] and [`leaf_with`], which panic: the tests' CAs and certificates for any
//!   names and usage;
//! - [`Pki`]: the set of a hub under test (the agents' CA, a gRPC serving certificate, and
//!   another CA for the HTTPS listener).

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A PEM certificate with its PKCS#8 PEM private key.
#[derive(Clone, Debug)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// rcgen failed to make `what`.
#[derive(Debug, thiserror::Error)]
#[error("failed to generate {what}: {source}")]
pub struct CertificateError {
    pub what: &'static str,
    #[source]
    pub source: rcgen::Error,
}

fn cert_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertificateError {
    move |source| CertificateError { what, source }
}

/// A self-signed CA named `common_name` that may sign certificates and CRLs.
fn new_ca(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, CertificateError> {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().map_err(cert_err("CA key"))?;
    CertifiedIssuer::self_signed(params, key).map_err(cert_err("CA certificate"))
}

/// A fresh key and the certificate of `params` for it, signed by `issuer`.
fn sign(
    params: CertificateParams,
    issuer: &Issuer<'static, KeyPair>,
    what: &'static str,
) -> Result<CertifiedKey, CertificateError> {
    let key = KeyPair::generate().map_err(cert_err(what))?;
    let cert = params.signed_by(&key, issuer).map_err(cert_err(what))?;
    Ok(CertifiedKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

// ---------------------------------------------------------------- fallible

/// A certificate authority that can sign serving and client certificates.
pub struct CertificateAuthority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert_pem: String,
    /// The CA's PKCS#8 PEM private key, for handing the CA to another signer (the
    /// operator's issuer Secret).
    pub key_pem: String,
}

impl CertificateAuthority {
    pub fn new(common_name: &str) -> Result<Self, CertificateError> {
        let issuer = new_ca(common_name)?;
        Ok(Self {
            cert_pem: issuer.pem(),
            key_pem: issuer.key().serialize_pem(),
            issuer,
        })
    }

    /// A serving certificate for loopback (`127.0.0.1`, `localhost`) plus `dns_names`.
    pub fn serving(
        &self,
        common_name: &str,
        dns_names: &[&str],
    ) -> Result<CertifiedKey, CertificateError> {
        self.serving_names(common_name, dns_names, true)
    }

    /// A serving certificate for loopback plus `dns_names` and the addresses `ips`: a server
    /// also reached on another interface (an API server on a real node's bridge, behind the
    /// `kubernetes` Service's ClusterIP).
    pub fn serving_with_ips(
        &self,
        common_name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertifiedKey, CertificateError> {
        self.serving_names_ips(common_name, dns_names, true, ips)
    }

    /// A serving certificate for `127.0.0.1` only: a client connecting to `localhost` finds
    /// that it does not name the host.
    pub fn serving_ip_only(&self, common_name: &str) -> Result<CertifiedKey, CertificateError> {
        self.serving_names(common_name, &[], false)
    }

    fn serving_names(
        &self,
        common_name: &str,
        dns_names: &[&str],
        localhost: bool,
    ) -> Result<CertifiedKey, CertificateError> {
        self.serving_names_ips(common_name, dns_names, localhost, &[])
    }

    fn serving_names_ips(
        &self,
        common_name: &str,
        dns_names: &[&str],
        localhost: bool,
        ips: &[IpAddr],
    ) -> Result<CertifiedKey, CertificateError> {
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
            .collect::<Result<_, _>>()?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .extend(ips.iter().copied().map(SanType::IpAddress));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        sign(params, &self.issuer, "serving certificate")
    }

    /// A client certificate; Kubernetes reads the user from the common name and the groups
    /// from the organisations.
    pub fn client(
        &self,
        common_name: &str,
        organisations: &[&str],
    ) -> Result<CertifiedKey, CertificateError> {
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
        sign(params, &self.issuer, "client certificate")
    }
}

/// An ECDSA P-256 key pair for signing ServiceAccount tokens: the PKCS#8 PEM private key
/// (for the apiserver's signer and the controller manager) and the PEM public key (for
/// the apiserver's verifier).
pub fn signing_key_pair_pem() -> Result<(String, String), CertificateError> {
    let key = KeyPair::generate().map_err(cert_err("ServiceAccount signing key"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

// ---------------------------------------------------------------- for tests that panic

/// A CA named `name`; panics if rcgen fails.
pub fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    new_ca(name).unwrap_or_else(|e| panic!("{e}"))
}

/// A certificate for `sans` signed by `issuer`, for `usage`: (certificate PEM, key PEM).
pub fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    leaf_with(issuer, sans, usage, |_| {})
}

/// [`leaf`] with its parameters changed by `tweak` (a validity period, say). Each of `sans`
/// is an IP address SAN when it parses as one, else a DNS name; the first is also the
/// common name.
pub fn leaf_with(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
    tweak: impl FnOnce(&mut CertificateParams),
) -> (String, String) {
    let names = sans.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut params = CertificateParams::new(names).unwrap_or_else(|e| panic!("SANs {sans:?}: {e}"));
    params.extended_key_usages = vec![usage];
    params
        .distinguished_name
        .push(DnType::CommonName, sans.first().copied().unwrap_or("cn"));
    tweak(&mut params);
    let signed = sign(params, issuer, "a leaf certificate").unwrap_or_else(|e| panic!("{e}"));
    (signed.cert_pem, signed.key_pem)
}

/// The certificates of a hub under test, all for `localhost` and `127.0.0.1`.
pub struct Pki {
    /// The CA of the agents' client certificates and of the gRPC server certificate.
    pub ca_pem: String,
    ca: CertifiedIssuer<'static, KeyPair>,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    /// Another CA, for the HTTP listener's serving certificate: a kubeconfig carrying the
    /// agents' CA instead would be caught.
    pub serving_ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Pki {
    pub fn new() -> Self {
        let ca = ca("scale-agent-test-ca");
        let (server_cert_pem, server_key_pem) = leaf(
            &ca,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let serving = self::ca("scale-agent-hub-serving-ca");
        let (serving_cert_pem, serving_key_pem) = leaf(
            &serving,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        Pki {
            ca_pem: ca.pem(),
            ca,
            server_cert_pem,
            server_key_pem,
            serving_ca_pem: serving.pem(),
            serving_cert_pem,
            serving_key_pem,
        }
    }

    /// A client certificate for `identity` signed by the agents' CA: (certificate PEM, key
    /// PEM).
    pub fn client(&self, identity: &str) -> (String, String) {
        leaf(&self.ca, &[identity], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_certificates_and_pkcs8_keys() {
        let ca = CertificateAuthority::new("test-ca").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let serving = ca.serving("kube-apiserver", &["kubernetes"]).unwrap();
        assert!(serving.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(serving.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let client = ca.client("admin", &["system:masters"]).unwrap();
        assert_ne!(client.cert_pem, serving.cert_pem);
        let (private, public) = signing_key_pair_pem().unwrap();
        assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
    }

    #[test]
    fn a_hub_pki_has_two_cas_and_signs_clients() {
        let pki = Pki::new();
        assert_ne!(pki.ca_pem, pki.serving_ca_pem);
        let (cert, key) = pki.client("system:serviceaccount:spinnaker:agent");
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    }
}
