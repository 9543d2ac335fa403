//! How the flags become a [`Config`]: one `into_*` per group of [`Args`], each writing its
//! part of the [`Config`] after reading and checking the files its flags name, and refusing
//! choices that do not fit together; [`Config::validate`] then checks the values.

use std::path::{Path, PathBuf};

use super::{
    AgentArgs, ApiArgs, Args, ClouddriverArgs, Config, GrpcSecurity, HttpSecurity, ListenerArgs,
    ListenerLimits, OperationArgs, OperationConfig, POSTGRES_URL_ENV, ProxyHopTls, ProxyMode,
    ReplicaArgs, ReplicaConfig, StoreArgs, StoreConfig, StoreKind, StreamArgs, StreamConfig,
    TlsMaterial,
    tls_files::{read_certs, read_key},
};
use crate::{
    agent_ca::AgentCaSource,
    clouddriver::ClouddriverSettings,
    error::{HubError, Result},
    forwarded::{ForwardedFormat, ProxyTrust},
    owners::OwnershipSource,
    store::{Backend, PostgresOptions, postgres_tls::SslMode},
};

impl Args {
    /// Reads the files the flags name and builds the [`Config`].
    pub fn into_config(self) -> Result<Config> {
        let Args {
            listeners,
            agents,
            api,
            clouddriver,
            store,
            replicas,
            streams,
            operations,
            logging: _,
        } = self;
        // The groups read and check their files in the order their refusals have always come
        // in: the store, the gRPC listener, the HTTP listener, the API, the agent CA,
        // Clouddriver, the replicas. `Config::new` gives its value to the one field no flag
        // sets (`tls_reload_interval`); each group sets all of its own fields.
        let backend = store.backend(std::env::var(POSTGRES_URL_ENV).ok())?;
        let mut config = Config::new(agents.grpc_security(&listeners)?, PathBuf::new());
        let ownership = ownership(&backend);
        config.store = store.into_store(backend);
        listeners.into_listeners(&mut config, agents.client_ca.as_deref())?;
        api.into_api(&mut config)?;
        agents.into_agents(&mut config)?;
        clouddriver.into_clouddriver(&mut config)?;
        config.replicas = replicas.into_replicas(ownership)?;
        config.streams = streams.into_streams();
        config.operations = operations.into_operations();
        config.validate()?;
        Ok(config)
    }
}

impl StoreArgs {
    /// The store the flags choose; `url_env` is the value of [`POSTGRES_URL_ENV`].
    fn backend(&self, url_env: Option<String>) -> Result<Backend> {
        let url = match (&self.postgres_url_file, url_env) {
            (Some(path), _) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| HubError::ReadFile {
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, env) => env.map(|url| url.trim().to_string()),
        };
        match (self.store, url) {
            (StoreKind::Embedded, None) if self.postgres_ca.is_some() => Err(HubError::Config(
                "--postgres-ca is for --store postgres: add --store postgres, or remove it".into(),
            )),
            (StoreKind::Embedded, None) => Ok(Backend::Embedded),
            (StoreKind::Embedded, Some(_)) => Err(HubError::Config(format!(
                "a PostgreSQL URL is set (--postgres-url-file or {POSTGRES_URL_ENV}) but the \
                 store is embedded: add --store postgres, or unset it"
            ))),
            (StoreKind::Postgres, Some(url)) if !url.is_empty() => {
                let options = PostgresOptions {
                    url,
                    ca_file: self.postgres_ca.clone(),
                };
                // Reads the URL's sslmode (and the CA file) now: a refusal at start-up.
                let mode = options.target()?.mode();
                if mode != SslMode::VerifyFull && !self.postgres_insecure_tls {
                    return Err(HubError::Config(format!(
                        "the PostgreSQL URL's sslmode is {} (no sslmode means prefer): the \
                         server's certificate or host is not checked, so whoever sits on the \
                         path to PostgreSQL could read and change the store. Put \
                         sslmode=verify-full in the URL with the server's CA (sslrootcert= \
                         or --postgres-ca), or pass --postgres-insecure-tls to accept it",
                        mode.as_str()
                    )));
                }
                if mode != SslMode::VerifyFull {
                    tracing::warn!(
                        sslmode = mode.as_str(),
                        "--postgres-insecure-tls: PostgreSQL connections below \
                         sslmode=verify-full; the server's certificate or host name is not \
                         checked, so whoever sits on the path to PostgreSQL can read and \
                         change the store"
                    );
                }
                Ok(Backend::Postgres(options))
            }
            (StoreKind::Postgres, _) => Err(HubError::Config(format!(
                "--store postgres needs the database's URL: put \
                 postgres://user:password@host:port/database in a file named by \
                 --postgres-url-file, or in {POSTGRES_URL_ENV}"
            ))),
        }
    }

    /// The store's settings, with `backend` from [`StoreArgs::backend`].
    fn into_store(self, backend: Backend) -> StoreConfig {
        let StoreArgs {
            data_dir,
            store_cache_mib,
            // Read by `backend`.
            store: _,
            postgres_url_file: _,
            postgres_ca: _,
            postgres_insecure_tls: _,
        } = self;
        StoreConfig {
            backend,
            data_dir,
            cache_bytes: store_cache_mib.saturating_mul(1024 * 1024),
        }
    }
}

/// Where account ownership comes from: replicas sharing the PostgreSQL store own accounts
/// through its advisory locks.
fn ownership(backend: &Backend) -> OwnershipSource {
    match backend {
        Backend::Postgres(options) => OwnershipSource::Postgres {
            options: options.clone(),
        },
        Backend::Embedded => OwnershipSource::Embedded,
    }
}

impl AgentArgs {
    /// How the gRPC listener authenticates agents: not at all (`--insecure-plaintext`), by
    /// the certificate a trusted proxy forwards, or by mutual TLS with the listener's
    /// certificate.
    fn grpc_security(&self, listeners: &ListenerArgs) -> Result<GrpcSecurity> {
        if self.insecure_plaintext {
            return Ok(GrpcSecurity::InsecurePlaintext);
        }
        if let Some(format) = self.forwarded_client_cert {
            return Ok(GrpcSecurity::TrustedProxy(
                self.proxy_mode(format, listeners)?,
            ));
        }
        let (Some(cert), Some(key)) = (&listeners.tls_cert, &listeners.tls_key) else {
            let missing: Vec<&str> = [
                ("--tls-cert", listeners.tls_cert.is_none()),
                ("--tls-key", listeners.tls_key.is_none()),
            ]
            .into_iter()
            .filter_map(|(flag, missing)| missing.then_some(flag))
            .collect();
            return Err(HubError::Config(format!(
                "mutual TLS needs {} (or pass --insecure-plaintext to serve without TLS)",
                missing.join(", ")
            )));
        };
        Ok(GrpcSecurity::MutualTls(TlsMaterial {
            cert_pem: read_certs("--tls-cert", cert)?,
            key_pem: read_key("--tls-key", key)?,
            client_ca_pem: self
                .client_ca
                .as_ref()
                .map(|ca| read_certs("--client-ca", ca))
                .transpose()?,
        }))
    }

    /// The proxy mode the flags describe (validated by [`Config::validate`]).
    fn proxy_mode(&self, format: ForwardedFormat, listeners: &ListenerArgs) -> Result<ProxyMode> {
        let Some(client_ca) = &self.client_ca else {
            return Err(HubError::Config(
                "--forwarded-client-cert needs --client-ca: the hub verifies every forwarded \
                 certificate against the CA that signs agents' certificates"
                    .into(),
            ));
        };
        let client_ca_pem = read_certs("--client-ca", client_ca)?;
        let trust = ProxyTrust::new(
            format,
            self.forwarded_client_cert_header.as_deref(),
            &client_ca_pem,
            self.trusted_proxy_cidr.clone(),
            self.trusted_proxy_identity.clone(),
        )
        .map_err(HubError::Config)?;
        let hop_tls = match (&listeners.tls_cert, &listeners.tls_key) {
            (Some(cert), Some(key)) => Some(ProxyHopTls {
                cert_pem: read_certs("--tls-cert", cert)?,
                key_pem: read_key("--tls-key", key)?,
                proxy_ca_pem: self
                    .trusted_proxy_ca
                    .as_ref()
                    .map(|ca| read_certs("--trusted-proxy-ca", ca))
                    .transpose()?,
            }),
            (None, None) if self.trusted_proxy_ca.is_none() => None,
            _ => {
                return Err(HubError::Config(
                    "TLS between the proxy and the hub needs both --tls-cert and --tls-key \
                     (--trusted-proxy-ca needs them too); set both, or neither for a \
                     plaintext hop"
                        .into(),
                ));
            }
        };
        Ok(ProxyMode {
            trust,
            client_ca_pem,
            hop_tls,
        })
    }

    /// The agent CA's files (checked now, loaded after the store is opened, so that a wrong
    /// path fails before anything else), the certificates the hub issues and the allow rules.
    fn into_agents(self, config: &mut Config) -> Result<()> {
        let AgentArgs {
            agent_ca_cert,
            agent_ca_key,
            agent_cert_lifetime,
            agent_max_enrolment_age,
            allow,
            // Read by `grpc_security`.
            client_ca: _,
            insecure_plaintext: _,
            forwarded_client_cert: _,
            forwarded_client_cert_header: _,
            trusted_proxy_cidr: _,
            trusted_proxy_identity: _,
            trusted_proxy_ca: _,
        } = self;
        config.agents.agent_ca = match (agent_ca_cert, agent_ca_key) {
            (Some(cert), Some(key)) => {
                read_certs("--agent-ca-cert", &cert)?;
                read_key("--agent-ca-key", &key)?;
                AgentCaSource::Files { cert, key }
            }
            _ => AgentCaSource::DataDir,
        };
        config.agents.agent_cert_lifetime = agent_cert_lifetime;
        config.agents.agent_max_enrolment_age = agent_max_enrolment_age;
        config.agents.allow = allow;
        Ok(())
    }
}

impl ListenerArgs {
    /// The listeners' addresses, the HTTP listener's TLS, and the files the listeners' TLS
    /// material is reloaded from; `client_ca` is `--client-ca`.
    fn into_listeners(self, config: &mut Config, client_ca: Option<&Path>) -> Result<()> {
        config.listeners.grpc_addr = self.grpc_addr;
        config.listeners.http_addr = self.http_addr;
        config.listeners.grpc_limits = ListenerLimits {
            max_connections: self.grpc_max_connections as usize,
            header_read_timeout: self.header_read_timeout,
        };
        config.listeners.http_limits = ListenerLimits {
            max_connections: self.http_max_connections as usize,
            header_read_timeout: self.header_read_timeout,
        };
        // The gRPC listener's files are reloaded in the mutual-TLS mode only.
        if let (GrpcSecurity::MutualTls(_), Some(cert), Some(key)) =
            (&config.agents.security, &self.tls_cert, &self.tls_key)
        {
            config.listeners.tls_files.grpc = Some((cert.clone(), key.clone()));
            config.listeners.tls_files.client_ca = client_ca.map(Path::to_path_buf);
        }
        self.into_http(config)
    }

    /// The HTTP listener's TLS: its own certificate and key, else the gRPC listener's, or
    /// none with `--http-plaintext`.
    fn into_http(self, config: &mut Config) -> Result<()> {
        let ListenerArgs {
            tls_cert,
            tls_key,
            http_tls_cert,
            http_tls_key,
            http_plaintext,
            // Set by `into_listeners`, which calls this.
            grpc_addr: _,
            http_addr: _,
            grpc_max_connections: _,
            http_max_connections: _,
            header_read_timeout: _,
        } = self;
        if http_plaintext {
            config.listeners.http_security = HttpSecurity::Plaintext;
            return Ok(());
        }
        let cert = http_tls_cert
            .map(|c| ("--http-tls-cert", c))
            .or_else(|| tls_cert.map(|c| ("--tls-cert", c)));
        let key = http_tls_key
            .map(|k| ("--http-tls-key", k))
            .or_else(|| tls_key.map(|k| ("--tls-key", k)));
        let (Some((cert_flag, cert)), Some((key_flag, key))) = (cert, key) else {
            return Err(HubError::Config(
                "the HTTP listener serves TLS: give it a certificate and key \
                 (--http-tls-cert and --http-tls-key, or --tls-cert and --tls-key), or \
                 pass --http-plaintext to serve it without TLS"
                    .into(),
            ));
        };
        config.listeners.http_security = HttpSecurity::Tls {
            cert_pem: read_certs(cert_flag, &cert)?,
            key_pem: read_key(key_flag, &key)?,
        };
        config.listeners.tls_files.http = Some((cert, key));
        Ok(())
    }
}

impl ApiArgs {
    /// The URL and CA the kubeconfigs the hub hands out name, the API's tokens and its
    /// request limit.
    fn into_api(self, config: &mut Config) -> Result<()> {
        let ApiArgs {
            public_url,
            serving_ca,
            admin_token_file,
            api_tokens_file,
            authentication_config,
            oidc_access,
            token_ttl,
            metrics_unauthenticated,
            max_request_bytes,
            proxy_audit_reads,
            token_key_file,
            token_key_replaces_stored,
        } = self;
        config.api.token_key = token_key_file
            .as_deref()
            .map(crate::token_key::TokenKeyFile::read)
            .transpose()?
            .map(|key| key.replacing_stored(token_key_replaces_stored));
        if let Some(url) = &public_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(HubError::Config(format!(
                "--public-url {url:?} must start with https:// (or http:// with --http-plaintext)"
            )));
        }
        config.api.public_url = public_url;
        config.api.serving_ca_pem = serving_ca
            .as_ref()
            .map(|ca| read_certs("--serving-ca", ca))
            .transpose()?;
        config.api.admin_token_file =
            Some(admin_token_file.unwrap_or_else(|| config.store.data_dir.join("admin-token")));
        config.api.api_tokens_file = api_tokens_file;
        config.api.authentication_config = authentication_config;
        config.api.oidc_access = oidc_access;
        config.api.token_ttl = token_ttl;
        config.api.metrics_unauthenticated = metrics_unauthenticated;
        config.api.max_request_bytes = max_request_bytes;
        config.api.proxy_audit_reads = proxy_audit_reads;
        Ok(())
    }
}

impl ClouddriverArgs {
    /// The registration of accounts in Clouddriver, with the account defaults' file read.
    fn into_clouddriver(self, config: &mut Config) -> Result<()> {
        let ClouddriverArgs {
            clouddriver_url,
            clouddriver_user,
            clouddriver_accounts_file,
            clouddriver_account_defaults,
            clouddriver_ca,
        } = self;
        config.clouddriver = ClouddriverSettings {
            api_url: clouddriver_url,
            user: clouddriver_user,
            accounts_file: clouddriver_accounts_file,
            account_defaults: match &clouddriver_account_defaults {
                Some(path) => crate::clouddriver::load_account_defaults(path)?,
                None => serde_json::Map::new(),
            },
            ca_file: clouddriver_ca,
            ..ClouddriverSettings::default()
        };
        Ok(())
    }
}

impl ReplicaArgs {
    /// This replica's name and address among the replicas, and the secret they share;
    /// `ownership` follows the store ([`StoreArgs::ownership`]).
    fn into_replicas(self, ownership: OwnershipSource) -> Result<ReplicaConfig> {
        let ReplicaArgs {
            replica_id,
            replica_address,
            replica_server_name,
            replica_sync_period,
            replica_secret_file,
            replica_peer_cidrs,
        } = self;
        Ok(ReplicaConfig {
            id: replica_id.unwrap_or_else(crate::owners::hostname),
            address: replica_address,
            server_name: replica_server_name,
            sync_period: replica_sync_period,
            ownership,
            secret: replica_secret_file
                .as_deref()
                .map(crate::owners::forward::ReplicaSecret::read)
                .transpose()?,
            secret_overlap: crate::owners::secret::ROTATION_OVERLAP,
            peer_cidrs: replica_peer_cidrs,
        })
    }
}

impl StreamArgs {
    /// The streams' heartbeats, flow control and limits (checked by [`Config::validate`]).
    fn into_streams(self) -> StreamConfig {
        let StreamArgs {
            grace_period,
            heartbeat_period,
            min_heartbeat_period,
            max_heartbeat_period,
            max_unacked,
            max_object_bytes,
            max_staged_bytes,
            max_objects_per_account,
            max_accounts_per_identity,
            max_streams_per_identity,
            watch_history_mib,
            discovery_cache_mib,
            max_cached_mib,
        } = self;
        StreamConfig {
            grace_period,
            heartbeat_period,
            min_heartbeat_period,
            max_heartbeat_period,
            max_unacked,
            max_object_bytes,
            max_staged_bytes,
            max_objects_per_account,
            max_accounts_per_identity,
            max_streams_per_identity,
            watch_history_bytes: watch_history_mib.saturating_mul(1024 * 1024),
            discovery_cache_bytes: discovery_cache_mib.saturating_mul(1024 * 1024),
            max_cached_bytes: max_cached_mib.saturating_mul(1024 * 1024),
        }
    }
}

impl OperationArgs {
    /// How long operations are kept and how large their results and records may be.
    fn into_operations(self) -> OperationConfig {
        let OperationArgs {
            operation_retention,
            max_operation_result_bytes,
            max_operation_records_bytes,
        } = self;
        OperationConfig {
            retention: operation_retention,
            max_result_bytes: max_operation_result_bytes,
            max_records_bytes: max_operation_records_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
