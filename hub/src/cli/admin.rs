//! Admin commands against a running hub: `scale-agent-hub kubeconfig --account <name>` prints
//! a kubeconfig for the Kubernetes API proxy (issuing a token), `scale-agent-hub token create
//! --name ci --role operator` issues an API token, `scale-agent-hub token list` and
//! `scale-agent-hub token revoke <id>` manage the tokens. They call the hub's admin API over
//! HTTPS with the admin token from the admin token file; inside the hub's pod every default
//! already points at the right place (`kubectl exec deploy/scale-agent-hub --
//! scale-agent-hub kubeconfig --account prod`). `scale-agent-hub token hash` needs no hub: it
//! turns a secret into an entry of the hub's --api-tokens-file.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt as _, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};

use crate::{
    admin_api::{CreateToken, CreatedToken, Revoked, TokenView},
    agent_admin::{AgentTokenView, BindingView},
    api_auth::Role,
};

/// Whether `first` (the first command-line argument) names an admin command.
pub fn is_admin_command(first: Option<&str>) -> bool {
    matches!(
        first,
        Some("kubeconfig" | "token" | "agent-token" | "agent" | "account")
    )
}

/// How long an admin call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// scale-agent-hub admin commands (they talk to a running hub).
#[derive(Debug, Parser)]
#[command(name = "scale-agent-hub", version, about, long_about = None)]
pub struct AdminCommand {
    #[command(subcommand)]
    pub command: Admin,
}

#[derive(Debug, Subcommand)]
pub enum Admin {
    /// Print a kubeconfig that reaches an account's cluster through the hub's Kubernetes API
    /// proxy. Issues a new token (a token of the same --token-name is replaced).
    Kubeconfig {
        /// The Spinnaker account.
        #[arg(long)]
        account: String,
        /// Who or what the token is for (it shows in `token list`); `clouddriver` gives
        /// the kubeconfig the hub registers in Clouddriver.
        #[arg(long, default_value = "kubeconfig")]
        token_name: String,
        /// With --token-name clouddriver: replace that token (the old one stops working).
        #[arg(long)]
        rotate: bool,
        /// How long the token lasts (`90m`, `12h`; `0s`: no expiry). Default: the hub's
        /// --token-ttl (12 h). Clouddriver's token never expires.
        #[arg(long)]
        ttl: Option<String>,
        /// Write a kubeconfig that embeds no token: kubectl runs `scale-agent-hub token
        /// credential` (an exec credential plugin) for a fresh one whenever the last expired.
        /// The plugin presents --token-file (an API token with role operator, which may be
        /// limited to this account) or the admin token file; the hub names the token after
        /// that token's owner.
        #[arg(long, conflicts_with_all = ["rotate", "token_name"])]
        exec: bool,
        /// Write the kubeconfig to this file (mode 0600) instead of standard output.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Issue, list, revoke or hash tokens.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Issue, list or revoke agent tokens (enrolment and bearer tokens of agents).
    AgentToken {
        #[command(subcommand)]
        action: AgentTokenAction,
    },
    /// Agent identities: list them, disable (ending their streams at once) or enable one,
    /// deny one of its certificates by serial.
    Agent {
        #[command(subcommand)]
        action: super::identity::AgentAction,
    },
    /// Account bindings: which agent identity may serve an account.
    Account {
        #[command(subcommand)]
        action: AccountAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentTokenAction {
    /// Issue a token for an agent identity; prints the token (shown once).
    Create {
        /// The identity an agent using the token gets (a lowercase DNS name).
        #[arg(long)]
        identity: String,
        /// Glob of the account names that identity may register; comma-separated
        /// alternatives, e.g. 'prod-eu-west-1,prod-eu-west-1-*' (an exact name, or a
        /// separator: 'prod-eu-west-1*' would also match prod-eu-west-10).
        #[arg(long)]
        accounts: String,
        /// How long the token is valid: seconds, or a number with s, m or h.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// A one-time enrolment token (the agent trades it for a certificate); without it,
        /// a bearer token the agent presents on every connection until it expires.
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Every agent token: id, kind, identity, accounts, expiry, use.
    List {
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Revoke an agent token by id (from `agent-token list`).
    Revoke {
        id: String,
        #[command(flatten)]
        hub: HubAccess,
    },
}

#[derive(Debug, Subcommand)]
pub enum AccountAction {
    /// Bind an account to another agent identity (streams of other identities serving it
    /// are ended).
    Rebind {
        /// The account.
        name: String,
        /// The identity that may serve it from now on.
        #[arg(long)]
        identity: String,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Every account binding.
    Bindings {
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Delete an account no agent streams (a retired or squatted cluster): its record and
    /// its binding, so the name is free to bind again. Refused while a stream serves it.
    Delete {
        /// The account.
        name: String,
        #[command(flatten)]
        hub: HubAccess,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Issue an API token with a role; prints the token once (a token of the same name is
    /// replaced, so issuing a name again rotates it).
    Create {
        /// Who or what the token is for (it names the caller in 403 messages and audit lines).
        #[arg(long)]
        name: String,
        /// metrics (GET /metrics only), reader (agents, accounts, objects, metrics),
        /// operator (plus operations and exec credentials) or admin (plus tokens and
        /// kubeconfigs).
        #[arg(long, value_enum)]
        role: Role,
        /// How long it lasts (`90m`, `12h`; `0s`: no expiry). Default: the hub's
        /// --token-ttl (12 h).
        #[arg(long)]
        ttl: Option<String>,
        /// Globs of the accounts it may address (`prod-*`), comma-separated; routes of
        /// other accounts answer 403. Default: every account.
        #[arg(long, value_delimiter = ',')]
        accounts: Vec<String>,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Print a `client.authentication.k8s.io/v1` ExecCredential with a fresh proxy token for
    /// an account (what `kubeconfig --exec` kubeconfigs run; kubectl calls it again when the
    /// token expires).
    Credential {
        /// The Spinnaker account.
        #[arg(long)]
        account: String,
        /// How long the token lasts. Default: the hub's --token-ttl.
        #[arg(long)]
        ttl: Option<String>,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Print an entry of the hub's --api-tokens-file for a token read from standard input
    /// (only its SHA-256 goes into the file). With --generate, make a new token and print it
    /// on standard error.
    Hash {
        #[arg(long)]
        name: String,
        #[arg(long, value_enum)]
        role: Role,
        /// Globs of the accounts it may address (`prod-*`), comma-separated. Default: every
        /// account.
        #[arg(long, value_delimiter = ',')]
        accounts: Vec<String>,
        /// Make a new random token instead of reading one.
        #[arg(long)]
        generate: bool,
    },
    /// Every token: id, kind (proxy, api, admin), role, account, name, where it is kept, when
    /// it was made.
    List {
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Revoke a token by id (from `token list`); clients using it get 401 at once.
    Revoke {
        id: String,
        #[command(flatten)]
        hub: HubAccess,
    },
}

/// How to reach the hub's admin API.
#[derive(Debug, clap::Args)]
pub struct HubAccess {
    /// The hub's HTTP listener.
    #[arg(
        long,
        env = "SCALE_AGENT_HUB_URL",
        default_value = "https://127.0.0.1:8443"
    )]
    pub hub_url: String,
    /// PEM CA that signed the hub's serving certificate (the hub's --serving-ca); the
    /// public web roots when unset.
    #[arg(long, env = "SCALE_AGENT_HUB_SERVING_CA")]
    pub ca_file: Option<PathBuf>,
    /// Name to verify in the hub's certificate, when it differs from the URL's host (in the
    /// hub's pod the URL is 127.0.0.1 while the certificate names the Service).
    #[arg(long, env = "SCALE_AGENT_HUB_SERVER_NAME")]
    pub server_name: Option<String>,
    /// File with the admin token. Default: <data-dir>/admin-token.
    #[arg(long, env = "SCALE_AGENT_HUB_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// File with an API token to present instead of the admin token (a person's token
    /// for `token credential`).
    #[arg(long, env = "SCALE_AGENT_HUB_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The hub's data directory (for the default admin token file).
    #[arg(long, env = "SCALE_AGENT_HUB_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
}

/// Runs an admin command, printing its result.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command.command {
        Admin::Kubeconfig {
            account,
            token_name,
            rotate,
            ttl,
            exec,
            output,
            hub,
        } => {
            let yaml = if exec {
                exec_kubeconfig(&account, ttl.as_deref(), &hub)?
            } else {
                let path = format!(
                    "/api/v1/accounts/{account}/kubeconfig?tokenName={}{}{}",
                    encode_query(&token_name),
                    if rotate { "&rotate=true" } else { "" },
                    ttl.as_deref()
                        .map(|t| format!("&ttl={}", encode_query(t)))
                        .unwrap_or_default()
                );
                hub.call("POST", &path).await?
            };
            match output {
                Some(file) => {
                    scale_agent_runtime::write_private(&file, yaml.as_bytes())
                        .with_context(|| format!("cannot write {}", file.display()))?;
                    eprintln!(
                        "wrote {} (account {account}, token {token_name:?}); use it with \
                         KUBECONFIG={} kubectl get namespaces",
                        file.display(),
                        file.display()
                    );
                }
                None => print!("{yaml}"),
            }
            Ok(())
        }
        Admin::Token { action } => match action {
            TokenAction::Credential { account, ttl, hub } => {
                let path = format!(
                    "/api/v1/accounts/{}/credential{}",
                    encode_query(&account),
                    ttl.as_deref()
                        .map(|t| format!("?ttl={}", encode_query(t)))
                        .unwrap_or_default()
                );
                println!("{}", hub.call("POST", &path).await?);
                Ok(())
            }
            TokenAction::Create {
                name,
                role,
                ttl,
                accounts,
                hub,
            } => {
                let body = serde_json::to_vec(&CreateToken {
                    name,
                    role,
                    ttl,
                    accounts,
                })?;
                let answer = hub.call_with("POST", "/api/v1/tokens", body).await?;
                let created: CreatedToken =
                    serde_json::from_str(&answer).context("the hub's answer")?;
                eprintln!(
                    "issued API token {:?} (role {role}, id {}); it is shown only now:",
                    created.view.name, created.view.id
                );
                println!("{}", created.token);
                Ok(())
            }
            TokenAction::Hash {
                name,
                role,
                accounts,
                generate,
            } => {
                let token = if generate {
                    let token = crate::tokens::new_token()?;
                    eprintln!("token (shown only now): {token}");
                    token
                } else {
                    let mut secret = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut secret)
                        .context("reading the token from standard input")?;
                    let secret = secret.trim().to_string();
                    anyhow::ensure!(
                        !secret.is_empty(),
                        "no token on standard input (pipe one in, or pass --generate)"
                    );
                    secret
                };
                print!(
                    "{}",
                    crate::api_auth::scoped_file_entry(&name, role, &accounts, &token)
                );
                Ok(())
            }
            TokenAction::List { hub } => {
                let body = hub.call("GET", "/api/v1/tokens").await?;
                let tokens: Vec<TokenView> =
                    serde_json::from_str(&body).context("the hub's token list")?;
                println!("{}", token_table(&tokens));
                Ok(())
            }
            TokenAction::Revoke { id, hub } => {
                let body = hub.call("DELETE", &format!("/api/v1/tokens/{id}")).await?;
                let revoked: Revoked<TokenView> =
                    serde_json::from_str(&body).context("the hub's answer")?;
                let token = revoked.token;
                println!(
                    "revoked token {} ({:?} of account {}); ended {} open watch(es) and \
                     session(s) on the hub replica that answered",
                    token.id, token.name, token.account, revoked.ended_sessions
                );
                Ok(())
            }
        },
        Admin::AgentToken { action } => match action {
            AgentTokenAction::Create {
                identity,
                accounts,
                ttl,
                once,
                hub,
            } => {
                let path = format!(
                    "/api/v1/agent-tokens?identity={}&accounts={}&ttl={}{}",
                    encode_query(&identity),
                    encode_query(&accounts),
                    encode_query(&ttl),
                    if once { "&once=true" } else { "" }
                );
                let body = hub.call("POST", &path).await?;
                let token: AgentTokenView =
                    serde_json::from_str(&body).context("the hub's answer")?;
                eprintln!(
                    "issued {} token {} for identity {} (accounts {}), valid until {}",
                    token.kind, token.id, token.identity, token.accounts, token.expires
                );
                println!("{}", token.token.unwrap_or_default());
                Ok(())
            }
            AgentTokenAction::List { hub } => {
                let body = hub.call("GET", "/api/v1/agent-tokens").await?;
                let tokens: Vec<AgentTokenView> =
                    serde_json::from_str(&body).context("the hub's agent token list")?;
                let mut rows = vec![
                    ["ID", "KIND", "IDENTITY", "ACCOUNTS", "EXPIRES", "USED"]
                        .map(str::to_string)
                        .to_vec(),
                ];
                for t in tokens {
                    rows.push(vec![
                        t.id,
                        t.kind,
                        t.identity,
                        t.accounts,
                        t.expires,
                        t.used.unwrap_or_default(),
                    ]);
                }
                println!("{}", table(&rows));
                Ok(())
            }
            AgentTokenAction::Revoke { id, hub } => {
                let body = hub
                    .call(
                        "DELETE",
                        &format!("/api/v1/agent-tokens/{}", encode_query(&id)),
                    )
                    .await?;
                let revoked: Revoked<AgentTokenView> =
                    serde_json::from_str(&body).context("the hub's answer")?;
                let token = revoked.token;
                println!(
                    "revoked {} token {} of identity {}; ended {} live stream(s) on the hub \
                     replica that answered",
                    token.kind, token.id, token.identity, revoked.ended_sessions
                );
                Ok(())
            }
        },
        Admin::Agent { action } => super::identity::run(action).await,
        Admin::Account { action } => match action {
            AccountAction::Delete { name, hub } => {
                let path = format!("/api/v1/accounts/{}/binding", encode_query(&name));
                let body = hub.call("DELETE", &path).await?;
                let deleted: crate::identity_admin::DeletedAccountView =
                    serde_json::from_str(&body).context("the hub's answer")?;
                match deleted.released_identity {
                    Some(identity) => println!(
                        "deleted account {}; its binding to identity {identity} is released",
                        deleted.account
                    ),
                    None => println!("deleted account {} (it had no binding)", deleted.account),
                }
                Ok(())
            }
            AccountAction::Rebind {
                name,
                identity,
                hub,
            } => {
                let path = format!(
                    "/api/v1/accounts/{}/rebind?identity={}",
                    encode_query(&name),
                    encode_query(&identity)
                );
                let body = hub.call("POST", &path).await?;
                let binding: BindingView =
                    serde_json::from_str(&body).context("the hub's answer")?;
                println!(
                    "account {} is bound to identity {}",
                    binding.account, binding.identity
                );
                Ok(())
            }
            AccountAction::Bindings { hub } => {
                let body = hub.call("GET", "/api/v1/account-bindings").await?;
                let bindings: Vec<BindingView> =
                    serde_json::from_str(&body).context("the hub's binding list")?;
                let mut rows = vec![
                    ["ACCOUNT", "IDENTITY", "SINCE"]
                        .map(str::to_string)
                        .to_vec(),
                ];
                for b in bindings {
                    rows.push(vec![b.account, b.identity, b.since]);
                }
                println!("{}", table(&rows));
                Ok(())
            }
        },
    }
}

/// The kubeconfig of `kubeconfig --exec`: this program, with the same hub access, as the
/// exec credential plugin.
fn exec_kubeconfig(account: &str, ttl: Option<&str>, hub: &HubAccess) -> anyhow::Result<String> {
    let program = std::env::current_exe().context("cannot tell this program's own path")?;
    let absolute = |path: &PathBuf| -> anyhow::Result<String> {
        let path = std::path::absolute(path)
            .with_context(|| format!("cannot make {} absolute", path.display()))?;
        Ok(path.display().to_string())
    };
    let mut args = vec![
        "token".to_string(),
        "credential".to_string(),
        format!("--account={account}"),
        format!("--hub-url={}", hub.hub_url),
    ];
    if let Some(ttl) = ttl {
        args.push(format!("--ttl={ttl}"));
    }
    if let Some(ca) = &hub.ca_file {
        args.push(format!("--ca-file={}", absolute(ca)?));
    }
    if let Some(name) = &hub.server_name {
        args.push(format!("--server-name={name}"));
    }
    match (&hub.token_file, &hub.admin_token_file) {
        (Some(file), _) => args.push(format!("--token-file={}", absolute(file)?)),
        (None, Some(file)) => args.push(format!("--admin-token-file={}", absolute(file)?)),
        (None, None) => args.push(format!("--data-dir={}", absolute(&hub.data_dir)?)),
    }
    let ca_pem = hub
        .ca_file
        .as_ref()
        .map(|path| {
            std::fs::read(path).with_context(|| format!("cannot read --ca-file {}", path.display()))
        })
        .transpose()?;
    Ok(crate::kubeconfig::render_exec(
        &crate::kubeconfig::KubeconfigFor {
            account,
            public_url: &hub.hub_url,
            ca_pem: ca_pem.as_deref(),
            token: "",
        },
        &crate::kubeconfig::ExecCommand {
            command: &program.display().to_string(),
            args: &args,
        },
    ))
}

/// Rows as aligned columns.
pub(super) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            r.iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn encode_query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The token list as aligned columns (`-` for what a token does not have).
pub fn token_table(tokens: &[TokenView]) -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut rows = vec![vec![
        "ID".to_string(),
        "KIND".to_string(),
        "ROLE".to_string(),
        "ACCOUNT".to_string(),
        "NAME".to_string(),
        "SOURCE".to_string(),
        "CREATED".to_string(),
        "DERIVED".to_string(),
        "EXPIRES".to_string(),
    ]];
    for t in tokens {
        rows.push(vec![
            dash(&t.id),
            dash(&t.kind),
            t.role.map_or("-".to_string(), |r| r.to_string()),
            // An API token's account globs stand where a proxy token's account does.
            dash(&if t.account.is_empty() {
                t.accounts.join(",")
            } else {
                t.account.clone()
            }),
            t.name.clone(),
            dash(&t.source),
            dash(&t.created),
            t.derived.to_string(),
            dash(&t.expires),
        ]);
    }
    table(&rows)
}

impl HubAccess {
    fn admin_token(&self) -> anyhow::Result<String> {
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --token-file {}", path.display()))?;
            return Ok(token.trim().to_string());
        }
        let path = self
            .admin_token_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("admin-token"));
        let token = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read the admin token file {} (the hub creates it at start; pass \
                 --admin-token-file or --data-dir)",
                path.display()
            )
        })?;
        Ok(token.trim().to_string())
    }

    fn tls(&self) -> anyhow::Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                let pem = std::fs::read(path)
                    .with_context(|| format!("cannot read --ca-file {}", path.display()))?;
                for cert in CertificateDer::pem_slice_iter(&pem) {
                    roots.add(cert.with_context(|| format!("{}", path.display()))?)?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }

    /// `method path` with the admin token; the body of a 2xx answer, else an error with the
    /// hub's message.
    pub(super) async fn call(&self, method: &str, path: &str) -> anyhow::Result<String> {
        self.call_with(method, path, Vec::new()).await
    }

    /// [`Self::call`] with a JSON body.
    async fn call_with(&self, method: &str, path: &str, body: Vec<u8>) -> anyhow::Result<String> {
        let url = format!("{}{path}", self.hub_url.trim_end_matches('/'));
        let request = http::Request::builder()
            .method(method)
            .uri(&url)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.admin_token()?),
            )
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes::Bytes::from(body)))?;
        let send = async {
            let response = if url.starts_with("https://") {
                let mut connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(self.tls()?)
                    .https_only();
                if let Some(name) = &self.server_name {
                    let name = ServerName::try_from(name.clone())
                        .with_context(|| format!("--server-name {name:?}"))?;
                    connector = connector.with_server_name_resolver(FixedName(name));
                }
                Client::builder(TokioExecutor::new())
                    .build::<_, Full<bytes::Bytes>>(connector.enable_http1().build())
                    .request(request)
                    .await
            } else {
                Client::builder(TokioExecutor::new())
                    .build_http::<Full<bytes::Bytes>>()
                    .request(request)
                    .await
            }
            .map_err(|e| {
                anyhow::anyhow!("cannot reach the hub at {url}: {}", crate::error::Chain(&e))
            })?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            let body = String::from_utf8_lossy(&body).into_owned();
            if !status.is_success() {
                let message = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or(body);
                anyhow::bail!("the hub answered {status}: {message}");
            }
            anyhow::Ok(body)
        };
        tokio::time::timeout(CALL_TIMEOUT, send)
            .await
            .map_err(|_| anyhow::anyhow!("no answer from the hub at {url} within 30 s"))?
    }
}

/// Verifies every connection's certificate for one fixed name.
#[derive(Debug)]
struct FixedName(ServerName<'static>);

impl hyper_rustls::ResolveServerName for FixedName {
    fn resolve(
        &self,
        _: &http::Uri,
    ) -> Result<ServerName<'static>, Box<dyn std::error::Error + Sync + Send>> {
        Ok(self.0.clone())
    }
}

#[cfg(test)]
mod tests;
