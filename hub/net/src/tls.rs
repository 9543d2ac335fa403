//! The listeners' TLS options: the certificate material the gRPC and HTTP listeners serve,
//! and the files it was read from (reloaded when they change). The hub's `Config` holds
//! them; the hub's `config` module re-exports them.

use std::path::PathBuf;

/// The gRPC listener's TLS when the proxy connects to the hub over TLS.
#[derive(Clone)]
pub struct ProxyHopTls {
    /// The hub's server certificate chain (PEM).
    pub cert_pem: Vec<u8>,
    /// Its private key (PEM).
    pub key_pem: Vec<u8>,
    /// The CA of the proxies' client certificates (PEM); `None`: the proxy presents none.
    pub proxy_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ProxyHopTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHopTls")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .field("proxy_ca_pem", &self.proxy_ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

/// PEM-encoded certificate material for the gRPC listener.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The server certificate chain.
    pub cert_pem: Vec<u8>,
    /// The server's private key.
    pub key_pem: Vec<u8>,
    /// An external CA (or CAs) whose agent certificates are trusted besides the ones the hub
    /// issues: the operator-signed mode, an explicit opt-in (`--client-ca`). `None`: only
    /// certificates the hub issued.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .field(
                "client_ca_pem",
                &format_args!("{} bytes", self.client_ca_pem.as_ref().map_or(0, Vec::len)),
            )
            .finish()
    }
}

/// How the HTTP listener (REST API and Kubernetes API proxy) is served.
#[derive(Clone)]
pub enum HttpSecurity {
    /// TLS with this certificate chain and key (PEM).
    Tls { cert_pem: Vec<u8>, key_pem: Vec<u8> },
    /// No TLS: bearer tokens cross the network in clear. Only behind an explicit flag.
    Plaintext,
}

impl std::fmt::Debug for HttpSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpSecurity::Tls { cert_pem, .. } => f
                .debug_struct("Tls")
                .field("cert_pem", &format_args!("{} bytes", cert_pem.len()))
                .field("key_pem", &"<redacted>")
                .finish(),
            HttpSecurity::Plaintext => f.write_str("Plaintext"),
        }
    }
}

/// The files the TLS material of the hub's `Config` was read from. The hub reads them again
/// every `Config::tls_reload_interval` and, when their content changed, serves new connections
/// with the new certificate or trusts the new client CA, without a restart (a cert-manager
/// renewal of the Secret they are mounted from). `None`: not reloaded.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// The gRPC listener's certificate chain and key (`--tls-cert`, `--tls-key`), in the
    /// mutual-TLS mode.
    pub grpc: Option<(PathBuf, PathBuf)>,
    /// The external CA of agents' client certificates (`--client-ca`), in the mutual-TLS
    /// mode.
    pub client_ca: Option<PathBuf>,
    /// The HTTP listener's certificate chain and key.
    pub http: Option<(PathBuf, PathBuf)>,
}
