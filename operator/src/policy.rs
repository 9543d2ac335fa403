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
            "this operator reconciles {kind}s only in [{self}], not in {namespace}: create it \
             in one of those, or add {namespace} to the operator's --watch-namespaces \
             (creating a ScaleAgent is a cluster-administrator act; see the operator's README)"
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
}
