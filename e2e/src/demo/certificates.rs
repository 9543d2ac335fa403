//! The demo's two CAs: one the operator signs agents' client certificates with (the hub
//! trusts it), one that signs the hub's serving certificate (agents, curl and kubectl trust
//! it). Their Secrets go into the cluster, the hub's files into `<run-dir>/hub`.

use std::{io::Write, path::PathBuf};

use kube::Client;

use super::{
    NAMESPACE,
    support::{create_namespace, create_secret, line, write_file},
};
use crate::{
    ControlPlane,
    error::{Result, io_err},
    pki::CertificateAuthority,
};

/// The hub's files, as its flags name them.
pub(super) struct HubFiles {
    /// `<run-dir>/hub`.
    pub dir: PathBuf,
    /// The serving certificate (gRPC and HTTPS) and its key: `--tls-cert`, `--tls-key`.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The agents' CA: `--client-ca`.
    pub client_ca: PathBuf,
    /// The CA of the serving certificate: `--serving-ca`, and what clients trust.
    pub serving_ca: PathBuf,
    /// PEM of `serving_ca`.
    pub serving_ca_pem: String,
    /// `--data-dir`; the hub writes its admin token here.
    pub data_dir: PathBuf,
}

/// Creates the namespace of the sample resources, both CAs, their Secrets and the hub's
/// files.
pub(super) async fn create(
    control_plane: &ControlPlane,
    client: &Client,
    out: &mut dyn Write,
) -> Result<HubFiles> {
    line(
        out,
        format!("==> Creating namespace {NAMESPACE}, the agents' CA and the hub's certificates"),
    );
    create_namespace(client, NAMESPACE).await?;
    let agents_ca = CertificateAuthority::new("scale-agent-demo-agents-ca")?;
    let hub_ca = CertificateAuthority::new("scale-agent-demo-hub-ca")?;
    let serving = hub_ca.serving("scale-agent-hub", &["scale-agent-hub"])?;
    create_secret(
        client,
        "agent-ca",
        &[
            ("tls.crt", &agents_ca.cert_pem),
            ("tls.key", &agents_ca.key_pem),
        ],
    )
    .await?;
    line(
        out,
        format!(
            "    secret/agent-ca in {NAMESPACE}: the CA the operator signs agent client certificates with (the hub trusts it)"
        ),
    );
    create_secret(client, "hub-ca", &[("ca.crt", &hub_ca.cert_pem)]).await?;
    line(
        out,
        format!(
            "    secret/hub-ca in {NAMESPACE}: the CA of the hub's serving certificate (agents verify the hub with it)"
        ),
    );
    let dir = control_plane.run_dir().join("hub");
    let data_dir = dir.join("data");
    std::fs::create_dir_all(&data_dir).map_err(io_err(format!("create {}", dir.display())))?;
    let files = HubFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        client_ca: dir.join("client-ca.crt"),
        serving_ca: dir.join("ca.crt"),
        serving_ca_pem: hub_ca.cert_pem.clone(),
        data_dir,
        dir,
    };
    write_file(&files.cert, &serving.cert_pem)?;
    write_file(&files.key, &serving.key_pem)?;
    write_file(&files.client_ca, &agents_ca.cert_pem)?;
    write_file(&files.serving_ca, &hub_ca.cert_pem)?;
    line(
        out,
        format!(
            "    {}: the hub's serving certificate (localhost, 127.0.0.1) and key, client-ca.crt, and ca.crt (the serving certificate's CA: curl and kubectl trust it)",
            files.dir.display()
        ),
    );
    Ok(files)
}
