//! The one HTTP client of the tests and the demo: plain HTTP/1 on loopback (the agent's
//! admin port, the hub's HTTP API, etcd's JSON gateway), on hyper's client.
//!
//! Every call makes its own connection and waits at most its timeout for the whole answer;
//! nothing is pooled, so a call may run on any Tokio runtime.

use std::{fmt::Display, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

use crate::{Error, Result};

/// How long [`get`] and [`get_json`] wait for an answer.
pub const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// An answer: the status code and the body (decoded as UTF-8, lossily).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    /// The body as JSON, `null` when it is not JSON.
    pub fn json_or_null(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

/// `method http://<addr><path>`, with `json_body` (sent as `application/json`) when given;
/// fails with [`Error::Http`] when there is no full answer within `timeout`. Any status is
/// an answer.
pub async fn request(
    method: &str,
    addr: impl Display,
    path: &str,
    json_body: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let url = format!("http://{addr}{path}");
    let http_error = |message: String| Error::Http {
        method: method.to_string(),
        url: url.clone(),
        message,
    };
    let mut builder = http::Request::builder().method(method).uri(&url);
    if json_body.is_some() {
        builder = builder.header(http::header::CONTENT_TYPE, "application/json");
    }
    let request = builder
        .body(Full::new(Bytes::from(
            json_body.map(str::to_owned).unwrap_or_default(),
        )))
        .map_err(|e| http_error(format!("request: {e}")))?;
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            // The legacy client's own message is only "client error (Connect)": add the cause.
            let cause = std::error::Error::source(&e).map(|s| format!(": {s}"));
            format!("{e}{}", cause.unwrap_or_default())
        })?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the body: {e}"))?
            .to_bytes();
        std::result::Result::<_, String>::Ok(Response {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| http_error(format!("no answer within {} s", timeout.as_secs())))?
        .map_err(http_error)
}

/// `GET http://<addr><path>`, waiting up to [`GET_TIMEOUT`]: the status and the body.
pub async fn get(addr: impl Display, path: &str) -> Result<Response> {
    request("GET", addr, path, None, GET_TIMEOUT).await
}

/// `GET` a JSON document; `None` on 404, an error on any other status but 200.
pub async fn get_json(addr: impl Display, path: &str) -> Result<Option<serde_json::Value>> {
    let Response { status, body } = get(&addr, path).await?;
    let error = |message: String| Error::Http {
        method: "GET".into(),
        url: format!("http://{addr}{path}"),
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

/// `POST`s a JSON document, waiting up to `timeout` for the answer; returns the status and
/// the body as JSON (`null` when it is not JSON).
pub async fn post_json(
    addr: impl Display,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<(u16, serde_json::Value)> {
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
