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
            watch_history_mib,
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
            watch_history_bytes: watch_history_mib.saturating_mul(1024 * 1024),
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
mod tests {
    use std::time::Duration;

    use clap::Parser as _;

    use super::*;
    use crate::config::{
        DEFAULT_AGENT_CERT_LIFETIME, DEFAULT_MAX_HEARTBEAT_PERIOD, DEFAULT_MIN_HEARTBEAT_PERIOD,
    };

    #[test]
    fn store_flags() {
        use crate::store::Backend;
        let args = Args::try_parse_from(["scale-agent-hub"]).unwrap();
        assert!(matches!(
            args.store.backend(None).unwrap(),
            Backend::Embedded
        ));
        let err = args
            .store
            .backend(Some("postgres://u:p@h/d".into()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--store postgres"), "{err}");

        let args = Args::try_parse_from(["scale-agent-hub", "--store", "postgres"]).unwrap();
        let err = args.store.backend(None).unwrap_err().to_string();
        assert!(err.contains("--postgres-url-file"), "{err}");
        // Below verify-full only with --postgres-insecure-tls (review F11).
        for url in ["postgres://u:p@h/d", "postgres://u:p@h/d?sslmode=require"] {
            let err = args
                .store
                .backend(Some(url.into()))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--postgres-insecure-tls") && err.contains("sslmode=verify-full"),
                "{err}"
            );
        }
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--store",
            "postgres",
            "--postgres-insecure-tls",
        ])
        .unwrap();
        let Backend::Postgres(options) = args
            .store
            .backend(Some(" postgres://u:p@h/d\n".into()))
            .unwrap()
        else {
            panic!("not postgres");
        };
        assert_eq!(options.url, "postgres://u:p@h/d");

        // The file wins over the environment, trimmed like a Secret's key with a newline.
        let file = std::env::temp_dir().join(format!("hub-pg-url-{}", std::process::id()));
        std::fs::write(&file, "postgres://f:s3cret@db:5433/hub\n").unwrap();
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--store",
            "postgres",
            "--postgres-url-file",
            file.to_str().unwrap(),
            "--postgres-insecure-tls",
        ])
        .unwrap();
        let backend = args.store.backend(Some("postgres://env/x".into())).unwrap();
        std::fs::remove_file(&file).unwrap();
        let Backend::Postgres(options) = &backend else {
            panic!("not postgres");
        };
        assert_eq!(options.url, "postgres://f:s3cret@db:5433/hub");
        assert!(!format!("{backend:?}").contains("s3cret"));
    }

    #[test]
    fn defaults_and_missing_tls() {
        let args = Args::try_parse_from(["scale-agent-hub"]).unwrap();
        assert_eq!(args.listeners.grpc_addr.port(), 9091);
        assert_eq!(args.listeners.http_addr.port(), 8443);
        assert_eq!(args.streams.grace_period, Duration::from_secs(600));
        assert_eq!(args.streams.heartbeat_period, Duration::from_secs(15));
        assert_eq!(args.streams.max_unacked, 1000);
        assert_eq!(args.streams.max_object_bytes, 2 * 1024 * 1024);
        assert_eq!(args.store.store_cache_mib, 2);
        assert_eq!(args.streams.watch_history_mib, 256);
        assert_eq!(args.streams.max_objects_per_account, 250_000);
        assert_eq!(args.agents.agent_cert_lifetime, DEFAULT_AGENT_CERT_LIFETIME);
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--tls-cert, --tls-key"), "{err}");
        assert!(!err.contains("--client-ca"), "{err}");

        // Plaintext gRPC still needs TLS material for HTTP, or the explicit flag.
        let args = Args::try_parse_from(["scale-agent-hub", "--insecure-plaintext"]).unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--http-plaintext"), "{err}");

        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--allow",
            "agent-a=prod-*",
            "--allow",
            "*=dev",
            "--grace-period",
            "2m",
        ])
        .unwrap();
        let config = args.into_config().unwrap();
        assert!(matches!(
            config.agents.security,
            GrpcSecurity::InsecurePlaintext
        ));
        assert_eq!(config.agents.allow.len(), 2);
        assert_eq!(config.streams.grace_period, Duration::from_secs(120));
        assert!(!format!("{config:?}").contains("PRIVATE"));

        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--heartbeat-period",
            "5000h",
        ])
        .unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--heartbeat-period"), "{err}");
    }

    /// An agent's requested heartbeat period is granted within the hub's bounds; no request
    /// gets the hub's period; bounds that exclude the default period are refused.
    #[test]
    fn proxy_audit_reads_flag() {
        use crate::proxy::audit::AuditReads;
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "scale-agent-hub",
                "--insecure-plaintext",
                "--http-plaintext",
            ];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv)
        };
        let config = parse(&[]).unwrap().into_config().unwrap();
        assert_eq!(config.api.proxy_audit_reads, AuditReads::All);
        let config = parse(&["--proxy-audit-reads=sample:10"])
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(config.api.proxy_audit_reads, AuditReads::Sample(10));
        let err = parse(&["--proxy-audit-reads=some"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--proxy-audit-reads") && err.contains("writes-only"),
            "{err}"
        );
    }

    #[test]
    fn heartbeat_requests_are_clamped_to_the_bounds() {
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--heartbeat-period=10s",
            "--min-heartbeat-period=5s",
            "--max-heartbeat-period=60s",
        ])
        .unwrap();
        let config = args.into_config().unwrap();
        let secs = Duration::from_secs;
        assert_eq!(config.streams.granted_heartbeat_period(0), secs(10));
        assert_eq!(config.streams.granted_heartbeat_period(1), secs(5));
        assert_eq!(config.streams.granted_heartbeat_period(20), secs(20));
        assert_eq!(config.streams.granted_heartbeat_period(3600), secs(60));
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
            "--heartbeat-period=15s",
            "--max-heartbeat-period=10s",
        ])
        .unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(err.contains("--max-heartbeat-period"), "{err}");
        let defaults = Args::try_parse_from(["scale-agent-hub"]).unwrap();
        assert_eq!(
            defaults.streams.min_heartbeat_period,
            DEFAULT_MIN_HEARTBEAT_PERIOD
        );
        assert_eq!(
            defaults.streams.max_heartbeat_period,
            DEFAULT_MAX_HEARTBEAT_PERIOD
        );
    }

    /// Every TLS file flag is checked when the flags are read, before the store is opened,
    /// and a file without what it should hold is refused naming the flag and the file.
    #[test]
    fn tls_files_without_a_certificate_or_key_are_refused_naming_flag_and_file() {
        let dir =
            std::env::temp_dir().join(format!("scale-agent-hub-tlsfiles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["hub.test".to_string()]).unwrap();
        let cert = dir.join("tls.crt");
        std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).unwrap();
        let key_file = dir.join("tls.key");
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let (cert, key_file, empty) = (
            cert.display().to_string(),
            key_file.display().to_string(),
            empty.display().to_string(),
        );
        let parse = |extra: &[&str]| {
            let mut argv = vec!["scale-agent-hub"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap().into_config()
        };
        let good = ["--tls-cert", cert.as_str(), "--tls-key", key_file.as_str()];
        assert!(parse(&good).is_ok());
        let cases: [(&[&str], &str, &str, &str); 5] = [
            (
                &["--client-ca", &empty],
                "--client-ca",
                &empty,
                "no certificate",
            ),
            (
                &["--agent-ca-cert", &empty, "--agent-ca-key", &key_file],
                "--agent-ca-cert",
                &empty,
                "no certificate",
            ),
            (
                &["--agent-ca-cert", &cert, "--agent-ca-key", &cert],
                "--agent-ca-key",
                &cert,
                "no private key",
            ),
            (
                &["--http-tls-key", &empty],
                "--http-tls-key",
                &empty,
                "no private key",
            ),
            (
                &["--client-ca", "/nonexistent/ca.pem"],
                "--client-ca",
                "/nonexistent/ca.pem",
                "cannot be read",
            ),
        ];
        for (extra, flag, file, problem) in cases {
            let mut argv = good.to_vec();
            argv.extend_from_slice(extra);
            let err = parse(&argv).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("{flag} {file}: {problem}")),
                "{err}"
            );
        }
        let err = parse(&["--tls-cert", &empty, "--tls-key", &key_file])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("--tls-cert {empty}: no certificate")),
            "{err}"
        );
        assert!(err.contains("point --tls-cert at a PEM file"), "{err}");
        let err = parse(&["--tls-cert", &cert, "--tls-key", &empty])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("point --tls-key at the PEM private key"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// F24: --insecure-plaintext no longer silently wins over the flags of an
    /// authenticating mode; the refusal names both. And the enrolment's maximum age cannot
    /// be shorter than a certificate's lifetime.
    #[test]
    fn conflicting_agent_authentication_flags_are_refused_naming_both() {
        for flag in ["--client-ca", "--tls-cert", "--tls-key"] {
            let err = Args::try_parse_from([
                "scale-agent-hub",
                "--http-plaintext",
                "--insecure-plaintext",
                flag,
                "/etc/some.pem",
            ])
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("--insecure-plaintext") && err.contains(flag),
                "{flag}: {err}"
            );
        }
        let err = Args::try_parse_from([
            "scale-agent-hub",
            "--http-plaintext",
            "--insecure-plaintext",
            "--forwarded-client-cert",
            "xfcc",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--insecure-plaintext") && err.contains("--forwarded-client-cert"),
            "{err}"
        );
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--http-plaintext",
            "--insecure-plaintext",
            "--agent-cert-lifetime",
            "720h",
            "--agent-max-enrolment-age",
            "24h",
        ])
        .unwrap();
        let err = args.into_config().unwrap_err().to_string();
        assert!(
            err.contains("--agent-max-enrolment-age") && err.contains("--agent-cert-lifetime"),
            "{err}"
        );
        let args = Args::try_parse_from([
            "scale-agent-hub",
            "--http-plaintext",
            "--insecure-plaintext",
        ])
        .unwrap();
        assert_eq!(
            args.agents.agent_max_enrolment_age,
            crate::config::DEFAULT_AGENT_MAX_ENROLMENT_AGE
        );
    }

    #[test]
    fn proxy_mode_flags() {
        let dir =
            std::env::temp_dir().join(format!("scale-agent-hub-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let ca = ca.display().to_string();
        let key_path = dir.join("ca.key");
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        let key_path = key_path.display().to_string();
        let parse = |extra: &[&str]| {
            let mut argv = vec![
                "scale-agent-hub",
                "--http-plaintext",
                "--forwarded-client-cert",
            ];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).unwrap().into_config()
        };

        let err = parse(&["escaped-pem", "--trusted-proxy-cidr", "10.0.0.0/8"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs --client-ca"), "{err}");
        let err = parse(&["escaped-pem", "--client-ca", &ca])
            .unwrap_err()
            .to_string();
        assert!(err.contains("set --trusted-proxy-cidr"), "{err}");
        let err = parse(&[
            "xfcc",
            "--client-ca",
            &ca,
            "--trusted-proxy-identity",
            "envoy.spinnaker",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("--trusted-proxy-ca"), "{err}");
        let err = parse(&[
            "xfcc",
            "--client-ca",
            &ca,
            "--trusted-proxy-cidr",
            "10.0.0.0/8",
            "--tls-cert",
            &ca,
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("both --tls-cert and --tls-key"), "{err}");

        let config = parse(&[
            "escaped-pem",
            "--client-ca",
            &ca,
            "--trusted-proxy-cidr",
            "10.0.0.0/8,127.0.0.2",
        ])
        .unwrap();
        let GrpcSecurity::TrustedProxy(proxy) = &config.agents.security else {
            panic!("not proxy mode: {:?}", config.agents.security);
        };
        assert!(proxy.hop_tls.is_none());
        assert_eq!(proxy.trust.header(), "x-ssl-client-cert");

        let config = parse(&[
            "xfcc",
            "--client-ca",
            &ca,
            "--trusted-proxy-identity",
            "envoy.spinnaker",
            "--tls-cert",
            &ca,
            "--tls-key",
            &key_path,
            "--trusted-proxy-ca",
            &ca,
        ])
        .unwrap();
        let GrpcSecurity::TrustedProxy(proxy) = &config.agents.security else {
            panic!("not proxy mode: {:?}", config.agents.security);
        };
        assert!(proxy.hop_tls.as_ref().unwrap().proxy_ca_pem.is_some());
        assert!(proxy.trust.trusts_only_identities());

        let err = Args::try_parse_from([
            "scale-agent-hub",
            "--insecure-plaintext",
            "--forwarded-client-cert",
            "xfcc",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot be used with"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
