//! The hub's error type, shared by its crates: a failure keeps its meaning (and its message)
//! whichever layer it crosses. The backends' own errors (redb, PostgreSQL, tonic) are carried
//! as sources without naming their types, so this crate depends on none of them.

use std::{net::SocketAddr, path::PathBuf};

pub use scale_agent_runtime::Chain;

/// Everything that can go wrong in the hub outside a single agent stream (a stream's
/// protocol errors become gRPC statuses in the hub's session module).
///
/// `Display` says what failed, never the cause: the `source` chain carries that, and
/// [`Chain`] (or anyhow's exit message) prints it once.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A command-line flag or environment variable has a value the hub cannot use.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A file named by the configuration could not be read.
    #[error("cannot read {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A TLS file named by a flag cannot be read or holds no certificate or key.
    #[error("{flag} {path}: {problem}")]
    TlsFile {
        flag: &'static str,
        path: PathBuf,
        problem: String,
    },
    /// A listener could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Other I/O (data directory, sockets).
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The embedded store (redb) failed.
    #[error("store {context}")]
    Store {
        context: &'static str,
        #[source]
        source: BoxedError,
    },
    /// The PostgreSQL store failed. Its message names PostgreSQL whichever way the failure
    /// shows (a statement refused, or the connection found closed only by the statement).
    #[error("PostgreSQL {context}")]
    Postgres {
        context: String,
        #[source]
        source: BoxedError,
    },
    /// Connecting to PostgreSQL failed; `hint` says what to change. Neither holds the
    /// URL's password.
    #[error("cannot connect to PostgreSQL at {location}: {cause}; {hint}")]
    PostgresConnect {
        location: String,
        cause: String,
        hint: String,
    },
    /// A commit touched accounts this replica no longer owns (another replica took them
    /// over): nothing of the batch was written.
    #[error(
        "replica {replica} no longer owns accounts {accounts:?}; their changes were not written"
    )]
    Fenced {
        replica: String,
        accounts: Vec<String>,
    },
    /// The PostgreSQL database was migrated by a newer hub.
    #[error(
        "the PostgreSQL schema is at version {current}, newer than this hub knows ({known}): \
         run a hub at least as new as the one that migrated it"
    )]
    SchemaTooNew { current: i64, known: i64 },
    /// A record in the store could not be decoded.
    #[error("store record {key:?} is corrupt: {message}")]
    Corrupt { key: String, message: String },
    /// The store was closed (the hub is shutting down).
    #[error("the store is closed (the hub is shutting down)")]
    StoreClosed,
    /// The source of account ownership (PostgreSQL advisory locks) failed; the message says
    /// what to check.
    #[error("account ownership: {0}")]
    Ownership(String),
    /// The gRPC server (tonic) failed.
    #[error("gRPC server failed")]
    Grpc(#[source] BoxedError),
    /// The operating system's random number generator failed (tokens cannot be made).
    #[error("the operating system's random number generator failed")]
    Random,
    /// A background task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
}

/// A backend's error (redb, tokio-postgres, tonic) as the source of a [`HubError`].
pub type BoxedError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl HubError {
    /// Wraps an embedded store's (redb's) error with what the hub was doing.
    pub fn store(context: &'static str, source: impl Into<BoxedError>) -> Self {
        HubError::Store {
            context,
            source: source.into(),
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = HubError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The cause is printed once, by the chain, not also by the error's own message; the
    /// start-up failure a user sees (anyhow's exit message) still names it.
    #[test]
    fn display_leaves_the_cause_to_the_chain() {
        let cause = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let error = HubError::Bind {
            addr: "127.0.0.1:9091".parse().expect("an address"),
            source: cause,
        };
        assert_eq!(error.to_string(), "cannot listen on 127.0.0.1:9091");
        let chain = Chain(&error).to_string();
        assert_eq!(chain, "cannot listen on 127.0.0.1:9091: address in use");
        let exit = format!("{:?}", anyhow::Error::from(error));
        assert_eq!(exit.matches("address in use").count(), 1, "{exit}");
        assert!(exit.contains("cannot listen on 127.0.0.1:9091"), "{exit}");
    }
}
