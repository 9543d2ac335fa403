#!/usr/bin/env bash
# `make images`: the release binaries of the operator, the agent and the hub, each made into
# an OCI image layout under target/images/<component> (tag v<workspace version>) by
# images/image.sh. No container engine, no registry. Push one with
#   skopeo copy oci:target/images/hub:v<version> docker://<registry>/scale-agent/hub:v<version>
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
cargo=${CARGO:-cargo}
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}
out=$target_dir/images

step() { printf '[images] %s\n' "$*"; }

step "cargo build --release (operator, agent, hub)"
"$cargo" build --release --locked -p scale-agent-operator -p scale-agent -p scale-agent-hub --bins

mkdir -p "$out"
for component in operator agent hub; do
  case $component in
    agent) binary=scale-agent ;;
    *) binary=scale-agent-$component ;;
  esac
  images/image.sh layout "$target_dir/release/$binary" "$binary" "$out/$component"
done
step "images in $out:"
du -sh "$out"/*
