//! TLS to PostgreSQL, with libpq's `sslmode` and `sslrootcert`, for every connection the hub
//! makes (the store's, account ownership's, the Clouddriver registrar's lock).
//!
//! tokio-postgres parses neither `sslrootcert` nor `sslmode=verify-ca|verify-full`, so both
//! are taken out of the connection string here (URL query or key=value form) and turned into
//! a rustls configuration, handed to tokio-postgres through `tokio-postgres-rustls`. The
//! modes mean what libpq says they mean:
//!
//! | `sslmode`     | TLS                                   | the server's certificate        |
//! |---------------|---------------------------------------|---------------------------------|
//! | `disable`     | never                                 | -                               |
//! | `prefer` (default) | when the server offers it, else plaintext | not checked, or the chain when a CA is given |
//! | `require`     | always                                | not checked, or the chain when a CA is given |
//! | `verify-ca`   | always                                | signed by the CA                |
//! | `verify-full` | always                                | signed by the CA, names the host |
//!
//! The CA is `sslrootcert=/path/ca.pem` in the URL or `--postgres-ca` (not both).
//! `sslrootcert=system` trusts the public web roots (Mozilla's list, compiled in: the image
//! has no system store) and, as in libpq 16, needs `verify-full` (its default then). The hub
//! never reads libpq's `~/.postgresql/root.crt`. `sslmode=allow` (plaintext first) is
//! refused: use `prefer` or `disable`.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject as _},
};
use tokio_postgres::{Client, config::SslMode as PgSslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use scale_agent_hub_model::{HubError, Result, error::Chain};

/// libpq's `sslmode` values the hub honours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(HubError::Config(
                    "sslmode=allow (plaintext first, TLS only when refused) is not supported: \
                     use sslmode=prefer, or sslmode=disable on a network you trust"
                        .into(),
                ));
            }
            other => {
                return Err(HubError::Config(format!(
                    "sslmode={other:?} in the PostgreSQL URL is not a mode: use disable, prefer, \
                     require, verify-ca or verify-full"
                )));
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where the trusted CA comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Roots {
    /// Nothing given: certificates are checked only in the verify modes, which refuse this.
    None,
    /// A PEM file, from `sslrootcert` or `--postgres-ca` (the text says which).
    File { path: PathBuf, origin: &'static str },
    /// `sslrootcert=system`: the public web roots.
    System,
}

/// A PostgreSQL server and how to reach it: the connection settings tokio-postgres reads,
/// and the TLS settings the hub adds.
#[derive(Clone)]
pub struct Target {
    pub config: tokio_postgres::Config,
    mode: SslMode,
    roots: Roots,
    tls: MakeRustlsConnect,
}

impl Target {
    /// Reads `url` (a `postgres://` URL or a key=value string) and the CA file of
    /// `--postgres-ca`, loading the CA now so that a wrong file fails at start-up.
    pub fn new(url: &str, ca_file: Option<&Path>) -> Result<Self> {
        let (rest, ssl) = split_ssl_params(url)?;
        let mut config: tokio_postgres::Config = rest.parse().map_err(|e| {
            HubError::Config(format!(
                "the PostgreSQL URL is not a valid connection string ({e}); expected \
                 postgres://user:password@host:port/database[?sslmode=verify-full&sslrootcert=/path/ca.pem]"
            ))
        })?;
        let roots = match (ssl.rootcert.as_deref(), ca_file) {
            (Some(_), Some(_)) => {
                return Err(HubError::Config(
                    "the CA of PostgreSQL is given twice (sslrootcert in the URL and \
                     --postgres-ca): keep one"
                        .into(),
                ));
            }
            (Some("system"), None) => Roots::System,
            (Some(path), None) => Roots::File {
                path: PathBuf::from(path),
                origin: "sslrootcert",
            },
            (None, Some(path)) => Roots::File {
                path: path.to_path_buf(),
                origin: "--postgres-ca",
            },
            (None, None) => Roots::None,
        };
        let mode = match (ssl.mode.as_deref().map(SslMode::parse).transpose()?, &roots) {
            (None, Roots::System) => SslMode::VerifyFull,
            (Some(mode), Roots::System) if mode != SslMode::VerifyFull => {
                return Err(HubError::Config(format!(
                    "sslmode={} cannot be used with sslrootcert=system (as in libpq): use \
                     sslmode=verify-full",
                    mode.as_str()
                )));
            }
            (mode, _) => mode.unwrap_or(SslMode::Prefer),
        };
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && roots == Roots::None {
            return Err(HubError::Config(format!(
                "sslmode={} needs the CA that signed PostgreSQL's certificate: add \
                 sslrootcert=/path/ca.pem to the URL, or --postgres-ca",
                mode.as_str()
            )));
        }
        config.ssl_mode(match mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        });
        let tls = MakeRustlsConnect::new(client_config(mode, &roots)?);
        Ok(Target {
            config,
            mode,
            roots,
            tls,
        })
    }

    /// The `sslmode` in force.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// Connects, spawning the connection's task (which logs how it ended, with `what`).
    /// A failure says what to change (never the URL's password).
    pub async fn connect(&self, location: &str, what: &'static str) -> Result<Client> {
        let (client, connection) = self.connect_raw(location).await?;
        let location = location.to_string();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%location, error = %Chain(&error), "the {what} connection to PostgreSQL ended");
            }
        });
        Ok(client)
    }

    /// Connects; the caller runs the connection (it ends with an error when it breaks).
    pub async fn connect_raw(
        &self,
        location: &str,
    ) -> Result<(
        Client,
        impl Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send + 'static,
    )> {
        self.config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.connect_error(location, &e))
    }

    fn connect_error(&self, location: &str, error: &tokio_postgres::Error) -> HubError {
        let cause = Chain(error).to_string();
        HubError::PostgresConnect {
            location: location.to_string(),
            hint: self.hint(&cause),
            cause,
        }
    }

    /// What to change, from the text of a failed connection.
    fn hint(&self, cause: &str) -> String {
        let ca = match &self.roots {
            Roots::File { path, origin } => format!("the CA in {} ({origin})", path.display()),
            Roots::System => "the public web roots (sslrootcert=system)".into(),
            Roots::None => "no CA".into(),
        };
        // rustls says "certificate not valid for name ..." (older: NotValidForName).
        if cause.contains("not valid for name") || cause.contains("NotValidForName") {
            format!(
                "the server's certificate does not name the host of the URL (sslmode={}): \
                 connect by a name its certificate holds, or use sslmode=verify-ca, which \
                 checks the CA but not the name",
                self.mode.as_str()
            )
        } else if cause.contains("invalid peer certificate") {
            format!(
                "the server's certificate is not trusted by {ca}: set sslrootcert (or \
                 --postgres-ca) to the CA that signed PostgreSQL's certificate"
            )
        } else if cause.contains("no pg_hba.conf entry") && cause.contains("no encryption") {
            format!(
                "the server accepts only TLS connections from here: use sslmode=verify-full with \
                 sslrootcert=/path/ca.pem (now sslmode={})",
                self.mode.as_str()
            )
        } else if cause.contains("server does not support TLS") {
            format!(
                "the server does not offer TLS (its ssl setting is off) and sslmode={} needs \
                 it: turn ssl on in PostgreSQL, or use sslmode=prefer on a network you trust",
                self.mode.as_str()
            )
        } else if cause.contains("password authentication failed") {
            "check the user and password of the URL".into()
        } else if cause.contains("no pg_hba.conf entry") {
            "the server's pg_hba.conf has no entry for this user, database and address: add one"
                .into()
        } else {
            "check the host and port of the URL (--postgres-url-file or \
             SCALE_AGENT_HUB_POSTGRES_URL) and that PostgreSQL runs and is reachable from here"
                .into()
        }
    }
}

/// The `sslmode` and `sslrootcert` of a connection string, taken out of it.
#[derive(Debug, Default, PartialEq, Eq)]
struct SslParams {
    mode: Option<String>,
    rootcert: Option<String>,
}

fn is_ssl_param(key: &str) -> bool {
    matches!(key, "sslmode" | "sslrootcert")
}

/// Splits `sslmode` and `sslrootcert` off `url`; returns the rest, which tokio-postgres
/// parses. Client certificates (`sslcert`, `sslkey`) are left in, and refused by it.
fn split_ssl_params(url: &str) -> Result<(String, SslParams)> {
    let mut params = SslParams::default();
    let mut take = |key: &str, value: String| match key {
        "sslmode" => params.mode = Some(value),
        _ => params.rootcert = Some(value),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_string(), params));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key)?;
            if is_ssl_param(&key) {
                take(&key, percent_decode(value)?);
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, params));
    }
    // key=value pairs separated by spaces; a value may be 'quoted', with \ escapes.
    let mut rest = String::new();
    let chars: Vec<char> = url.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i == chars.len() {
            break;
        }
        let start = i;
        let mut key = String::new();
        while i < chars.len() && chars[i] != '=' && !chars[i].is_whitespace() {
            key.push(chars[i]);
            i += 1;
        }
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i == chars.len() || chars[i] != '=' {
            // Not a pair: left for tokio-postgres to refuse with its own message.
            return Ok((url.to_string(), SslParams::default()));
        }
        i += 1;
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if chars.get(i) == Some(&'\'') {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
            i += 1;
        } else {
            while i < chars.len() && !chars[i].is_whitespace() {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
        }
        if is_ssl_param(&key) {
            take(&key, value);
        } else {
            rest.push_str(&chars[start..i.min(chars.len())].iter().collect::<String>());
            rest.push(' ');
        }
    }
    Ok((rest.trim_end().to_string(), params))
}

fn percent_decode(text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(byte) => {
                    out.push(byte);
                    i += 3;
                    continue;
                }
                None => {
                    return Err(HubError::Config(
                        "the PostgreSQL URL has a % not followed by two hex digits in its query"
                            .into(),
                    ));
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).map_err(|_| {
        HubError::Config("the PostgreSQL URL's query is not UTF-8 once decoded".into())
    })
}

fn provider() -> Arc<CryptoProvider> {
    // Named, not the process default, like the hub's other TLS clients.
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_roots(roots: &Roots) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::None => {}
        Roots::System => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::File { path, origin } => {
            let pem = std::fs::read(path).map_err(|source| HubError::ReadFile {
                path: path.clone(),
                source,
            })?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert
                    .map_err(|e| HubError::Config(format!("{origin} {}: {e}", path.display())))?;
                store
                    .add(cert)
                    .map_err(|e| HubError::Config(format!("{origin} {}: {e}", path.display())))?;
            }
            if store.is_empty() {
                return Err(HubError::Config(format!(
                    "{origin} {}: no PEM certificate in it; it must hold the CA that signed \
                     PostgreSQL's certificate",
                    path.display()
                )));
            }
        }
    }
    Ok(store)
}

fn client_config(mode: SslMode, roots: &Roots) -> Result<ClientConfig> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| HubError::Config(format!("TLS to PostgreSQL: {e}")))?;
    let store = load_roots(roots)?;
    let checks_chain = !store.is_empty() && mode != SslMode::Disable;
    let chain = if checks_chain {
        Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
                .build()
                .map_err(|e| HubError::Config(format!("TLS to PostgreSQL: {e}")))?,
        )
    } else {
        None
    };
    let verifier = Arc::new(LibpqVerifier {
        chain,
        // libpq checks the chain in verify-ca, and in prefer and require when a CA is
        // given; the name only in verify-full.
        name: mode == SslMode::VerifyFull,
        provider,
    });
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The server's certificate as libpq checks it: its chain when a CA is given (`chain`), its
/// name too in verify-full (`name`), nothing otherwise (`prefer` and `require` without a CA:
/// encryption against a passive eavesdropper, not against an impostor). The handshake's
/// signatures are always checked.
#[derive(Debug)]
struct LibpqVerifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    name: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for LibpqVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // webpki checks the chain first and the name last: a name error means the chain is
        // good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, SslParams) {
        split_ssl_params(url).unwrap()
    }

    #[test]
    fn ssl_parameters_are_taken_out_of_urls() {
        let (rest, ssl) = split(
            "postgres://u:p%3Fw@db:5432/hub?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p%3Fw@db:5432/hub?application_name=x");
        assert_eq!(ssl.mode.as_deref(), Some("verify-full"));
        assert_eq!(ssl.rootcert.as_deref(), Some("/etc/ca.pem"));
        let (rest, ssl) = split("postgresql://db/hub?sslmode=disable");
        assert_eq!(rest, "postgresql://db/hub");
        assert_eq!(ssl.mode.as_deref(), Some("disable"));
        let (rest, ssl) = split("postgres://db/hub");
        assert_eq!(
            (rest.as_str(), ssl),
            ("postgres://db/hub", SslParams::default())
        );
    }

    #[test]
    fn ssl_parameters_are_taken_out_of_key_value_strings() {
        let (rest, ssl) = split(
            "host=db user=hub password='it\\'s x' sslmode = verify-ca sslrootcert='/a b/ca.pem' dbname=hub",
        );
        assert_eq!(ssl.mode.as_deref(), Some("verify-ca"));
        assert_eq!(ssl.rootcert.as_deref(), Some("/a b/ca.pem"));
        assert!(!rest.contains("ssl"), "{rest}");
        assert!(rest.starts_with("host=db user=hub password="), "{rest}");
        assert!(rest.ends_with("dbname=hub"), "{rest}");
    }

    #[test]
    fn modes_follow_libpq() {
        let err = |url: &str| Target::new(url, None).err().unwrap().to_string();
        assert!(err("postgres://db/x?sslmode=verify-full").contains("sslrootcert"));
        assert!(err("postgres://db/x?sslmode=verify-ca").contains("--postgres-ca"));
        assert!(err("postgres://db/x?sslmode=allow").contains("prefer"));
        assert!(err("postgres://db/x?sslmode=bogus").contains("verify-full"));
        assert!(err("postgres://db/x?sslrootcert=system&sslmode=require").contains("verify-full"));
        assert!(
            err("postgres://db/x?sslrootcert=/nonexistent/ca.pem&sslmode=verify-ca")
                .contains("/nonexistent/ca.pem")
        );
        let target = Target::new("postgres://db/x?sslrootcert=system", None).unwrap();
        assert_eq!(target.mode(), SslMode::VerifyFull);
        let target = Target::new("postgres://db/x", None).unwrap();
        assert_eq!(target.mode(), SslMode::Prefer);
        assert_eq!(target.config.get_ssl_mode(), PgSslMode::Prefer);
        let target = Target::new("postgres://db/x?sslmode=disable", None).unwrap();
        assert_eq!(target.config.get_ssl_mode(), PgSslMode::Disable);
        let both = Target::new(
            "postgres://db/x?sslrootcert=/a.pem",
            Some(Path::new("/b.pem")),
        );
        assert!(both.err().unwrap().to_string().contains("twice"));
    }

    #[test]
    fn errors_never_show_the_password() {
        let err = Target::new("postgres://u:s3cret@db/x?sslmode=verify-full", None)
            .err()
            .unwrap()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }
}
