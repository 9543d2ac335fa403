#!/usr/bin/env bash
# `make version`: writes the workspace version (`[workspace.package] version` in Cargo.toml,
# the one place it is set) into every file that names a release: the kustomize image tags,
# the chart's version and appVersion, and the Dockerfile's default VERSION. The binaries,
# their build-info metric, the agent's hello, the hub's API, the CRD's default agent image
# and `make images` read it at build time. e2e/tests/version.rs fails when these drift.
#
# Usage: images/stamp-version.sh        (after changing the version in Cargo.toml)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || {
  echo "stamp-version.sh: [workspace.package] version in Cargo.toml is not semver: '$version'" >&2
  exit 1
}

# Replaces the whole line matching PATTERN (an extended regex) in FILE with LINE, and
# fails when no line matches: a silent no-op would let the files drift.
stamp() {
  local file=$1 pattern=$2 line=$3
  grep -Eq "$pattern" "$file" || { echo "stamp-version.sh: no line matching /$pattern/ in $file" >&2; exit 1; }
  sed -E -i "s|$pattern.*|$line|" "$file"
}

for kustomization in manifests/operator/kustomization.yaml manifests/hub/kustomization.yaml \
  manifests/overlays/target-cluster/kustomization.yaml; do
  stamp "$kustomization" '^    newTag: ' "    newTag: v$version"
done
stamp manifests/helm/scale-agent/Chart.yaml '^version: ' "version: $version"
stamp manifests/helm/scale-agent/Chart.yaml '^appVersion: ' "appVersion: \"v$version\""
stamp Dockerfile '^ARG VERSION=' "ARG VERSION=$version"
echo "stamped v$version"
