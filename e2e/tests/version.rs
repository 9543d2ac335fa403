//! One version everywhere: `[workspace.package] version` in Cargo.toml is what the binaries
//! print; every file that names a release must carry the same one (`make version` writes
//! them), so a release cannot ship manifests or a chart that pull another version's images.

use std::path::{Path, PathBuf};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const FIX: &str =
    "run `make version` (images/stamp-version.sh) after changing the version in Cargo.toml";

fn repo_file(path: &str) -> anyhow::Result<(PathBuf, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("read {}: {e}", path.display()))?;
    Ok((path, text))
}

/// The values of the lines of `text` that start with `key` (after indentation).
fn values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|line| line.trim_start().strip_prefix(key))
        .map(|value| value.trim().trim_matches('"'))
        .collect()
}

#[test]
fn manifests_chart_and_dockerfile_carry_the_workspace_version() -> anyhow::Result<()> {
    let tag = format!("v{VERSION}");
    for kustomization in [
        "manifests/operator/kustomization.yaml",
        "manifests/hub/kustomization.yaml",
        "manifests/overlays/target-cluster/kustomization.yaml",
    ] {
        let (path, text) = repo_file(kustomization)?;
        let tags = values(&text, "newTag:");
        assert!(!tags.is_empty(), "{} pins no image tag", path.display());
        for found in tags {
            assert_eq!(found, tag, "{} pins {found}: {FIX}", path.display());
        }
    }
    let (path, chart) = repo_file("manifests/helm/scale-agent/Chart.yaml")?;
    assert_eq!(
        values(&chart, "version:"),
        [VERSION],
        "{}: {FIX}",
        path.display()
    );
    assert_eq!(
        values(&chart, "appVersion:"),
        [tag.as_str()],
        "{}: {FIX}",
        path.display()
    );
    let (path, dockerfile) = repo_file("Dockerfile")?;
    assert_eq!(
        values(&dockerfile, "ARG VERSION="),
        [VERSION],
        "{}: {FIX}",
        path.display()
    );
    Ok(())
}

#[test]
fn the_default_agent_image_is_this_release() {
    assert_eq!(
        scale_agent_crds::v1alpha1::DEFAULT_AGENT_IMAGE,
        format!("ghcr.io/scale-agent/agent:v{VERSION}")
    );
    assert_eq!(scale_agent_runtime::VERSION, VERSION);
}

#[test]
fn the_changelog_and_readme_name_this_release() -> anyhow::Result<()> {
    let (path, changelog) = repo_file("CHANGELOG.md")?;
    assert!(
        changelog
            .lines()
            .any(|l| l.starts_with(&format!("## [{VERSION}]"))),
        "{} has no `## [{VERSION}]` section: say what this release changes",
        path.display()
    );
    let (path, readme) = repo_file("README.md")?;
    for component in ["operator", "agent", "hub"] {
        let image = format!("ghcr.io/scale-agent/{component}:v{VERSION}");
        assert!(
            readme.contains(&image),
            "{} does not name {image} in its install section",
            path.display()
        );
    }
    Ok(())
}
