//! A client of one HTTPS server for tests that panic on a failed set-up: hyper-util's
//! pooled client over hyper-rustls, trusting one CA, offering HTTP/1.1 or HTTP/2, with
//! streamed bodies both ways ([`Https::send`], [`read_to_end`]) and whole answers
//! ([`Reply`]) that check Kubernetes `Status` failures. [`crate::http::Call`] is the
//! fallible one-shot client.

// Test code: a failed request or a broken answer should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::Value;

use crate::{http::https_connector, tls};

/// How long the client waits for a response head, and then for a whole body: generous, the
/// machine is shared and slow.
pub const TIMEOUT: Duration = Duration::from_secs(20);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Request bodies of the test client: whole or streamed.
pub type ReqBody = BoxBody<Bytes, BoxError>;

/// Which HTTP version the client offers (ALPN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1 only: hop-by-hop and upgrade headers exist only there.
    H1,
    /// HTTP/2 preferred, as kubectl and client-go speak it.
    H2,
}

/// A client of one HTTPS server (hyper-util's legacy client over hyper-rustls) that trusts
/// one CA.
#[derive(Clone)]
pub struct Https {
    client: HyperClient<HttpsConnector<HttpConnector>, ReqBody>,
    /// e.g. `https://127.0.0.1:8443`, without a trailing `/`.
    pub base: String,
}

/// A whole answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    }

    /// Checks that this is a Kubernetes `Status` failure with `code` and `reason`, the way
    /// kubectl reads it; returns its message.
    pub fn k8s_status(&self, code: u16, reason: &str) -> String {
        assert_eq!(self.status, code, "{}", self.text());
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/json")
        );
        let v = self.json();
        assert_eq!(v["kind"], "Status", "{v}");
        assert_eq!(v["apiVersion"], "v1", "{v}");
        assert_eq!(v["status"], "Failure", "{v}");
        assert_eq!(v["reason"], reason, "{v}");
        assert_eq!(v["code"], code, "{v}");
        let message = v["message"].as_str().unwrap().to_string();
        assert!(!message.is_empty(), "{v}");
        message
    }

    /// Checks that this is an error the hub made on a discovery path: `code`, and the
    /// message as plain text (client-go's discovery client shows an error body only when it
    /// is not a JSON Status); returns the message.
    pub fn text_error(&self, code: u16) -> String {
        assert_eq!(self.status, code, "{}", self.text());
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("text/plain; charset=utf-8"),
            "{}",
            self.text()
        );
        let text = self.text();
        assert!(
            serde_json::from_str::<Value>(&text).is_err(),
            "a JSON body: {text}"
        );
        let message = text.trim_end().to_string();
        assert!(!message.is_empty(), "no message");
        message
    }
}

/// A whole request body.
pub fn full(body: impl Into<Bytes>) -> ReqBody {
    Full::new(body.into()).map_err(|e| match e {}).boxed()
}

/// An empty request body.
pub fn empty() -> ReqBody {
    full(Bytes::new())
}

impl Https {
    /// A client of `base` (`https://host:port`) trusting the CAs of `ca_pem`.
    pub fn new(ca_pem: &str, base: impl Into<String>, proto: Proto) -> Self {
        let tls = tls::client_config(Some(ca_pem)).unwrap();
        let connector = https_connector(tls, proto == Proto::H2);
        Https {
            client: HyperClient::builder(TokioExecutor::new()).build(connector),
            base: base.into().trim_end_matches('/').to_string(),
        }
    }

    /// The client itself, for requests expected to fail.
    pub fn raw(&self) -> &HyperClient<HttpsConnector<HttpConnector>, ReqBody> {
        &self.client
    }

    /// A request to `path` (appended to the base URL as it is, percent-encoding and all).
    pub fn request(&self, method: &str, path: &str) -> http::request::Builder {
        Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
    }

    /// Sends a request and returns the response head once it arrives; the body streams.
    pub async fn send(&self, request: Request<ReqBody>) -> Response<Incoming> {
        tokio::time::timeout(TIMEOUT, self.client.request(request))
            .await
            .expect("no response head in time")
            .unwrap()
    }

    /// Sends a request and reads the whole answer.
    pub async fn call(&self, request: Request<ReqBody>) -> Reply {
        let response = self.send(request).await;
        read_all(response).await
    }

    /// A GET with an optional bearer token.
    pub async fn get(&self, path: &str, token: Option<&str>) -> Reply {
        let mut request = self.request("GET", path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        self.call(request.body(empty()).unwrap()).await
    }

    /// A request with a bearer token and a whole body.
    pub async fn with_token(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: impl Into<Bytes>,
    ) -> Reply {
        let request = self
            .request(method, path)
            .header("authorization", format!("Bearer {token}"))
            .body(full(body))
            .unwrap();
        self.call(request).await
    }
}

/// Reads a whole response; panics on a broken body.
pub async fn read_all(response: Response<Incoming>) -> Reply {
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(TIMEOUT, body.collect())
        .await
        .expect("the body did not end in time")
        .unwrap()
        .to_bytes();
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    }
}

/// Reads a response body to its end: the bytes, and the error that broke it, if any.
pub async fn read_to_end(body: Incoming) -> (Vec<u8>, Option<hyper::Error>) {
    let mut body = body;
    let mut bytes = Vec::new();
    loop {
        match tokio::time::timeout(TIMEOUT, body.frame())
            .await
            .expect("the body neither went on nor ended in time")
        {
            None => return (bytes, None),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return (bytes, Some(e)),
        }
    }
}
