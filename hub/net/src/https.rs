//! The hub's HTTPS clients (to Clouddriver's Account Management API, and from one replica to
//! another): the TLS client configuration, and one builder for the HTTP/1.1 client over https
//! or http that both use.

use std::{sync::Arc, time::Duration};

use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};

/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// An HTTP/1.1 client over https or http sending bodies of type `B`.
pub type HttpsClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// How a client built by [`client`] connects. The default is hyper's own connector.
#[derive(Debug, Default)]
pub struct ClientOptions {
    /// How long connecting (TCP) may take; `None`: no limit of the client's own.
    pub connect_timeout: Option<Duration>,
    /// `TCP_NODELAY` on new connections.
    pub nodelay: bool,
    /// Verify every server's certificate for this name instead of the host of each URL.
    pub server_name: Option<ServerName<'static>>,
}

/// A TLS client configuration trusting webpki's public roots and, when given, the
/// certificates of a PEM bundle (named by its origin in errors).
pub fn client_tls_config(extra: Option<(String, &[u8])>) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some((origin, pem)) = extra {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("{origin}: {e}"))?;
            roots.add(cert).map_err(|e| format!("{origin}: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!("{origin}: no PEM certificate in it"));
        }
    }
    // The provider is named, not taken from the process default, so that the choice never
    // depends on which rustls features other crates switched on.
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| e.to_string())
}

/// A TLS client configuration trusting nothing but the certificates of a PEM bundle (named
/// by its origin in errors): no public roots, for a peer whose certificates only a private
/// CA issues (the other replicas).
pub fn private_client_tls_config(origin: &str, pem: &[u8]) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{origin}: {e}"))?;
        roots.add(cert).map_err(|e| format!("{origin}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{origin}: no PEM certificate in it"));
    }
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| e.to_string())
}

/// An HTTP/1.1 client for https and http URLs trusting `tls`, connecting as `options` say;
/// idle connections are pooled for 30 s.
pub fn client<B>(tls: ClientConfig, options: ClientOptions) -> HttpsClient<B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    let mut http = HttpConnector::new();
    // The HTTPS connector enforces the scheme, not the HTTP one.
    http.enforce_http(false);
    http.set_connect_timeout(options.connect_timeout);
    http.set_nodelay(options.nodelay);
    let mut builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = options.server_name {
        builder = builder.with_server_name_resolver(FixedServerNameResolver::new(name));
    }
    let connector = builder.enable_http1().wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector)
}
