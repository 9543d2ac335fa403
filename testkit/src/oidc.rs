//! A local OIDC issuer for tests: an HTTPS server (its serving certificate from a CA made at
//! test time) answering `/.well-known/openid-configuration` and the JWKS it names, and ID
//! tokens signed (ES256) with keys it makes. Keys can be rotated (a new `kid` published),
//! and tokens signed with keys it never publishes, so tests can prove what a verifier does
//! with each. It counts JWKS fetches, so tests can see when a verifier fetched again.

// Test support that panics, like `pki::ca`: a failed set-up should end the test.
#![allow(clippy::expect_used)]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{Json, Router, extract::State, routing::get};
use base64::Engine as _;
use ring::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _},
};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::{contract::TlsListener, pki, tls};

/// One ES256 signing key and its key id.
pub struct SigningKey {
    pub kid: String,
    pair: EcdsaKeyPair,
}

impl SigningKey {
    /// A new random P-256 key named `kid`.
    pub fn new(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generating a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("reading the key just made");
        SigningKey {
            kid: kid.to_string(),
            pair,
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64(&point[1..33]), "y": b64(&point[33..]),
        })
    }

    /// A compact JWS of `claims` signed with this key.
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signed.as_bytes())
            .expect("signing");
        format!("{signed}.{}", b64(signature.as_ref()))
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Unix seconds now.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

struct Published {
    url: String,
    keys: Mutex<Vec<Arc<SigningKey>>>,
    jwks_fetches: AtomicUsize,
}

/// A running issuer.
pub struct Issuer {
    /// `https://127.0.0.1:<port>`: the `iss` of its tokens.
    pub url: String,
    /// PEM of the CA that signed its serving certificate (`certificateAuthority`).
    pub ca_pem: String,
    published: Arc<Published>,
}

impl Issuer {
    /// Starts an issuer publishing one key (`kid` `key-1`).
    pub async fn start() -> Issuer {
        let ca = pki::ca("oidc-test-ca");
        let (cert_pem, key_pem) = pki::leaf(
            &ca,
            &["localhost"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        let server = tls::server_config(&cert_pem, &key_pem).expect("the issuer's TLS");
        let inner = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let port = inner.local_addr().expect("its address").port();
        let url = format!("https://localhost:{port}");
        let published = Arc::new(Published {
            url: url.clone(),
            keys: Mutex::new(vec![Arc::new(SigningKey::new("key-1"))]),
            jwks_fetches: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(jwks))
            .with_state(published.clone());
        let listener = TlsListener {
            inner,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        };
        tokio::spawn(async move { axum::serve(listener, app).await });
        Issuer {
            url,
            ca_pem: ca.pem(),
            published,
        }
    }

    /// The key tokens are signed with now (the last published).
    pub fn current_key(&self) -> Arc<SigningKey> {
        let keys = self.published.keys.lock().expect("keys");
        keys.last().expect("a key").clone()
    }

    /// Publishes a new key named `kid` in place of the others (the issuer rotated) and
    /// returns it.
    pub fn rotate(&self, kid: &str) -> Arc<SigningKey> {
        let key = Arc::new(SigningKey::new(kid));
        *self.published.keys.lock().expect("keys") = vec![key.clone()];
        key
    }

    /// How many times the JWKS was fetched.
    pub fn jwks_fetches(&self) -> usize {
        self.published.jwks_fetches.load(Ordering::SeqCst)
    }

    /// Claims of an ID token for `email` in `groups` for audience `aud`, valid for an hour.
    pub fn claims(&self, email: &str, groups: &[&str], aud: &str) -> Value {
        let now = now();
        json!({
            "iss": self.url, "sub": email, "aud": aud, "email": email, "email_verified": true,
            "groups": groups, "iat": now, "nbf": now - 5, "exp": now + 3600,
        })
    }

    /// An ID token of [`Self::claims`] signed with the current key.
    pub fn id_token(&self, email: &str, groups: &[&str], aud: &str) -> String {
        self.current_key().sign(&self.claims(email, groups, aud))
    }

    /// The `jwt` entry of an `AuthenticationConfiguration` trusting this issuer for
    /// `audience`, with username (email) and groups prefixed `oidc:`.
    pub fn authentication_config(&self, audience: &str) -> String {
        let ca = self
            .ca_pem
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>();
        format!(
            "apiVersion: apiserver.config.k8s.io/v1beta1\n\
             kind: AuthenticationConfiguration\n\
             jwt:\n\
             - issuer:\n    url: {}\n    audiences: [{audience}]\n    certificateAuthority: |\n{ca}\
             \x20 claimMappings:\n    username: {{claim: email, prefix: \"oidc:\"}}\n    \
             groups: {{claim: groups, prefix: \"oidc:\"}}\n",
            self.url
        )
    }
}

async fn discovery(State(published): State<Arc<Published>>) -> Json<Value> {
    Json(json!({
        "issuer": published.url,
        "jwks_uri": format!("{}/jwks", published.url),
        "id_token_signing_alg_values_supported": ["ES256"],
    }))
}

async fn jwks(State(published): State<Arc<Published>>) -> Json<Value> {
    published.jwks_fetches.fetch_add(1, Ordering::SeqCst);
    let keys: Vec<Value> = published
        .keys
        .lock()
        .expect("keys")
        .iter()
        .map(|k| k.jwk())
        .collect();
    Json(json!({ "keys": keys }))
}
