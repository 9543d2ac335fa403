//! The one-shot HTTP client of the tests, the demo and the bench, on hyper's client: plain
//! HTTP/1 on loopback (the agent's admin port, etcd's JSON gateway, a plaintext hub) and
//! HTTPS to the hub's TLS listener (its REST API, admin API and Kubernetes API proxy) with a
//! given CA. It fails with an [`Error`] rather than panicking; [`crate::https::Https`] is
//! the client of one HTTPS server for tests that panic.
//!
//! Every call makes its own connection and waits at most its timeout for the whole answer;
//! nothing is pooled, so a call may run on any Tokio runtime.

use std::{fmt::Display, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

use crate::tls;

/// Why a [`Call`] got no full answer (an unusable CA included).
#[derive(Debug, thiserror::Error)]
#[error("{method} {url}: {message}")]
pub struct Error {
    pub method: String,
    pub url: String,
    pub message: String,
}

/// An HTTPS-only connector with `tls` (ALPN: HTTP/1.1, and HTTP/2 first when `http2`).
pub(crate) fn https_connector(
    tls: rustls::ClientConfig,
    http2: bool,
) -> HttpsConnector<HttpConnector> {
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1();
    if http2 {
        builder.enable_http2().build()
    } else {
        builder.build()
    }
}

/// How long [`get`] and [`get_json`] wait for an answer.
pub const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// An answer: the status code, the headers and the body (decoded as UTF-8, lossily).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Response {
    /// The body as JSON, `null` when it is not JSON.
    pub fn json_or_null(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }

    /// The first value of a header (names compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request: a full URL (`http://` or `https://`), headers, an optional body, and for
/// HTTPS the PEM CA to trust.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub ca_pem: Option<String>,
    pub timeout: Duration,
}

impl Call {
    /// `method url`, no headers or body, [`GET_TIMEOUT`].
    pub fn new(method: &str, url: impl Into<String>) -> Self {
        Call {
            method: method.to_string(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
            ca_pem: None,
            timeout: GET_TIMEOUT,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// `Authorization: Bearer <token>`.
    pub fn bearer(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// A JSON body (`Content-Type: application/json`).
    pub fn json(mut self, body: &serde_json::Value) -> Self {
        self.body = Some(body.to_string().into_bytes());
        self.header("content-type", "application/json")
    }

    /// Trusts this PEM CA for HTTPS.
    pub fn ca(mut self, pem: impl Into<String>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Waits at most this long for the whole answer.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends it; any status is an answer, no full answer within the timeout is
    /// [`Error`].
    pub async fn send(self) -> Result<Response, Error> {
        let http_error = |message: String| Error {
            method: self.method.clone(),
            url: self.url.clone(),
            message,
        };
        let mut builder = http::Request::builder()
            .method(self.method.as_str())
            .uri(&self.url);
        for (name, value) in &self.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let request = builder
            .body(Full::new(Bytes::from(
                self.body.clone().unwrap_or_default(),
            )))
            .map_err(|e| http_error(format!("request: {e}")))?;
        let exchange = async {
            let response = if self.url.starts_with("https://") {
                let tls = tls::client_config(self.ca_pem.as_deref())
                    .map_err(|e| format!("TLS client set-up: {e}"))?;
                Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(0)
                    .build::<_, Full<Bytes>>(https_connector(tls, false))
                    .request(request)
                    .await
            } else {
                Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(0)
                    .build_http::<Full<Bytes>>()
                    .request(request)
                    .await
            }
            .map_err(|e| {
                // The legacy client's own message is only "client error (Connect)": add
                // the cause.
                let cause = std::error::Error::source(&e).map(|s| format!(": {s}"));
                format!("{e}{}", cause.unwrap_or_default())
            })?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("reading the body: {e}"))?
                .to_bytes();
            Result::<_, String>::Ok(Response {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
                headers,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| http_error(format!("no answer within {} s", self.timeout.as_secs())))?
            .map_err(http_error)
    }
}

impl Call {
    /// Sends it and reads a JSON document: `None` on 404, an error on any other status but
    /// 200 (what [`get_json`] does for plain HTTP, for any URL and CA).
    pub async fn fetch_json(self) -> Result<Option<serde_json::Value>, Error> {
        let (method, url) = (self.method.clone(), self.url.clone());
        let Response { status, body, .. } = self.send().await?;
        let error = |message: String| Error {
            method: method.clone(),
            url: url.clone(),
            message,
        };
        match status {
            404 => Ok(None),
            200 => serde_json::from_str(&body)
                .map(Some)
                .map_err(|e| error(format!("invalid JSON ({e}): {body}"))),
            _ => Err(error(format!("status {status}: {body}"))),
        }
    }
}

/// `method http://<addr><path>`, with `json_body` (sent as `application/json`) when given;
/// fails with [`Error`] when there is no full answer within `timeout`. Any status is
/// an answer.
pub async fn request(
    method: &str,
    addr: impl Display,
    path: &str,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<Response, Error> {
    let mut call = Call::new(method, format!("http://{addr}{path}")).timeout(timeout);
    if let Some(body) = json_body {
        call.body = Some(body.as_bytes().to_vec());
        call = call.header("content-type", "application/json");
    }
    call.send().await
}

/// `GET http://<addr><path>`, waiting up to [`GET_TIMEOUT`]: the status and the body.
pub async fn get(addr: impl Display, path: &str) -> Result<Response, Error> {
    request("GET", addr, path, None, GET_TIMEOUT).await
}

/// `GET` a JSON document; `None` on 404, an error on any other status but 200.
pub async fn get_json(addr: impl Display, path: &str) -> Result<Option<serde_json::Value>, Error> {
    Call::new("GET", format!("http://{addr}{path}"))
        .fetch_json()
        .await
}

/// `POST`s a JSON document, waiting up to `timeout` for the answer; returns the status and
/// the body as JSON (`null` when it is not JSON).
pub async fn post_json(
    addr: impl Display,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<(u16, serde_json::Value), Error> {
    let response = request("POST", addr, path, Some(&body.to_string()), timeout).await?;
    Ok((response.status, response.json_or_null()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP/1.0 server answering `answer` and handing back what it was sent.
    async fn serve_once(
        answer: &'static str,
    ) -> (std::net::SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the head, then the body its Content-Length announces.
            loop {
                let n = stream.read(&mut buf).await.unwrap();
                received.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&received).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(str::to_owned)
                        })
                        .and_then(|l| l.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() >= length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            stream.write_all(answer.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
            String::from_utf8_lossy(&received).to_string()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn get_json_reads_a_document_and_none_on_404() {
        let (addr, _) = serve_once("HTTP/1.0 200 OK\r\n\r\n{\"a\":1}").await;
        assert_eq!(
            get_json(addr, "/x").await.unwrap(),
            Some(serde_json::json!({ "a": 1 }))
        );
        let (addr, _) = serve_once("HTTP/1.0 404 Not Found\r\n\r\nnope").await;
        assert_eq!(get_json(addr, "/x").await.unwrap(), None);
        let (addr, _) = serve_once("HTTP/1.0 500 Oops\r\n\r\nbroken").await;
        let error = get_json(addr, "/x").await.unwrap_err().to_string();
        assert!(error.contains("status 500: broken"), "{error}");
    }

    #[tokio::test]
    async fn fetch_json_reads_a_document_from_any_call() {
        let (addr, sent) = serve_once("HTTP/1.0 200 OK\r\n\r\n{\"a\":1}").await;
        let call = Call::new("GET", format!("http://{addr}/x")).bearer("t");
        assert_eq!(
            call.fetch_json().await.unwrap(),
            Some(serde_json::json!({ "a": 1 }))
        );
        assert!(
            sent.await
                .unwrap()
                .to_ascii_lowercase()
                .contains("authorization: bearer t")
        );
        let (addr, _) = serve_once("HTTP/1.0 404 Not Found\r\n\r\nnope").await;
        let call = Call::new("GET", format!("http://{addr}/x"));
        assert_eq!(call.fetch_json().await.unwrap(), None);
        let (addr, _) = serve_once("HTTP/1.0 503 Busy\r\n\r\nlater").await;
        let error = Call::new("GET", format!("http://{addr}/x"))
            .fetch_json()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!("GET http://{addr}/x: status 503: later")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn post_json_sends_the_document() {
        let (addr, sent) =
            serve_once("HTTP/1.1 202 Accepted\r\nContent-Length: 8\r\n\r\n{\"b\":2}\n").await;
        let (status, body) = post_json(addr, "/p", &serde_json::json!({ "q": 1 }), GET_TIMEOUT)
            .await
            .unwrap();
        assert_eq!((status, body), (202, serde_json::json!({ "b": 2 })));
        let sent = sent.await.unwrap();
        assert!(sent.starts_with("POST /p HTTP/1.1\r\n"), "{sent}");
        assert!(
            sent.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{sent}"
        );
        assert!(sent.ends_with("{\"q\":1}"), "{sent}");
    }

    #[tokio::test]
    async fn no_answer_is_a_timeout_and_no_server_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let error = request("GET", addr, "/slow", None, Duration::from_millis(200))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("no answer within"), "{error}");
        drop(listener);
        let error = get(addr, "/gone").await.unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("GET http://{addr}/gone: ")),
            "{error}"
        );
    }
}
