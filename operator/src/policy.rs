//! What the operator agrees to act on, so that creating a `ScaleAgent` is no way around the
//! cluster's own RBAC: only objects in the namespaces it is told to watch, and only agent
//! images from the configured prefixes. Pure.

use std::{collections::BTreeSet, fmt};

use scale_agent_crds::v1alpha1::DEFAULT_AGENT_REPOSITORY;

use crate::status::Problem;

/// The namespaces whose `ScaleAgent`s and `AgentAccount`s the operator reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchNamespaces {
    /// Every namespace (`--watch-namespaces='*'`).
    All,
    /// Only these.
    Only(BTreeSet<String>),
}

impl WatchNamespaces {
    /// Parses the flag's values: `*` alone for every namespace, else namespace names.
    pub fn parse(values: &[String]) -> Result<Self, String> {
        let names: BTreeSet<String> = values
            .iter()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect();
        if names.contains("*") {
            return if names.len() == 1 {
                Ok(Self::All)
            } else {
                Err(
                    "--watch-namespaces: '*' (every namespace) cannot be combined with \
                     namespace names; give either '*' or a comma-separated list"
                        .into(),
                )
            };
        }
        if names.is_empty() {
            return Err("--watch-namespaces is empty: give namespace names, or '*'".into());
        }
        if let Some(bad) = names
            .iter()
            .find(|n| !scale_agent_crds::v1alpha1::is_dns1123_label(n))
        {
            return Err(format!(
                "--watch-namespaces: {bad:?} is not a namespace name (a lowercase DNS label)"
            ));
        }
        Ok(Self::Only(names))
    }

    /// Whether objects in `namespace` are reconciled.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(names) => names.contains(namespace),
        }
    }

    /// The message an object in an unwatched `namespace` gets.
    pub fn refusal(&self, kind: &str, namespace: &str) -> String {
        format!(
            // troubleshooting: ScaleAgent or AgentAccount `Ready=False`, reason `NamespaceNotWatched`
            // The operator reconciles ScaleAgents and AgentAccounts only in the namespaces of its
            // `--watch-namespaces` (default: its own, `scale-agent-system`); nothing was created.
            // Create the object there, or have a cluster administrator add the namespace (Helm: the
            // operator's watched namespaces value).
            "this operator reconciles {kind}s only in [{self}], not in {namespace}: create it \
             in one of those, or add {namespace} to the operator's --watch-namespaces \
             (creating a ScaleAgent is a cluster-administrator act; see the user guide's \
             Identities and security page, docs/src/concepts/identities.md)"
        )
    }
}

impl fmt::Display for WatchNamespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("*"),
            Self::Only(names) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                f.write_str(&names.join(", "))
            }
        }
    }
}

/// The image prefixes allowed when none are configured: the project's own agent repository.
pub fn default_image_prefixes() -> Vec<String> {
    vec![DEFAULT_AGENT_REPOSITORY.to_owned()]
}

/// Whether `image` comes from one of `prefixes`. A prefix ending in `/`, `:` or `@` is a
/// plain prefix (`registry.example.com/team/`); any other is a repository, which must be
/// followed by a tag or digest, so `ghcr.io/scale-agent/agent` allows
/// `ghcr.io/scale-agent/agent:v1` and `…/agent@sha256:…` but not `…/agent-fork:v1`.
pub fn image_allowed(image: &str, prefixes: &[String]) -> bool {
    prefixes.iter().any(|prefix| {
        let Some(rest) = image.strip_prefix(prefix.as_str()) else {
            return false;
        };
        prefix.ends_with(['/', ':', '@']) || rest.starts_with([':', '@'])
    })
}

/// The problem of a `ScaleAgent` whose image is outside `prefixes`, if it is.
pub fn check_image(image: &str, prefixes: &[String]) -> Option<Problem> {
    if image_allowed(image, prefixes) {
        return None;
    }
    Some(Problem {
        // troubleshooting: ScaleAgent `Degraded=True`, `Ready=False`
        // `spec.image` names an image outside the operator's `--allowed-image-prefixes`. Unset
        // `spec.image` for the default agent image, or have its repository added to the allowed
        // prefixes.
        reason: "ImageNotAllowed",
        message: format!(
            "spec.image {image} is not under an allowed prefix ({}): use an image from one of \
             them (or unset spec.image for the default), or ask a cluster administrator to add \
             its repository to the operator's --allowed-image-prefixes; nothing was created or \
             updated",
            prefixes.join(", ")
        ),
    })
}

/// Namespaces no Role and no impersonation reaches unless named explicitly in
/// `--grantable-namespaces` / `--impersonable-service-accounts`: the control plane's own, whose
/// ServiceAccounts (controllers) and Secrets (bootstrap tokens) are cluster-admin material.
/// The operator's own namespace is added by [`Grants::operator_namespace`].
pub const RESERVED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// Where the operator may give an agent rights, beyond the cluster's RBAC of the CR's author:
/// the namespaces it creates Roles in (`spec.scope.namespaces`) and the ServiceAccounts an
/// `AgentAccount.impersonateServiceAccount` may name. A tenant who may create ScaleAgents in
/// one namespace must not reach another one through the operator (review F1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// `--grantable-namespaces` contained `*`: every namespace but the reserved ones.
    pub every_namespace: bool,
    /// Namespaces named in `--grantable-namespaces`, reserved ones included when named.
    pub namespaces: BTreeSet<String>,
    /// `--impersonable-service-accounts`: `(namespace, name)`, name `*` for every
    /// ServiceAccount of the namespace.
    pub service_accounts: BTreeSet<(String, String)>,
    /// The operator's own namespace: reserved like [`RESERVED_NAMESPACES`].
    pub operator_namespace: Option<String>,
}

impl Grants {
    /// Parses `--grantable-namespaces` (`*` and/or namespace names) and
    /// `--impersonable-service-accounts` (`namespace/name` or `namespace/*`).
    pub fn parse(
        namespaces: &[String],
        service_accounts: &[String],
        operator_namespace: Option<String>,
    ) -> Result<Self, String> {
        let mut grants = Self {
            operator_namespace,
            ..Self::default()
        };
        for value in namespaces
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
        {
            if value == "*" {
                grants.every_namespace = true;
            } else if scale_agent_crds::v1alpha1::is_dns1123_label(value) {
                grants.namespaces.insert(value.to_owned());
            } else {
                return Err(format!(
                    "--grantable-namespaces: {value:?} is not a namespace name (a lowercase DNS \
                     label) nor '*'"
                ));
            }
        }
        for value in service_accounts
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
        {
            let parsed = value.split_once('/').filter(|(namespace, name)| {
                scale_agent_crds::v1alpha1::is_dns1123_label(namespace)
                    && (*name == "*" || is_service_account_name(name))
            });
            let Some((namespace, name)) = parsed else {
                return Err(format!(
                    "--impersonable-service-accounts: {value:?} is not namespace/name or \
                     namespace/*"
                ));
            };
            grants
                .service_accounts
                .insert((namespace.to_owned(), name.to_owned()));
        }
        Ok(grants)
    }

    /// Grants everywhere but the reserved namespaces (the library's tests; the command's
    /// default is [`Grants::default`], the ScaleAgent's own namespace only).
    pub fn every_namespace() -> Self {
        Self {
            every_namespace: true,
            ..Self::default()
        }
    }

    /// Whether `namespace` is the control plane's or the operator's own.
    pub fn is_reserved(&self, namespace: &str) -> bool {
        RESERVED_NAMESPACES.contains(&namespace)
            || self.operator_namespace.as_deref() == Some(namespace)
    }

    /// Whether a ScaleAgent in `own` may be given a Role in `namespace`: one named in
    /// `--grantable-namespaces`; else, outside the reserved namespaces, its own namespace, or
    /// any with `*`.
    pub fn namespace_grantable(&self, own: &str, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
            || (!self.is_reserved(namespace) && (namespace == own || self.every_namespace))
    }

    /// Whether an AgentAccount in `own` may impersonate ServiceAccount `namespace/name`: one
    /// named (or whose namespace is named with `/*`) in `--impersonable-service-accounts`;
    /// else one of its own namespace, outside the reserved namespaces (namespace `edit`
    /// already lets its users impersonate those).
    pub fn impersonable(&self, own: &str, namespace: &str, name: &str) -> bool {
        let listed = |n: &str| {
            self.service_accounts
                .contains(&(namespace.to_owned(), n.to_owned()))
        };
        listed(name) || listed("*") || (namespace == own && !self.is_reserved(namespace))
    }

    /// The problem of a ScaleAgent in `own` whose `spec.scope.namespaces` names `refused`.
    pub fn namespace_refusal(&self, own: &str, refused: &[&str]) -> Problem {
        Problem {
            // troubleshooting: ScaleAgent `Degraded=True`
            // The operator gives agents Roles only in the namespaces of its
            // `--grantable-namespaces` (and its own); the control plane's namespaces never unless
            // named.
            reason: "NamespaceNotGrantable",
            message: format!(
                "spec.scope.namespaces names {}, where this operator grants no Roles ({}; never \
                 in kube-system, kube-public, kube-node-lease{} unless named): the agent has no \
                 rights there. Remove {} from spec.scope.namespaces, or ask a cluster \
                 administrator to add {} to the operator's --grantable-namespaces (Helm: \
                 operator.grantableNamespaces)",
                refused.join(", "),
                self.describe_namespaces(own),
                self.operator_namespace
                    .as_deref()
                    .map(|n| format!(" or the operator's namespace {n}"))
                    .unwrap_or_default(),
                if refused.len() == 1 { "it" } else { "them" },
                if refused.len() == 1 { "it" } else { "them" },
            ),
        }
    }

    /// The message of an AgentAccount in `own` that names a ServiceAccount it may not
    /// impersonate.
    pub fn impersonation_refusal(&self, own: &str, namespace: &str, name: &str) -> String {
        let listed: Vec<String> = self
            .service_accounts
            .iter()
            .map(|(n, s)| format!("{n}/{s}"))
            .collect();
        format!(
            "spec.impersonateServiceAccount names {namespace}/{name}, which this operator does \
             not let agents impersonate (allowed: ServiceAccounts of this namespace {own}{}{}): \
             name a ServiceAccount of namespace {own}, or ask a cluster administrator to add \
             {namespace}/{name} to the operator's --impersonable-service-accounts (Helm: \
             operator.impersonableServiceAccounts)",
            if self.is_reserved(own) {
                " (none: it is reserved)"
            } else {
                ""
            },
            if listed.is_empty() {
                String::new()
            } else {
                format!(" and {}", listed.join(", "))
            }
        )
    }

    fn describe_namespaces(&self, own: &str) -> String {
        let mut allowed = Vec::new();
        if !self.is_reserved(own) {
            allowed.push(format!("the ScaleAgent's own namespace {own}"));
        }
        if self.every_namespace {
            allowed.push("every other namespace ('*')".to_owned());
        }
        if !self.namespaces.is_empty() {
            let names: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
            allowed.push(format!("--grantable-namespaces {}", names.join(", ")));
        }
        if allowed.is_empty() {
            "it grants Roles nowhere".to_owned()
        } else {
            format!("it grants them in {}", allowed.join(" and "))
        }
    }
}

/// A ServiceAccount name: a DNS subdomain.
fn is_service_account_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(scale_agent_crds::v1alpha1::is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn watch_namespaces_parse_and_refuse_with_a_way_out() {
        assert_eq!(
            WatchNamespaces::parse(&strings(&["*"])),
            Ok(WatchNamespaces::All)
        );
        let only = WatchNamespaces::parse(&strings(&["team-b", " team-a", ""])).unwrap();
        assert!(only.contains("team-a") && only.contains("team-b"));
        assert!(!only.contains("default"));
        assert_eq!(only.to_string(), "team-a, team-b");
        let message = only.refusal("ScaleAgent", "rogue");
        assert!(
            message.contains("only in [team-a, team-b]")
                && message.contains("add rogue to the operator's --watch-namespaces"),
            "{message}"
        );
        for bad in [&["*", "team-a"][..], &[""], &["Team_A"]] {
            let err = WatchNamespaces::parse(&strings(bad)).unwrap_err();
            assert!(err.contains("--watch-namespaces"), "{err}");
        }
    }

    #[test]
    fn images_must_come_from_an_allowed_repository_or_prefix() {
        let defaults = default_image_prefixes();
        assert!(image_allowed(
            scale_agent_crds::v1alpha1::DEFAULT_AGENT_IMAGE,
            &defaults
        ));
        assert!(image_allowed(
            "ghcr.io/scale-agent/agent@sha256:0123",
            &defaults
        ));
        assert!(!image_allowed(
            "ghcr.io/scale-agent/agent-fork:v1",
            &defaults
        ));
        assert!(!image_allowed("evil.example/agent:v1", &defaults));
        assert!(!image_allowed("ghcr.io/scale-agent/agent", &defaults));
        let team = strings(&["registry.example.com/platform/"]);
        assert!(image_allowed(
            "registry.example.com/platform/agent:v2",
            &team
        ));
        assert!(!image_allowed(
            "registry.example.com/platformx/agent:v2",
            &team
        ));
        let problem = check_image("evil.example/agent:v1", &defaults).unwrap();
        assert_eq!(problem.reason, "ImageNotAllowed");
        assert!(
            problem.message.contains("ghcr.io/scale-agent/agent")
                && problem.message.contains("--allowed-image-prefixes"),
            "{}",
            problem.message
        );
        assert!(check_image("ghcr.io/scale-agent/agent:v9", &defaults).is_none());
    }

    #[test]
    fn grants_reach_the_own_namespace_and_listed_ones_never_reserved_ones_unless_named() {
        let default = Grants {
            operator_namespace: Some("scale-agent".into()),
            ..Grants::default()
        };
        assert!(default.namespace_grantable("team-a", "team-a"));
        assert!(!default.namespace_grantable("team-a", "team-b"));
        assert!(!default.namespace_grantable("team-a", "kube-system"));
        assert!(!default.namespace_grantable("scale-agent", "scale-agent"));
        let every = Grants::parse(&strings(&["*"]), &[], Some("scale-agent".into())).unwrap();
        assert!(every.namespace_grantable("team-a", "team-b"));
        assert!(!every.namespace_grantable("team-a", "kube-system"));
        assert!(!every.namespace_grantable("team-a", "scale-agent"));
        let listed = Grants::parse(
            &strings(&["team-b", "kube-system"]),
            &[],
            Some("scale-agent".into()),
        )
        .unwrap();
        assert!(listed.namespace_grantable("scale-agent", "team-b"));
        assert!(listed.namespace_grantable("team-a", "kube-system"));
        assert!(!listed.namespace_grantable("team-a", "team-c"));
        let problem = default.namespace_refusal("team-a", &["kube-system"]);
        assert_eq!(problem.reason, "NamespaceNotGrantable");
        assert!(
            problem
                .message
                .contains("spec.scope.namespaces names kube-system")
                && problem.message.contains("own namespace team-a")
                && problem.message.contains("operator's namespace scale-agent")
                && problem.message.contains("--grantable-namespaces"),
            "{}",
            problem.message
        );
        for bad in [&["Team_A"][..], &["a/b"]] {
            assert!(Grants::parse(&strings(bad), &[], None).is_err());
        }
    }

    #[test]
    fn impersonation_reaches_the_own_namespace_and_listed_service_accounts() {
        let grants = Grants::parse(
            &[],
            &strings(&["ci/deployer", "tools/*"]),
            Some("scale-agent".into()),
        )
        .unwrap();
        assert!(grants.impersonable("team-a", "team-a", "spinnaker"));
        assert!(!grants.impersonable("team-a", "kube-system", "replicaset-controller"));
        assert!(!grants.impersonable("team-a", "team-b", "spinnaker"));
        assert!(grants.impersonable("team-a", "ci", "deployer"));
        assert!(!grants.impersonable("team-a", "ci", "admin"));
        assert!(grants.impersonable("team-a", "tools", "anything"));
        assert!(!grants.impersonable("scale-agent", "scale-agent", "operator"));
        let message =
            grants.impersonation_refusal("team-a", "kube-system", "replicaset-controller");
        assert!(
            message.contains("names kube-system/replicaset-controller")
                && message.contains("ci/deployer, tools/*")
                && message.contains("--impersonable-service-accounts"),
            "{message}"
        );
        for bad in [&["ci"][..], &["ci/"], &["/x"], &["Ci/x"]] {
            assert!(Grants::parse(&[], &strings(bad), None).is_err(), "{bad:?}");
        }
    }
}
