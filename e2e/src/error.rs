//! The one error type of the test-support library.

use std::path::PathBuf;

/// What can go wrong while building, starting or talking to the local control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control-plane binaries have not been built on this machine yet (or were built
    /// by an older `build.sh` that did not make all of them).
    #[error(
        "the control-plane binaries for Kubernetes {version} are not in {dir} (missing: {missing}): \
         build them once with `make control-plane` (or `e2e/control-plane/build.sh`), or point \
         SCALE_AGENT_CONTROL_PLANE_BIN at a directory holding what that script makes"
    )]
    BinariesMissing {
        version: &'static str,
        dir: PathBuf,
        missing: String,
    },

    /// One of this package's binaries has not been built.
    #[error(
        "{name} is not built next to {dir}: run `cargo build -p scale-agent-e2e --bins` \
         (make demo and make test do)"
    )]
    ProductBinaryMissing { name: String, dir: PathBuf },

    #[error("failed to {action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },

    /// "failed to generate {what}: {rcgen's error}".
    #[error(transparent)]
    Certificate(#[from] scale_agent_testkit::pki::CertificateError),

    /// A component did not become ready within its budget; `log_tail` holds the end of its log.
    #[error(
        "{component} was not ready after {waited_secs} s (log: {log}); last lines:\n{log_tail}"
    )]
    NotReady {
        component: &'static str,
        waited_secs: u64,
        log: PathBuf,
        log_tail: String,
    },

    /// A component exited while it was expected to run.
    #[error("{component} exited with {status} (log: {log}); last lines:\n{log_tail}")]
    Exited {
        component: &'static str,
        status: std::process::ExitStatus,
        log: PathBuf,
        log_tail: String,
    },

    /// A component was asked for (to restart it) on a control plane that no longer runs it.
    #[error("{component} is not running in this control plane (stopped already?)")]
    NotRunning { component: &'static str },

    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),

    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    #[error("the TokenRequest for ServiceAccount {service_account} returned no token")]
    NoToken { service_account: String },

    #[error("etcd at {endpoint}: {message}")]
    Etcd { endpoint: String, message: String },

    #[error("timed out after {secs} s waiting for {what}")]
    Timeout { what: String, secs: u64 },

    /// The control plane shared by a test binary failed to start; the first test to use
    /// it got the full error, later ones get its text.
    #[error("the shared control plane failed to start: {0}")]
    SharedStartFailed(String),

    /// A Deployment's pod cannot be run as a local process (see `local_agent`).
    #[error("cannot run pod {pod} locally: {message}")]
    LocalPod { pod: String, message: String },

    /// An HTTP request to a local component failed (no full answer in time, or an
    /// unusable CA).
    #[error("{method} {url}: {message}")]
    Http {
        method: String,
        url: String,
        message: String,
    },

    /// Something that needs KWOK was asked of a control plane started without it.
    #[error("{what} needs KWOK: start the control plane with `ControlPlaneOptions::with_kwok()`")]
    KwokNotRunning { what: &'static str },

    /// The older API server was asked for with a real node, whose kubelet and kube-proxy are
    /// the pinned (newer) release: the version skew policy forbids a kubelet newer than its
    /// API server.
    #[error(
        "the older API server ({older}) runs with KWOK only: the real node's kubelet is \
         {pinned}, newer than the API server"
    )]
    OlderApiServerWithRealNode {
        older: &'static str,
        pinned: &'static str,
    },

    #[error("invalid manifest {path}: {message}")]
    Manifest { path: PathBuf, message: String },

    /// nginx (Debian's package, unpacked into the cache) is not there.
    #[error(
        "nginx is not installed at {path}: run `make nginx` (e2e/nginx/install.sh) once; \
         make test does"
    )]
    NginxMissing { path: PathBuf },

    /// tinyproxy (Debian's package, unpacked into the cache) is not there.
    #[error(
        "tinyproxy is not installed at {path}: run `make tinyproxy` (e2e/tinyproxy/install.sh) \
         once; make test does"
    )]
    TinyproxyMissing { path: PathBuf },

    /// PostgreSQL (Debian's packages, unpacked into the cache) is not there.
    #[error(
        "PostgreSQL is not installed at {path}: run `make postgres` (e2e/postgres/install.sh) \
         once; make test does"
    )]
    PostgresMissing { path: PathBuf },

    /// Making a PostgreSQL cluster for the tests failed (initdb, its user and database).
    #[error("PostgreSQL set-up: {what} failed:\n{output}")]
    PostgresSetup { what: String, output: String },

    #[error("failed to {action}: {}", postgres_text(source))]
    Postgres {
        action: String,
        #[source]
        source: tokio_postgres::Error,
    },

    /// Lua 5.1 (Debian's package, unpacked into the cache) is not there.
    #[error(
        "lua5.1 is not installed at {path}: run `make lua` (e2e/lua/install.sh) once; make \
         test does"
    )]
    LuaMissing { path: PathBuf },

    /// A shipped Argo CD health check failed to run.
    #[error("the Argo CD health check of {kind} failed: {message}")]
    HealthCheck { kind: String, message: String },

    /// A real node cannot run on this machine ([`crate::real_node::unavailable`]).
    #[error("no real node on this machine: {reason}")]
    NodeUnavailable { reason: String },

    /// A part of a real node (containerd, runc, the CNI plugins, iptables, the pause image)
    /// is not installed.
    #[error(
        "{path} is missing: run `make node` (e2e/node/install.sh, as root) once to install          containerd, runc, the CNI plugins and iptables and build the pause image; make test does"
    )]
    NodePartMissing { path: PathBuf },

    /// A command that sets up or inspects a real node failed.
    #[error("`{command}` failed: {output}")]
    NodeCommand { command: String, output: String },

    /// An OCI image layout (`images/image.sh`) is malformed or does not match its digests.
    #[error("OCI image layout {layout}: {message}")]
    Image { layout: PathBuf, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<scale_agent_testkit::http::Error> for Error {
    fn from(error: scale_agent_testkit::http::Error) -> Self {
        let scale_agent_testkit::http::Error {
            method,
            url,
            message,
        } = error;
        Error::Http {
            method,
            url,
            message,
        }
    }
}

/// A tokio-postgres error with its cause: its own text is only the kind ("db error").
pub fn postgres_text(error: &tokio_postgres::Error) -> String {
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

/// Wraps an `io::Error` with what was being done, so the message says what to look at.
pub(crate) fn io_err(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let action = action.into();
    move |source| Error::Io { action, source }
}
