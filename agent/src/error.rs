//! The crate's one error type.

use std::path::PathBuf;

pub use scale_agent_runtime::Chain;

/// Everything that can go wrong in the agent. Messages say what to change where a user can
/// fix the cause.
///
/// `Display` says what failed, never the cause: the `source` chain carries that, and
/// [`Chain`] (or anyhow's exit message) prints it once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the config file {path}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        // troubleshooting: the agent exits at start-up
        // A `--config` path given explicitly must exist (without one, the agent tries Armory's
        // paths and otherwise starts on the defaults).
        "the config file {path} does not exist: create it, or point --config (SCALE_AGENT_CONFIG) at the agent's config file"
    )]
    ConfigMissing { path: PathBuf },
    // troubleshooting: the agent exits at start-up, or keeps its last good config
    // A config file that does not parse stops the agent at start-up; on a hot reload the previous
    // config stays, and `/accounts` shows the problem under `config.problem`.
    #[error("the config file {path} is not valid: {message}")]
    ParseConfig { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error(
        // troubleshooting: AgentAccount `Connected=False`, reason `AccountFailing`
        // An account in a config file needs credentials: its ServiceAccount (in the cluster the
        // agent runs in) or a kubeconfig file.
        "account {account}: no credentials; set `serviceAccount: true` or `kubeconfigFile` in its config"
    )]
    NoCredentials { account: String },
    // troubleshooting: AgentAccount `Connected=False`, reason `AccountFailing`
    // The kubeconfig file is missing, unreadable or invalid. The agent retries with backoff and
    // serves its other accounts meanwhile.
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
    #[error("account {account}: cannot {context}")]
    Kube {
        account: String,
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read {what} {path}")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        // troubleshooting: the agent exits at start-up
        // `clouddriver.grpc` or `--hub` must be `host:port`.
        "invalid hub address {address:?}: {message}; write it as host:port (or https://host:port)"
    )]
    HubAddress { address: String, message: String },
    #[error("cannot connect to the hub at {address}")]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// Enrolment or renewal of the client certificate; the text says what to change.
    #[error("enrolment: {0}")]
    Enrolment(String),
    #[error("hub stream failed")]
    Stream(#[from] tonic::Status),
    #[error("hub protocol error: {0}")]
    Protocol(String),
    #[error("cannot serve the admin listener on {addr}")]
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The cause is printed once, by the chain, not also by the error's own message; the
    /// exit message for a config file that cannot be read (anyhow's, from `main`) still
    /// names the cause.
    #[test]
    fn display_leaves_the_cause_to_the_chain() {
        let dir = std::env::temp_dir();
        let error = crate::config::read_config_text(&dir)
            .expect_err("a directory is not a readable config file");
        let cause = std::fs::read_to_string(&dir)
            .expect_err("reading a directory fails")
            .to_string();
        let what = format!("cannot read the config file {}", dir.display());
        assert_eq!(error.to_string(), what);
        assert_eq!(Chain(&error).to_string(), format!("{what}: {cause}"));
        let exit = format!("{:?}", anyhow::Error::from(error));
        assert!(exit.starts_with(&what), "{exit}");
        assert_eq!(exit.matches(&cause).count(), 1, "{exit}");
    }
}
