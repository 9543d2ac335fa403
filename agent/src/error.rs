//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the agent. Messages say what to change where a user can
/// fix the cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the config file {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the config file {path} does not exist: create it, or point --config (SCALE_AGENT_CONFIG) at the agent's config file"
    )]
    ConfigMissing { path: PathBuf },
    #[error("the config file {path} is not valid: {message}")]
    ParseConfig { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error(
        "account {account}: no credentials; set `serviceAccount: true` or `kubeconfigFile` in its config"
    )]
    NoCredentials { account: String },
    #[error("account {account}: cannot load kubeconfig {path}: {message}")]
    Kubeconfig {
        account: String,
        path: String,
        message: String,
    },
    #[error(
        "account {account}: no in-cluster credentials and no kubeconfig to fall back on: {message}"
    )]
    InCluster { account: String, message: String },
    #[error("account {account}: {context}: {source}")]
    Kube {
        account: String,
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read {what} {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "invalid hub address {address:?}: {message}; write it as host:port (or https://host:port)"
    )]
    HubAddress { address: String, message: String },
    #[error("cannot connect to the hub at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// Enrolment or renewal of the client certificate; the text says what to change.
    #[error("enrolment: {0}")]
    Enrolment(String),
    #[error("hub stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("hub protocol error: {0}")]
    Protocol(String),
    #[error("admin listener on {addr}: {source}")]
    Admin {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// `scale-agent migrate` could not write its output.
    #[error("migrate: {0}")]
    Migrate(String),
    #[error("the agent was shut down")]
    Shutdown,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
