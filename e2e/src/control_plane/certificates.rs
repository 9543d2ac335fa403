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

/// The front proxy's client certificate's name: the only one the API server's request-header
/// authenticator accepts (`--requestheader-allowed-names`).
const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The API server's flags for aggregated APIs (a real node's metrics-server serves
/// `metrics.k8s.io`), with their certificates written into `run_dir`: the aggregator calls an
/// extension API server with the client certificate of [`FRONT_PROXY_CLIENT`], signed by a
/// CA of its own (the front-proxy CA, as kubeadm makes it, so no other client certificate of
/// the cluster can pass for the proxy), and names the user it acts for in the
/// `X-Remote-*` headers, which the extension server trusts because it finds the front-proxy
/// CA and the headers' names in the `kube-system/extension-apiserver-authentication`
/// ConfigMap the API server publishes. `--enable-aggregator-routing` sends the aggregator to
/// the Service's endpoint address directly, as a control plane without kube-proxy on its
/// host needs (here the API server runs on the node's host anyway).
pub(super) fn aggregation_args(run_dir: &Path) -> Result<Vec<String>> {
    let front_proxy_ca = CertificateAuthority::new("scale-agent-e2e-front-proxy-ca")?;
    let client = front_proxy_ca.client(FRONT_PROXY_CLIENT, &[])?;
    let write = |name: &str, contents: &str| -> Result<PathBuf> {
        let path = run_dir.join(name);
        fs::write(&path, contents).map_err(io_err(format!("write {}", path.display())))?;
        Ok(path)
    };
    let ca_file = write("front-proxy-ca.crt", &front_proxy_ca.cert_pem)?;
    let client_cert = write("front-proxy-client.crt", &client.cert_pem)?;
    let client_key = write("front-proxy-client.key", &client.key_pem)?;
    Ok(vec![
        format!("--requestheader-client-ca-file={}", ca_file.display()),
        format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--proxy-client-cert-file={}", client_cert.display()),
        format!("--proxy-client-key-file={}", client_key.display()),
        "--enable-aggregator-routing=true".into(),
    ])
}
