//! The crate's one error type.

use std::{net::SocketAddr, path::PathBuf};

/// Everything that can go wrong in the hub outside a single agent stream (a stream's
/// protocol errors become gRPC statuses, see [`crate::session`]).
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A command-line flag or environment variable has a value the hub cannot use.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A file named by the configuration could not be read.
    #[error("cannot read {path}: {source}")]
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
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Other I/O (data directory, sockets).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The embedded store (redb) failed.
    #[error("store {context}: {source}")]
    Store {
        context: &'static str,
        #[source]
        source: Box<redb::Error>,
    },
    /// A record in the store could not be decoded.
    #[error("store record {key:?} is corrupt: {message}")]
    Corrupt { key: String, message: String },
    /// The store was closed (the hub is shutting down).
    #[error("the store is closed (the hub is shutting down)")]
    StoreClosed,
    /// The gRPC server (tonic) failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The operating system's random number generator failed (tokens cannot be made).
    #[error("the operating system's random number generator failed")]
    Random,
    /// A background task panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(String),
}

impl HubError {
    /// Wraps any redb error with what the hub was doing.
    pub(crate) fn store(context: &'static str, source: impl Into<redb::Error>) -> Self {
        HubError::Store {
            context,
            source: Box::new(source.into()),
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = HubError> = std::result::Result<T, E>;
