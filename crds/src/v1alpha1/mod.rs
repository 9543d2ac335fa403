//! `scaleagent.dev/v1alpha1`: the first, still evolving, version of the API.

mod agent_account;
mod agent_pod;
mod common;
mod scale_agent;

pub use agent_account::{
    ANY_CALLER, AccountHubStatus, AgentAccount, AgentAccountSpec, AgentAccountStatus,
    CALLER_PREFIX_PATTERN, Callers, Credentials, CredentialsType, CustomResourceKind,
    DEFAULT_CALLER_PREFIX, ForbiddenKind, KubeconfigSecretRef, Permissions, ServiceAccountRef,
};
pub use agent_pod::{
    AgentDisruptionBudget, AgentPod, RESERVED_ENV, RESERVED_KEY_PREFIX, RESERVED_POD_LABELS,
};
pub use common::{ACCOUNT_NAME_MAX_LENGTH, DNS1123_LABEL_PATTERN, is_dns1123_label};
pub use scale_agent::{
    Access, AccountDefaults, Backoff, CaSecretRef, ClientCertificate, DEFAULT_AGENT_IMAGE,
    DEFAULT_AGENT_REPOSITORY, DEFAULT_CERTIFICATE_LIFETIME, Enrolment, Heartbeat, Hub, HubTls,
    ImagePullPolicy, IssuerSecretRef, ListBudget, Mode, OperationBudget, ScaleAgent,
    ScaleAgentSpec, ScaleAgentStatus, Scope, ScopeType, TokenSecretRef,
};
