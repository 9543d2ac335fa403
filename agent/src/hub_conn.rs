//! The connection to the hub: its URL, the TLS settings (read from disk on every connect),
//! the gRPC channel, the wait for Welcome, and errors described with what to change.

use std::time::Duration;

use futures::StreamExt;
use scale_agent_crds::agent_config::HubConnection;
use scale_agent_proto::v1::{self, HubMessage, hub_message};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{Error, Result};

/// How long the hub may take to accept the stream, and then to send Welcome.
pub const WELCOME_TIMEOUT: Duration = Duration::from_secs(30);

/// The hub's URL for `address` (`host:port`, or a URL whose scheme is replaced).
pub fn hub_url(address: &str, insecure: bool) -> String {
    let rest = address
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let scheme = if insecure { "http" } else { "https" };
    format!("{scheme}://{rest}")
}

fn read(what: &'static str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        what,
        path: path.into(),
        source,
    })
}

/// TLS settings for the hub, read from disk now (so rotated files are picked up on every
/// reconnect). Without a CA file the hub is verified against the public web PKI roots
/// compiled into the agent (a hub behind a publicly trusted load balancer), which does not
/// depend on what the container image ships in /etc/ssl.
pub fn tls_config(hub: &HubConnection, host: &str) -> Result<ClientTlsConfig> {
    let server_name = hub
        .tls
        .server_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| host.to_string());
    let mut tls = ClientTlsConfig::new().domain_name(server_name);
    tls = match hub.tls.cacert_file.as_deref() {
        Some(ca_file) => tls.ca_certificate(Certificate::from_pem(read("hub CA", ca_file)?)),
        None => tls.with_webpki_roots(),
    };
    match (&hub.tls.client_cert_file, &hub.tls.client_key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(
                read("client certificate", cert)?,
                read("client key", key)?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::InvalidConfig(
                "set both clouddriver.tls.clientCertFile and clientKeyFile (or --tls-cert and --tls-key), or neither".into(),
            ));
        }
    }
    Ok(tls)
}

/// Opens the gRPC channel to the hub.
pub async fn connect(hub: &HubConnection) -> Result<Channel> {
    connect_with(hub, true).await
}

/// Opens the gRPC channel to the hub, without the client certificate when
/// `client_certificate` is false (enrolment: the agent has none yet).
pub async fn connect_with(hub: &HubConnection, client_certificate: bool) -> Result<Channel> {
    let stripped;
    let hub = if client_certificate {
        hub
    } else {
        let mut without = hub.clone();
        // Decided on the full config: dropping the certificate must not turn TLS off.
        without.insecure = Some(hub.plaintext());
        without.tls.client_cert_file = None;
        without.tls.client_key_file = None;
        stripped = without;
        &stripped
    };
    let url = hub_url(&hub.grpc, hub.plaintext());
    let address_error = |message: String| Error::HubAddress {
        address: hub.grpc.clone(),
        message,
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| address_error(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        // A PING after 5 s without a byte from the hub, unanswered after 10 s, ends the
        // connection: a hub replica cut off by a silent partition is left within 15 s (the
        // two heartbeat periods of silence that end a stream otherwise are 30 s by default),
        // and the agent reconnects to another replica.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if !hub.plaintext() {
        let host = endpoint
            .uri()
            .host()
            .map(str::to_string)
            .ok_or_else(|| address_error("no host".into()))?;
        endpoint = endpoint
            .tls_config(tls_config(hub, &host)?)
            .map_err(|source| Error::Connect {
                address: url.clone(),
                source,
            })?;
    }
    let proxy = if hub.no_proxy {
        None
    } else {
        crate::egress::for_hub(&crate::egress::from_env(), endpoint.uri())
    };
    let connected = match proxy {
        Some(proxy) => {
            tracing::debug!(proxy = %proxy.uri(), hub = %url, "connecting to the hub through the proxy of HTTPS_PROXY (CONNECT)");
            endpoint
                .connect_with_connector(crate::egress::tunnel(&proxy)?)
                .await
        }
        None => endpoint.connect().await,
    };
    connected.map_err(|source| Error::Connect {
        address: url,
        source,
    })
}

/// An error on the hub connection as one line: every cause in its source chain (tonic's own
/// message is only "transport error"), and for the usual TLS mistakes, what to change.
/// With TLS 1.3 a client certificate the hub refuses surfaces on the first read of the
/// stream, not at connect, so this describes every way a stream ends.
pub fn describe_hub_error(error: &(dyn std::error::Error + 'static)) -> String {
    let chain = crate::error::Chain(error).to_string();
    let lower = chain.to_ascii_lowercase();
    let hint = if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        Some(
            "the hub's certificate is not signed by the CA this agent trusts: set clouddriver.tls.cacertFile (--hub-ca) to the CA that signed it",
        )
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        Some(
            "the hub's certificate does not name the host dialled: set clouddriver.tls.serverName (--hub-server-name) to a name in it",
        )
    } else if lower.contains("certificaterequired") || lower.contains("certificate required") {
        Some(
            "the hub requires a client certificate: set clouddriver.tls.clientCertFile and clientKeyFile (--tls-cert, --tls-key)",
        )
    } else if lower.contains("unknownca")
        || lower.contains("unknown ca")
        || lower.contains("badcertificate")
        || lower.contains("bad certificate")
    {
        Some(
            "the hub refused this agent's client certificate: it must be signed by the CA the hub trusts (the hub's --client-ca)",
        )
    } else if lower.contains("expired") {
        Some(
            "a certificate has expired: renew the agent's client certificate or the hub's serving certificate",
        )
    } else if lower.contains("connection refused") {
        Some(
            "nothing listens at the hub address: check clouddriver.grpc (--hub) and that the hub runs",
        )
    } else {
        None
    };
    match hint {
        Some(hint) => format!("{chain} ({hint})"),
        None => chain,
    }
}

/// Reads the hub's first messages up to Welcome; heartbeats before it are tolerated.
pub(crate) async fn await_welcome(
    inbound: &mut tonic::Streaming<HubMessage>,
) -> Result<v1::Welcome> {
    loop {
        match inbound.next().await {
            Some(Ok(HubMessage {
                kind: Some(hub_message::Kind::Welcome(welcome)),
            })) => return Ok(welcome),
            Some(Ok(HubMessage {
                kind: Some(hub_message::Kind::Heartbeat(_)),
            })) => {}
            Some(Ok(other)) => {
                return Err(Error::Protocol(format!(
                    "expected Welcome first, got {other:?}"
                )));
            }
            Some(Err(status)) => return Err(Error::Stream(status)),
            None => {
                return Err(Error::Protocol(
                    "the hub closed the stream before Welcome".into(),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_urls_take_the_scheme_from_the_tls_setting() {
        assert_eq!(hub_url("hub:9091", false), "https://hub:9091");
        assert_eq!(hub_url("hub:9091", true), "http://hub:9091");
        assert_eq!(
            hub_url("https://hub.example:443/", true),
            "http://hub.example:443"
        );
    }

    #[test]
    fn hub_errors_name_every_cause_and_say_what_to_change() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl std::fmt::Display for Layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Layer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|l| l as _)
            }
        }
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "invalid peer certificate: UnknownIssuer",
                None,
            ))),
        );
        let text = describe_hub_error(&error);
        assert!(
            text.starts_with("transport error: invalid peer certificate: UnknownIssuer"),
            "{text}"
        );
        assert!(
            text.contains("set clouddriver.tls.cacertFile (--hub-ca)"),
            "{text}"
        );
        let refused = Layer("received fatal alert: UnknownCA", None);
        assert!(describe_hub_error(&refused).contains("the hub's --client-ca"));
        assert_eq!(
            describe_hub_error(&Layer("stream reset", None)),
            "stream reset"
        );
    }

    #[test]
    fn tls_uses_the_ca_file_or_public_roots_and_needs_both_halves_of_the_identity() {
        let mut hub = HubConnection::default();
        // No CA file: the public roots compiled in.
        assert!(tls_config(&hub, "hub").is_ok());
        hub.tls.cacert_file = Some("/nonexistent/ca.pem".into());
        let err = tls_config(&hub, "hub")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let dir = std::env::temp_dir().join(format!("scale-agent-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["hub".into()]).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        hub.tls.cacert_file = Some(ca.display().to_string());
        assert!(tls_config(&hub, "hub").is_ok());
        hub.tls.client_cert_file = Some(ca.display().to_string());
        let err = tls_config(&hub, "hub")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("clientKeyFile"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
