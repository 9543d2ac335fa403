//! [`AuthBook`]: the hub's credentials in one handle. The tokens it issued (the proxy's and
//! the API's), the admin token, the API tokens file, agents' tokens and enrolled identities,
//! the CA that issues agents' certificates, and the issuers trusted for client certificates.
//! Whatever authenticates a caller or an agent, or issues a credential, takes this handle
//! rather than the whole hub.

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::{
    admin_token::AdminTokenFile,
    agent_auth::ClientCertificates,
    agent_ca::AgentCa,
    agent_tokens::AgentTokens,
    api_auth::TokensFile,
    credential_sessions::{Credential, CredentialSessions},
    identity_states::IdentityStates,
    oidc::{Oidc, reload::OidcFiles},
    tokens::Tokens,
};

/// The hub's credentials (locks poisoned by a panic are taken over: each critical section
/// keeps its book consistent and never panics by design).
pub struct AuthBook {
    /// The tokens the hub issued: the proxy's per-account tokens and API tokens.
    tokens: Mutex<Tokens>,
    /// The admin token (the admin token file, re-read in the background); `None` without
    /// one.
    admin_token: Option<Arc<AdminTokenFile>>,
    /// The CA that issues agents' certificates (enrolment, renewal).
    agent_ca: AgentCa,
    /// The issuers trusted for client certificates; `None` with `--insecure-plaintext`.
    /// Replaced when `--client-ca` changes on disk.
    client_certificates: Option<RwLock<Arc<ClientCertificates>>>,
    /// Enrolment and bearer tokens of agents, and the enrolled identities.
    agent_tokens: Mutex<AgentTokens>,
    /// The API tokens file (`--api-tokens-file`), re-read in the background.
    api_tokens_file: Option<Arc<TokensFile>>,
    /// Identities an admin disabled, certificates denied (loaded at start-up with
    /// [`Self::identity_states`]).
    identity_states: Mutex<IdentityStates>,
    /// The OIDC issuers and access rules (`--authentication-config`, `--oidc-access`),
    /// replaced when the files change.
    oidc: Option<RwLock<Arc<Oidc>>>,
    /// The files they come from, read again in the background.
    oidc_files: Option<Arc<OidcFiles>>,
    /// What each revocable credential holds open (streams, watches, exec sessions).
    sessions: Arc<CredentialSessions>,
}

impl AuthBook {
    pub fn new(
        tokens: Tokens,
        admin_token: Option<Arc<AdminTokenFile>>,
        agent_ca: AgentCa,
        client_certificates: Option<ClientCertificates>,
        agent_tokens: AgentTokens,
        api_tokens_file: Option<Arc<TokensFile>>,
    ) -> Self {
        AuthBook {
            tokens: Mutex::new(tokens),
            admin_token,
            agent_ca,
            client_certificates: client_certificates.map(|c| RwLock::new(Arc::new(c))),
            agent_tokens: Mutex::new(agent_tokens),
            api_tokens_file,
            identity_states: Mutex::new(IdentityStates::default()),
            oidc: None,
            oidc_files: None,
            sessions: Arc::default(),
        }
    }

    /// What each revocable credential holds open ([`CredentialSessions`]).
    pub fn credential_sessions(&self) -> &Arc<CredentialSessions> {
        &self.sessions
    }

    /// Ends what credentials that no longer open anything still hold open: revoked (here,
    /// or on another replica, once this replica read the store again) or rotated. Returns
    /// how many streams and requests it ended.
    pub fn end_revoked_sessions(&self) -> usize {
        let mut ended = 0;
        for credential in self.sessions.credentials() {
            let valid = match &credential {
                Credential::Token(id) => self.tokens().opens(id),
                Credential::AgentToken(id) => self.agent_tokens().holds(id),
            };
            if !valid {
                let n = self.sessions.end(&credential);
                tracing::info!(
                    kind = credential.kind(),
                    id = credential.id(),
                    ended = n,
                    "credential no longer valid: what it held open is ended"
                );
                ended += n;
            }
        }
        ended
    }

    /// Accepts OIDC ID tokens of `oidc`'s issuers from now on; `files` are where they
    /// come from, read again by [`Self::reload_oidc`].
    pub fn with_oidc(mut self, oidc: Option<Arc<Oidc>>, files: Option<OidcFiles>) -> Self {
        self.oidc = oidc.map(RwLock::new);
        self.oidc_files = files.map(Arc::new);
        self
    }

    /// The OIDC issuers and access rules now, when `--authentication-config` is set.
    pub fn oidc(&self) -> Option<Arc<Oidc>> {
        self.oidc
            .as_ref()
            .map(|lock| lock.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// The files of the OIDC issuers and access rules, when `--authentication-config` is
    /// set.
    pub fn oidc_files(&self) -> Option<&Arc<OidcFiles>> {
        self.oidc_files.as_ref()
    }

    /// Takes the issuers and rules `files` read, when they changed and parse.
    pub fn reload_oidc(&self) {
        let (Some(lock), Some(files)) = (&self.oidc, &self.oidc_files) else {
            return;
        };
        if let Some(oidc) = files.reload() {
            *lock.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(oidc);
        }
    }

    /// Identities an admin disabled, certificates denied, as this replica knows them.
    pub fn identity_states(&self) -> MutexGuard<'_, IdentityStates> {
        self.identity_states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The tokens the hub issued (the proxy's and the API's).
    pub fn tokens(&self) -> MutexGuard<'_, Tokens> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Agent tokens and enrolled identities.
    pub fn agent_tokens(&self) -> MutexGuard<'_, AgentTokens> {
        self.agent_tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The issuers trusted for client certificates now (`None` with
    /// `--insecure-plaintext`).
    pub fn client_certificates(&self) -> Option<Arc<ClientCertificates>> {
        self.client_certificates
            .as_ref()
            .map(|lock| lock.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Trusts `clients` from now on (a changed `--client-ca`); nothing with
    /// `--insecure-plaintext`, which checks no client certificate.
    pub fn set_client_certificates(&self, clients: Arc<ClientCertificates>) {
        if let Some(lock) = &self.client_certificates {
            *lock.write().unwrap_or_else(|e| e.into_inner()) = clients;
        }
    }

    /// The admin token file, when the hub has one.
    pub fn admin_token(&self) -> Option<&Arc<AdminTokenFile>> {
        self.admin_token.as_ref()
    }

    /// The CA that issues agents' certificates.
    pub fn agent_ca(&self) -> &AgentCa {
        &self.agent_ca
    }

    /// The API tokens file (`--api-tokens-file`), if any.
    pub fn api_tokens_file(&self) -> Option<&Arc<TokensFile>> {
        self.api_tokens_file.as_ref()
    }
}
