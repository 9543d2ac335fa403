//! The HTTP client of the Account Management API: `PUT {api}/credentials`, `DELETE
//! {api}/credentials/{name}` and `GET {api}/credentials/type/kubernetes` (reading definitions
//! to migrate, see [`crate::definitions`]), over http or https (webpki's public roots plus an
//! optional CA file), each with a deadline. It reports status and error text; deciding what
//! they mean is [`super::body::classify`]'s job.

use std::{path::Path, time::Duration};

use http::{HeaderValue, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use rustls::ClientConfig;
use scale_agent_hub_model::error::Chain;
use scale_agent_hub_net::https::{ClientOptions, HttpsClient};

use super::body::{Method, path_segment};

/// Error bodies are read up to this size (the message is all that is kept).
const MAX_BODY: usize = 64 * 1024;

/// Clouddriver's answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    /// Read for error answers and GETs only: a successful PUT echoes the definition,
    /// kubeconfig and token included, and is dropped unread.
    pub body: Vec<u8>,
}

/// No answer: the request could not be sent or timed out.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Transport(String),
}

/// A client for one Clouddriver.
pub(crate) struct Client {
    http: HttpsClient<Full<Bytes>>,
    /// `api_url` without a trailing `/`.
    base: String,
    user: Option<HeaderValue>,
    timeout: Duration,
}

fn tls_config(ca_file: Option<&Path>) -> Result<ClientConfig, String> {
    let pem = ca_file
        .map(|path| {
            std::fs::read(path)
                .map(|pem| (path, pem))
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
        })
        .transpose()?;
    client_tls_config(
        pem.as_ref()
            .map(|(path, pem)| (path.display().to_string(), pem.as_slice())),
    )
}

/// A TLS client configuration trusting webpki's public roots and a PEM bundle (in the net
/// crate, beside the HTTPS client builder).
pub(crate) use scale_agent_hub_net::https::client_tls_config;

/// Checks `api_url`: http or https, with a host; returns it without a trailing `/`.
pub(crate) fn parse_api_url(api_url: &str) -> Result<String, String> {
    let base = api_url.trim().trim_end_matches('/');
    let uri: Uri = base
        .parse()
        .map_err(|e| format!("--clouddriver-url {api_url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(format!(
                "--clouddriver-url {api_url:?} must start with http:// or https://"
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("--clouddriver-url {api_url:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!(
            "--clouddriver-url {api_url:?} must not have a query"
        ));
    }
    Ok(base.to_owned())
}

impl Client {
    /// A client for `api_url` (e.g. `http://spin-clouddriver:7002`).
    pub fn new(
        api_url: &str,
        user: Option<&str>,
        ca_file: Option<&Path>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let base = parse_api_url(api_url)?;
        let user = user
            .map(|u| {
                HeaderValue::from_str(u)
                    .map_err(|_| format!("--clouddriver-user {u:?} is not a valid header value"))
            })
            .transpose()?;
        let http =
            scale_agent_hub_net::https::client(tls_config(ca_file)?, ClientOptions::default());
        Ok(Client {
            http,
            base,
            user,
            timeout,
        })
    }

    /// `PUT /credentials`: save (create or replace) one account definition.
    pub async fn put_credentials(&self, body: Vec<u8>) -> Result<Answer, SendError> {
        self.send(Method::Put, format!("{}/credentials", self.base), body)
            .await
    }

    /// `DELETE /credentials/{name}`.
    pub async fn delete_credentials(&self, name: &str) -> Result<Answer, SendError> {
        let uri = format!("{}/credentials/{}", self.base, path_segment(name));
        self.send(Method::Delete, uri, Vec::new()).await
    }

    /// `GET /credentials/type/kubernetes?limit=1&startingAccountName={name}`: the first
    /// Kubernetes definition whose name sorts at or after `name` (Clouddriver's
    /// `listAccountsByType`, its SQL repository filtering `id >= startingAccountName` ordered
    /// by id), which is `name`'s own when it exists.
    pub async fn kubernetes_definition_from(&self, name: &str) -> Result<Answer, SendError> {
        let uri = format!(
            "{}/credentials/type/kubernetes?limit=1&startingAccountName={}",
            self.base,
            path_segment(name)
        );
        self.send(Method::Get, uri, Vec::new()).await
    }

    async fn send(&self, method: Method, uri: String, body: Vec<u8>) -> Result<Answer, SendError> {
        let mut request = Request::builder()
            .method(method.as_str())
            .uri(uri)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("scale-agent-hub/", env!("CARGO_PKG_VERSION")),
            );
        if method == Method::Put {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(user) = &self.user {
            request = request.header("X-SPINNAKER-USER", user.clone());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| SendError::Transport(e.to_string()))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| SendError::Transport(Chain(&e).to_string()))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map(|c| c.to_bytes().to_vec())
                // The status is what matters; an unreadable error body just has no message.
                .unwrap_or_default();
            let body = if (200..300).contains(&status) && method != Method::Get {
                Vec::new()
            } else {
                body
            };
            Ok(Answer { status, body })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SendError::Timeout(self.timeout))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_api_url("http://spin-clouddriver:7002/").unwrap(),
            "http://spin-clouddriver:7002"
        );
        assert_eq!(
            parse_api_url("https://cd.example/clouddriver").unwrap(),
            "https://cd.example/clouddriver"
        );
        assert!(parse_api_url("spin-clouddriver:7002").is_err());
        assert!(parse_api_url("ftp://x").is_err());
        assert!(parse_api_url("http://x/?a=b").is_err());
    }

    #[test]
    fn ca_files() {
        let dir = std::env::temp_dir().join(format!("cd-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = tls_config(Some(&empty)).unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
        let err = tls_config(Some(&dir.join("missing.pem"))).unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
        assert!(tls_config(None).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
