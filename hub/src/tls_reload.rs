//! Certificate rotation without a restart: the files the TLS material was read from
//! ([`crate::config::TlsFiles`]) are read again every [`Config::tls_reload_interval`]; when
//! their content changed, the gRPC listener's certificate and client CA and the HTTP
//! listener's certificate are replaced for new connections. Streams and connections already
//! open keep the handshake they made.
//!
//! Files are compared by content, not by modification time: a Secret mounted in a pod
//! changes by an atomic symlink swap. A rotation seen half done (the new certificate beside
//! the old key) fails to build, is logged once, and the material in use stays until the
//! files fit together again.
//!
//! The notAfter of each serving certificate in use is kept for the metric
//! `scale_agent_hub_tls_certificate_expiry_seconds`, set at start and on every reload.
//!
//! [`Config::tls_reload_interval`]: crate::config::ListenerConfig::tls_reload_interval

use std::{path::Path, sync::Arc};

use tokio::sync::watch;

use crate::{
    Hub,
    agent_auth::{self, ClientCertificates},
    config::TlsFiles,
    error::{HubError, Result},
    serve,
};

/// The listeners, as the expiry metric labels them.
const GRPC: &str = "grpc";
const HTTP: &str = "http";

/// The content of the TLS files, as last read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Material {
    grpc: Option<(Vec<u8>, Vec<u8>)>,
    client_ca: Option<Vec<u8>>,
    http: Option<(Vec<u8>, Vec<u8>)>,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| HubError::Io {
        context: format!("re-reading the TLS file {}", path.display()),
        source,
    })
}

fn read_pair(
    pair: &Option<(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    pair.as_ref()
        .map(|(cert, key)| Ok((read(cert)?, read(key)?)))
        .transpose()
}

/// notAfter (Unix seconds) of the first certificate of a PEM chain: the one served.
pub(crate) fn not_after(chain_pem: &[u8]) -> Option<i64> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(chain_pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(cert.validity().not_after.timestamp())
}

impl Material {
    fn read(files: &TlsFiles) -> Result<Self> {
        Ok(Material {
            grpc: read_pair(&files.grpc)?,
            client_ca: files.client_ca.as_deref().map(read).transpose()?,
            http: read_pair(&files.http)?,
        })
    }
}

/// Watches the TLS files and swaps what the listeners and the stream authentication use.
pub(crate) struct Reloader {
    hub: Arc<Hub>,
    grpc: Option<watch::Sender<Arc<rustls::ServerConfig>>>,
    http: Option<watch::Sender<Arc<rustls::ServerConfig>>>,
    last: Material,
}

impl Reloader {
    /// A reloader for the hub's [`TlsFiles`]; `None` when no file is to be watched.
    pub(crate) fn new(
        hub: Arc<Hub>,
        grpc: Option<watch::Sender<Arc<rustls::ServerConfig>>>,
        http: Option<watch::Sender<Arc<rustls::ServerConfig>>>,
    ) -> Option<Self> {
        let files = &hub.config.listeners.tls_files;
        if files.grpc.is_none() && files.client_ca.is_none() && files.http.is_none() {
            return None;
        }
        // What start() served: read again now, so only a later change counts.
        let last = Material::read(files).unwrap_or_default();
        let reloader = Reloader {
            hub,
            grpc,
            http,
            last,
        };
        reloader.record_expiry(GRPC, reloader.last.grpc.as_ref());
        reloader.record_expiry(HTTP, reloader.last.http.as_ref());
        Some(reloader)
    }

    /// Keeps the notAfter of the certificate `listener` now serves (`pair`: its chain and
    /// key as read) for the expiry metric.
    fn record_expiry(&self, listener: &'static str, pair: Option<&(Vec<u8>, Vec<u8>)>) {
        let files = &self.hub.config.listeners.tls_files;
        let file = match listener {
            GRPC => files.grpc.as_ref(),
            _ => files.http.as_ref(),
        };
        let (Some((chain, _)), Some((path, _))) = (pair, file) else {
            return;
        };
        match not_after(chain) {
            Some(not_after) => self.hub.metrics.certificate_not_after(
                listener,
                path.display().to_string(),
                not_after,
            ),
            None => {
                tracing::warn!(file = %path.display(), "cannot read the notAfter of the certificate; its expiry metric is not updated")
            }
        }
    }

    /// Checks the files every interval until shutdown.
    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut interval = tokio::time::interval(self.hub.config.listeners.tls_reload_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.tick().await;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            self.check();
        }
    }

    fn check(&mut self) {
        let material = match Material::read(&self.hub.config.listeners.tls_files) {
            Ok(material) => material,
            Err(error) => {
                // A file missing for a moment during a rotation: try again next tick.
                tracing::debug!(error = %crate::error::Chain(&error), "TLS files not readable; keeping the certificates in use");
                return;
            }
        };
        if material == self.last {
            return;
        }
        let previous = std::mem::replace(&mut self.last, material.clone());
        if material.grpc != previous.grpc || material.client_ca != previous.client_ca {
            match self.apply_grpc(&material) {
                Ok(()) => {
                    self.record_expiry(GRPC, material.grpc.as_ref());
                    tracing::info!(
                        "gRPC listener: certificate or client CA changed on disk; new connections use the new files"
                    )
                }
                Err(error) => tracing::error!(error = %crate::error::Chain(&error),
                    "gRPC listener: the changed certificate files do not load; still serving the previous ones until they do"),
            }
        }
        if material.http != previous.http
            && let Some((cert, key)) = &material.http
        {
            match serve::tls_config(cert, key) {
                Ok(config) => {
                    if let Some(tx) = &self.http {
                        tx.send_replace(config);
                    }
                    self.record_expiry(HTTP, material.http.as_ref());
                    tracing::info!(
                        "HTTP listener: certificate changed on disk; new connections use it"
                    );
                }
                Err(error) => tracing::error!(%error,
                    "HTTP listener: the changed certificate files do not load; still serving the previous ones until they do"),
            }
        }
    }

    /// Builds the client CAs and the gRPC server configuration from `material`, and swaps
    /// both in only when both built.
    fn apply_grpc(&self, material: &Material) -> Result<()> {
        let clients = Arc::new(ClientCertificates::new(
            self.hub.auth.agent_ca().cert_pem().as_bytes(),
            material.client_ca.as_deref(),
        )?);
        let config = match &material.grpc {
            Some((cert, key)) => Some(agent_auth::server_tls_config(cert, key, &clients)?),
            None => None,
        };
        self.hub.auth.set_client_certificates(clients);
        if let (Some(tx), Some(config)) = (&self.grpc, config) {
            tx.send_replace(config);
        }
        Ok(())
    }
}
