//! Custom resource types for Scale Agent: `ScaleAgent` and `AgentAccount` in
//! `scaleagent.dev/v1alpha1`.
//!
//! The Rust types are the single source of truth: the CustomResourceDefinitions under
//! `manifests/crds/` are rendered from them by `crdgen` (`make crds`) and a test fails when the
//! checked-in YAML drifts.

pub mod agent_config;
pub mod conditions;
mod error;
mod reference;
mod render;
pub mod v1alpha1;

pub use error::Error;
pub use reference::{REFERENCE_PATH, render_reference};
pub use render::{CRD_FILE_HEADER, crds, render_crds, render_kustomization};
pub use v1alpha1::{
    AgentAccount, AgentAccountSpec, AgentAccountStatus, ScaleAgent, ScaleAgentSpec,
    ScaleAgentStatus,
};

/// API group of every Scale Agent custom resource.
pub const GROUP: &str = "scaleagent.dev";
/// The only served (and storage) version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the resources in this crate.
pub const API_VERSION: &str = "scaleagent.dev/v1alpha1";

/// Field manager the operator uses for every server-side apply, so ownership of the fields it
/// writes is unambiguous in `managedFields`.
pub const FIELD_MANAGER: &str = "scale-agent-operator";

/// Field manager the agent uses for the status it writes (the `Connected` condition and
/// `status.hub` of AgentAccounts, `status.connected`/`connectedReplicas` of its ScaleAgent),
/// so it never takes over the operator's fields, nor the operator its.
pub const AGENT_FIELD_MANAGER: &str = "scale-agent-agent";

/// `app.kubernetes.io/name`: the application's name (`scale-agent`).
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: the owning `ScaleAgent`'s name.
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/component`: which part of the system an object belongs to (`agent`, ...).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// `app.kubernetes.io/managed-by`: the tool that manages the object ([`MANAGED_BY`]).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/part-of`: the higher-level application ([`PART_OF`]).
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";

/// Value of [`LABEL_NAME`] and [`LABEL_PART_OF`] on everything Scale Agent creates.
pub const PART_OF: &str = "scale-agent";
/// Value of [`LABEL_MANAGED_BY`] on everything the operator creates.
pub const MANAGED_BY: &str = "scale-agent-operator";
