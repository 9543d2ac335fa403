//! The control plane's certificates and keys, made fresh for each run and written into its
//! run directory: a CA, the API server's serving certificate (with the real node's addresses
//! when one runs), an admin client certificate in `system:masters`, and the ServiceAccount
//! token signing key pair.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
};

use crate::{
    error::{Result, io_err},
    pki::{self, CertificateAuthority},
    real_node,
};

/// The files [`Certificates::write`] wrote, and the CA that signed them.
pub(super) struct Certificates {
    pub ca: CertificateAuthority,
    pub ca_file: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

impl Certificates {
    /// Makes the certificates and keys and writes them into `run_dir`; with a real node on
    /// `node_address`, the API server's certificate also names that address and the
    /// `kubernetes` Service's.
    pub fn write(run_dir: &Path, node_address: Option<Ipv4Addr>) -> Result<Self> {
        let write = |name: &str, contents: &str| -> Result<PathBuf> {
            let path = run_dir.join(name);
            fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))?;
            Ok(path)
        };
        let ca = CertificateAuthority::new("scale-agent-e2e-ca")?;
        let serving = match node_address {
            // Pods reach the API server through the `kubernetes` Service's ClusterIP, which
            // kube-proxy sends to the bridge address.
            Some(address) => ca.serving_with_ips(
                "kube-apiserver",
                &real_node::APISERVER_NAMES,
                &[
                    IpAddr::V4(address),
                    IpAddr::V4(real_node::KUBERNETES_SERVICE_IP),
                ],
            )?,
            None => ca.serving("kube-apiserver", &["kubernetes", "kubernetes.default.svc"])?,
        };
        let admin = ca.client("scale-agent-e2e-admin", &["system:masters"])?;
        let ca_file = write("ca.crt", &ca.cert_pem)?;
        let serving_cert = write("apiserver.crt", &serving.cert_pem)?;
        let serving_key = write("apiserver.key", &serving.key_pem)?;
        let admin_cert = write("admin.crt", &admin.cert_pem)?;
        let admin_key = write("admin.key", &admin.key_pem)?;
        let (sa_private, sa_public) = pki::signing_key_pair_pem()?;
        let sa_key = write("service-account.key", &sa_private)?;
        let sa_pub = write("service-account.pub", &sa_public)?;
        Ok(Certificates {
            ca,
            ca_file,
            serving_cert,
            serving_key,
            admin_cert,
            admin_key,
            sa_key,
            sa_pub,
        })
    }
}
