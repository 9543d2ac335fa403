//! The steps of [`crate::start`] that read what the hub was given and left behind: the store
//! and what it holds, the credentials (the auth crate's [`AuthBook`]), the live state
//! rebuilt from the store, and the listeners. Each step is one job; `start` wires them to
//! the crates' handles and spawns the tasks.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use scale_agent_hub_auth::{
    AuthBook, admin_token::AdminTokenFile, identity_states::IdentityStates, oidc::Oidc,
};
use scale_agent_hub_replicas::Replicas;
use scale_agent_hub_store::{Loaded, Store};
use tokio::net::TcpListener;

use crate::{
    Config, GrpcSecurity, HttpSecurity,
    agent_auth::ClientCertificates,
    agent_ca::AgentCa,
    agent_tokens::AgentTokens,
    api_auth, cache,
    error::{HubError, Result},
    registry, serve,
    session::HubState,
    tokens::{self, AdminToken, Tokens},
};

/// The store, opened, and what it held at start-up.
pub(crate) struct OpenedStore {
    pub(crate) store: Store,
    /// Where the store keeps its files (the data directory for PostgreSQL).
    pub(crate) path: PathBuf,
    /// Where the store is, for logs (no password).
    pub(crate) location: String,
    pub(crate) loaded: Loaded,
    /// The operation records of client ids, for the operations registry.
    pub(crate) operation_records: Vec<(String, Vec<u8>)>,
}

/// Opens the store and reads it. One replica owning every account reads each account's
/// cache now; replicas sharing the store read an account's cache when they take it over.
pub(crate) async fn open_store(config: &Config) -> Result<OpenedStore> {
    let store = Store::open_backend(
        &config.store.backend,
        &config.store.data_dir,
        config.store.cache_bytes,
    )
    .await?;
    let path = store
        .path()
        .map_or_else(|| config.store.data_dir.clone(), Path::to_path_buf);
    let location = store.location();
    let mut loaded = store.load().await?;
    if store.loads_accounts_separately() && !config.replicas.ownership.is_shared() {
        for (account, _) in &loaded.accounts {
            let snapshot = store.load_account(account).await?;
            if !snapshot.cache.kinds.is_empty() {
                loaded
                    .cache
                    .accounts
                    .insert(account.clone(), snapshot.cache);
            }
        }
    }
    let operation_records = store.load_operation_records().await?;
    Ok(OpenedStore {
        store,
        path,
        location,
        loaded,
        operation_records,
    })
}

/// The credentials: the proxy's and the API's tokens (committing the derivation key the
/// first time), the admin token, the tokens file, the agents' tokens and identities, the
/// agent CA and the issuers trusted for client certificates.
pub(crate) async fn load_auth(
    config: &Config,
    loaded: &mut Loaded,
    store: &mut Store,
) -> Result<AuthBook> {
    let (key_hex, mut token_ops) = crate::token_key::derivation_key(
        config.api.token_key.as_ref(),
        loaded.meta.get(tokens::DERIVATION_KEY).map(String::as_str),
    )?;
    let (tokens, new_key_ops) =
        Tokens::load(std::mem::take(&mut loaded.tokens), key_hex.as_deref())?;
    token_ops.extend(new_key_ops);
    store.commit(token_ops).await?;
    let admin_token = config
        .api
        .admin_token_file
        .as_deref()
        .map(admin_token)
        .transpose()?;
    let api_tokens_file = config
        .api
        .api_tokens_file
        .as_deref()
        .map(api_auth::TokensFile::open)
        .transpose()?
        .map(Arc::new);
    let agent_tokens = AgentTokens::load(
        std::mem::take(&mut loaded.agent_tokens),
        std::mem::take(&mut loaded.enrolled),
    );
    let agent_ca = AgentCa::load(&config.agents.agent_ca, &config.store.data_dir)?;
    let client_certificates = match &config.agents.security {
        GrpcSecurity::MutualTls(tls) => Some(ClientCertificates::new(
            agent_ca.cert_pem().as_bytes(),
            tls.client_ca_pem.as_deref(),
        )?),
        // Forwarded certificates: the hub's own and those of the proxy's --client-ca (which
        // may be the hub's agent CA file itself, for enrolled agents).
        GrpcSecurity::TrustedProxy(proxy) => Some(ClientCertificates::new(
            agent_ca.cert_pem().as_bytes(),
            Some(&proxy.client_ca_pem),
        )?),
        GrpcSecurity::InsecurePlaintext => None,
    };
    let oidc = config
        .api
        .authentication_config
        .as_deref()
        .map(|path| Oidc::open(path, config.api.oidc_access.as_deref()))
        .transpose()?
        .map(Arc::new);
    let book = AuthBook::new(
        tokens,
        admin_token,
        agent_ca,
        client_certificates,
        agent_tokens,
        api_tokens_file,
    )
    .with_oidc(
        oidc,
        config.api.authentication_config.as_deref().map(|path| {
            scale_agent_hub_auth::oidc::reload::OidcFiles::new(
                path,
                config.api.oidc_access.as_deref(),
            )
        }),
    );
    *book.identity_states() = IdentityStates::load(std::mem::take(&mut loaded.identity_states));
    Ok(book)
}

/// The admin token of `path`, made there the first time (re-read in the background).
fn admin_token(path: &Path) -> Result<Arc<AdminTokenFile>> {
    let (token, created) = AdminToken::read_or_create(path).map_err(|source| HubError::Io {
        context: format!(
            "cannot read or create the admin token file {}",
            path.display()
        ),
        source,
    })?;
    if created {
        tracing::info!(path = %path.display(), "created an admin token (it issues proxy tokens: `scale-agent-hub kubeconfig --account <name>`)");
    }
    // The bytes as they are, so that only a later change of the file counts.
    let content = std::fs::read(path).unwrap_or_else(|_| format!("{token}\n").into_bytes());
    Ok(Arc::new(AdminTokenFile::new(path, &token, content)))
}

/// The registry and cache as the store left them: the accounts with their bindings, each
/// account's cache (with the watch histories' budget), the registry shared between replicas
/// or owning everything.
pub(crate) fn live_state(
    config: &Config,
    loaded: &mut Loaded,
    replicas: &Replicas,
    location: &str,
) -> HubState {
    let mut cache = std::mem::take(&mut loaded.cache);
    cache.history_budget = cache::HistoryBudget::new(config.streams.watch_history_bytes);
    cache.cached_bytes = cache::CachedBytes::new(config.streams.max_cached_bytes);
    let mut state = HubState {
        cache,
        registry: if replicas.ownership.owns_everything() {
            registry::Registry::default()
        } else {
            registry::Registry::shared()
        },
    };
    let now = scale_agent_hub_model::time::now();
    let accounts = std::mem::take(&mut loaded.accounts);
    let loaded_accounts = accounts.len();
    for (name, record) in accounts {
        state.registry.load(name, record, now);
    }
    state
        .registry
        .set_bindings(std::mem::take(&mut loaded.bindings).into_iter().collect());
    tracing::info!(store = %location, accounts = loaded_accounts, objects = state.cache.object_count(), "store loaded");
    state
}

/// The HTTP listener's TLS (`None` with `--http-plaintext`).
pub(crate) fn http_tls(config: &Config) -> Result<Option<Arc<rustls::ServerConfig>>> {
    match &config.listeners.http_security {
        HttpSecurity::Tls { cert_pem, key_pem } => Ok(Some(serve::tls_config(cert_pem, key_pem)?)),
        HttpSecurity::Plaintext => Ok(None),
    }
}

/// Connections the kernel queues for `accept` on each listener (it caps this at
/// `net.core.somaxconn`, 4096 by default on current kernels). tokio's `TcpListener::bind`
/// asks for 1024: with 10,000 agents connecting at once (issue 26's fleet benchmark), the
/// queue overflowed while the hub was busy accepting and handshaking, and agents' connections
/// were reset by the kernel with nothing in the hub's log.
pub(crate) const LISTEN_BACKLOG: u32 = 4096;

/// A listener bound to `addr` (address reuse on, as `TcpListener::bind` sets it, and a
/// backlog of [`LISTEN_BACKLOG`]), and the address it got (the port, with port 0).
pub(crate) async fn bind(addr: SocketAddr, what: &str) -> Result<(TcpListener, SocketAddr)> {
    let bind_error = |source| HubError::Bind { addr, source };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(bind_error)?;
    socket.set_reuseaddr(true).map_err(bind_error)?;
    socket.bind(addr).map_err(bind_error)?;
    let listener = socket.listen(LISTEN_BACKLOG).map_err(bind_error)?;
    let local = listener.local_addr().map_err(|source| HubError::Io {
        context: format!("{what} listener address"),
        source,
    })?;
    Ok((listener, local))
}
