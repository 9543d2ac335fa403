//! An issuer's signing keys: discovery (`/.well-known/openid-configuration`) and the JWKS it
//! names, fetched over TLS (the issuer's `certificateAuthority`, or public roots) and kept.
//! They are fetched on the first token, again when a token names a key id the hub does not
//! hold (the issuer rotated; at most once per [`MIN_REFETCH`], so forged key ids cannot make
//! the hub hammer the issuer), and when older than [`MAX_AGE`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use scale_agent_hub_net::https::{self, ClientOptions, HttpsClient};
use serde::Deserialize;

use super::{
    config::IssuerConfig,
    jws::{Jwk, JwkSet, key_fits},
};

/// Keys older than this are fetched again before the next token is checked.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// The least time between two fetches caused by unknown key ids.
pub const MIN_REFETCH: Duration = Duration::from_secs(5);
/// How long one discovery or JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery or JWKS document read.
const MAX_DOCUMENT: usize = 1 << 20;

/// The fields of the discovery document the hub reads.
#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// One issuer's keys and how to fetch them again.
pub struct IssuerKeys {
    pub config: IssuerConfig,
    client: HttpsClient<Empty<Bytes>>,
    /// An async lock: one fetch at a time; tokens checked meanwhile wait for its keys.
    state: tokio::sync::Mutex<KeyState>,
}

#[derive(Default)]
struct KeyState {
    keys: Vec<Jwk>,
    /// When the keys held were fetched.
    fetched: Option<Instant>,
    /// When a fetch was last tried (successful or not).
    tried: Option<Instant>,
}

impl IssuerKeys {
    /// The issuer's key book, with its TLS trust built now (a broken CA is an error at start).
    pub fn new(config: IssuerConfig) -> Result<Self, String> {
        let ca = config.certificate_authority.as_ref().map(|pem| {
            (
                format!("{} certificateAuthority", config.url),
                pem.as_bytes(),
            )
        });
        let tls = https::client_tls_config(ca)?;
        let client = https::client(
            tls,
            ClientOptions {
                connect_timeout: Some(FETCH_TIMEOUT),
                ..ClientOptions::default()
            },
        );
        Ok(IssuerKeys {
            config,
            client,
            state: tokio::sync::Mutex::new(KeyState::default()),
        })
    }

    /// The keys that may have signed a token of `alg` with key id `kid`, fetching as the
    /// module docs say.
    pub async fn keys_for(&self, kid: Option<&str>, alg: &str) -> Result<Vec<Jwk>, String> {
        let mut state = self.state.lock().await;
        let stale = state.fetched.is_none_or(|at| at.elapsed() >= MAX_AGE);
        if stale {
            self.refetch(&mut state).await?;
        }
        let found = matching(&state.keys, kid, alg);
        if !found.is_empty() {
            return Ok(found);
        }
        // A key the hub does not hold: the issuer may have rotated.
        if !stale && state.tried.is_none_or(|at| at.elapsed() >= MIN_REFETCH) {
            self.refetch(&mut state).await?;
            let found = matching(&state.keys, kid, alg);
            if !found.is_empty() {
                return Ok(found);
            }
        }
        Err(format!(
            "it is signed with a key the issuer {} does not publish (kid {:?}, {alg}; the \
             hub fetches the issuer's keys again at most every {} s)",
            self.config.url,
            kid.unwrap_or(""),
            MIN_REFETCH.as_secs()
        ))
    }

    /// Fetches discovery and the JWKS; on failure keeps the keys held (the issuer may be
    /// briefly down) and fails only when it holds none.
    async fn refetch(&self, state: &mut KeyState) -> Result<(), String> {
        state.tried = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => {
                tracing::info!(issuer = %self.config.url, keys = keys.len(), "fetched the OIDC issuer's keys");
                state.keys = keys;
                state.fetched = Some(Instant::now());
                Ok(())
            }
            Err(error) if !state.keys.is_empty() => {
                tracing::warn!(issuer = %self.config.url, %error, "cannot fetch the OIDC issuer's keys; keeping those fetched before");
                Ok(())
            }
            Err(error) => Err(format!(
                "the hub cannot fetch the keys of its issuer {}: {error}",
                self.config.url
            )),
        }
    }

    async fn fetch(&self) -> Result<Vec<Jwk>, String> {
        let discovery_url = self.config.discovery_url.clone().unwrap_or_else(|| {
            format!(
                "{}/.well-known/openid-configuration",
                self.config.url.trim_end_matches('/')
            )
        });
        let discovery: Discovery = self.get_json(&discovery_url).await?;
        // Without a separate discoveryURL the document must be the issuer's own (OpenID
        // Connect Discovery 1.0, section 4.3).
        if self.config.discovery_url.is_none()
            && discovery.issuer.trim_end_matches('/') != self.config.url.trim_end_matches('/')
        {
            return Err(format!(
                "{discovery_url} names issuer {:?}, not {:?}",
                discovery.issuer, self.config.url
            ));
        }
        if !discovery.jwks_uri.starts_with("https://") {
            return Err(format!(
                "{discovery_url}: jwks_uri {:?} is not an https:// URL",
                discovery.jwks_uri
            ));
        }
        let set: JwkSet = self.get_json(&discovery.jwks_uri).await?;
        Ok(set.keys)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let request = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|e| format!("{url}: {e}"))?;
        let fetch = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("GET {url}: {}", error_chain(&e)))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_DOCUMENT)
                .collect()
                .await
                .map_err(|e| format!("GET {url}: reading the answer: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("GET {url} answered {status}"));
            }
            serde_json::from_slice(&body)
                .map_err(|e| format!("GET {url}: not the JSON expected: {e}"))
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("GET {url}: no answer in {} s", FETCH_TIMEOUT.as_secs()))?
    }
}

fn matching(keys: &[Jwk], kid: Option<&str>, alg: &str) -> Vec<Jwk> {
    keys.iter()
        .filter(|k| key_fits(k, alg))
        .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
        .cloned()
        .collect()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
