//! The crate's one error type.

use kube::runtime::finalizer;

/// Everything that can make a reconcile (or the operator's start-up) fail.
///
/// `Display` says what failed, never the cause: the `source` chain carries that, and
/// [`Chain`] (or anyhow's exit message) prints it once.
///
/// Problems a user can fix by editing a resource (a missing issuer Secret, an unknown kind)
/// are not errors: they are reported in status conditions. These are the failures left over:
/// the API server refusing or failing a request, or internal inconsistencies.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the Kubernetes API failed.
    #[error("failed to {action}")]
    Kube {
        /// What the operator was doing, e.g. `apply Deployment ns/prod-agent`.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },

    /// The finalizer helper failed (boxed: it embeds this type).
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<Error>>),

    /// An object could not be serialised or deserialised.
    #[error("failed to serialise {what}")]
    Serialize {
        /// What was being serialised.
        what: String,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },

    /// Rendering the agent config failed.
    #[error("failed to render the agent config")]
    AgentConfig(#[from] scale_agent_crds::Error),

    /// Issuing a certificate failed.
    #[error("failed to issue the agent certificate: {0}")]
    Certificate(String),

    /// Taking or holding the leader Lease failed.
    #[error("leader election: {0}")]
    LeaderElection(String),

    /// The AgentAccount cache stopped before it held its first list (the operator is
    /// stopping).
    #[error("the AgentAccount cache stopped before it was filled")]
    AccountCacheStopped,

    /// An object lacks a field the API server always sets.
    #[error("object has no {0}")]
    MissingField(&'static str),

    /// The metrics listener failed.
    #[error("metrics server failed")]
    Metrics(#[source] std::io::Error),
}

impl Error {
    /// A bounded label for metrics (never per object, never a message).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Kube { .. } => "kube",
            // Every ScaleAgent reconcile runs inside `finalizer()`: label what failed in it.
            Self::Finalizer(inner) => match inner.as_ref() {
                finalizer::Error::ApplyFailed(error) | finalizer::Error::CleanupFailed(error) => {
                    error.category()
                }
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_) => "kube",
                finalizer::Error::UnnamedObject => "missing_field",
                finalizer::Error::InvalidFinalizer => "finalizer",
            },
            Self::Serialize { .. } => "serialize",
            Self::AgentConfig(_) => "agent_config",
            Self::Certificate(_) => "certificate",
            Self::MissingField(_) => "missing_field",
            Self::AccountCacheStopped => "cache",
            Self::Metrics(_) => "metrics",
            Self::LeaderElection(_) => "leader_election",
        }
    }
}

pub use scale_agent_runtime::Chain;

/// Maps a [`kube::Error`] to [`Error::Kube`] with a description of the action.
pub(crate) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// Whether `error` is the API server's 404 Not Found.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// Whether `error` is the API server's 403 Forbidden.
pub(crate) fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The cause is printed once, by the chain, not also by the error's own message.
    #[test]
    fn display_leaves_the_cause_to_the_chain() {
        let error = Error::Kube {
            action: "get Secret team/agent-ca".into(),
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        let cause = kube::Error::LinesCodecMaxLineLengthExceeded.to_string();
        assert_eq!(error.to_string(), "failed to get Secret team/agent-ca");
        let chain = Chain(&error).to_string();
        assert_eq!(
            chain,
            format!("failed to get Secret team/agent-ca: {cause}")
        );
        assert_eq!(chain.matches(&cause).count(), 1, "{chain}");
    }
}
