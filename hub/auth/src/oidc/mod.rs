//! Sign-in with the organisation's identity provider: OIDC ID tokens on the proxy and the
//! HTTP API.
//!
//! - [`config`]: `--authentication-config`, the Kubernetes API server's structured
//!   authentication file (the subset the hub supports);
//! - [`keys`]: each issuer's discovery and JWKS, fetched over TLS and refreshed;
//! - [`jws`]: the token's signature, checked with `ring`;
//! - [`claims`]: `iss`, `aud`, `exp`, `nbf`, and the username and groups with prefixes;
//! - [`access`]: `--oidc-access`, which accounts and API role a person gets;
//! - [`reload`]: both files read again while the hub runs.
//!
//! Verification is offline: nothing is asked of the issuer per token, only its keys are
//! fetched now and then.

pub mod access;
pub mod claims;
pub mod config;
pub mod jws;
pub mod keys;
pub mod reload;

use std::path::Path;

use scale_agent_hub_model::error::HubError;

use self::keys::IssuerKeys;
pub use self::{access::Access, claims::Person, jws::looks_like_jwt};

/// The trusted issuers and the access rules.
pub struct Oidc {
    issuers: Vec<IssuerKeys>,
    access: Access,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field(
                "issuers",
                &self
                    .issuers
                    .iter()
                    .map(|i| &i.config.url)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Oidc {
    /// From the two files' texts: `--authentication-config`'s and `--oidc-access`'s.
    pub fn from_texts(config: &str, access: Option<&str>) -> Result<Self, String> {
        let issuers = config::parse(config)?
            .into_iter()
            .map(IssuerKeys::new)
            .collect::<Result<Vec<_>, _>>()?;
        let access = match access {
            Some(text) => Access::parse(text).map_err(|e| format!("--oidc-access: {e}"))?,
            None => Access::default(),
        };
        Ok(Oidc { issuers, access })
    }

    /// Reads `--authentication-config` and `--oidc-access`; errors name the file and what
    /// to change in it.
    pub fn open(config: &Path, access: Option<&Path>) -> scale_agent_hub_model::Result<Self> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| HubError::ReadFile {
                path: path.to_path_buf(),
                source,
            })
        };
        let config_text = read(config)?;
        let access_text = access.map(read).transpose()?;
        let oidc = Oidc::from_texts(&config_text, access_text.as_deref()).map_err(|e| {
            HubError::Config(format!("--authentication-config {}: {e}", config.display()))
        })?;
        if access.is_none() {
            tracing::warn!(
                "--authentication-config without --oidc-access: people who sign in reach no account and no API route"
            );
        }
        Ok(oidc)
    }

    /// The access rules.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// The person an ID token names, once its issuer's key verified it and its claims
    /// passed. The error is the reason, for the 401 the caller gets.
    pub async fn authenticate(&self, token: &str) -> Result<Person, String> {
        let jws = jws::parse(token)?;
        let claimed = claims::issuer_of(&jws.payload).unwrap_or_default();
        let Some(issuer) = self.issuers.iter().find(|i| i.config.url == claimed) else {
            return Err(format!(
                "iss {claimed:?} is not an issuer the hub trusts ({})",
                self.issuers
                    .iter()
                    .map(|i| i.config.url.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        if !jws::ALGORITHMS.contains(&jws.header.alg.as_str()) {
            return Err(format!(
                "it is signed with {:?}; the hub verifies {}",
                jws.header.alg,
                jws::ALGORITHMS.join(", ")
            ));
        }
        let keys = issuer
            .keys_for(jws.header.kid.as_deref(), &jws.header.alg)
            .await?;
        if !keys.iter().any(|key| jws::verify(&jws, key).is_ok()) {
            return Err(format!(
                "its signature does not verify with the key(s) of {} it names",
                issuer.config.url
            ));
        }
        claims::judge(
            &jws.payload,
            &issuer.config,
            jiff::Timestamp::now().as_second(),
        )
    }
}
