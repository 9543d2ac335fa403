#!/usr/bin/env bash
# Assembles a Scale Agent container image from one binary, with no container engine and no
# base image: the files the binary needs, then an OCI image layout written by hand (one
# gzip'd tar layer, a config, a manifest, index.json), which `skopeo copy oci:DIR:TAG
# docker://REGISTRY/...` pushes and any OCI runtime tooling reads.
#
# The image holds, and nothing else:
#   /usr/local/bin/NAME                    the binary (the entrypoint), stripped
#   /lib/..., /lib64/ld-linux-*.so.*       the C runtime the binary links (from `ldd`)
#   /etc/ssl/certs/ca-certificates.crt     CA certificates (the build machine's bundle)
#   /etc/passwd, /etc/group                the non-root user nonroot (65532:65532)
#   /etc/nsswitch.conf                     hosts from files, then DNS
#   /tmp                                   mode 1777 (mount an emptyDir there: the root is read-only)
#
# Usage:
#   images/image.sh rootfs BINARY NAME DIR
#       writes the file tree into DIR (the Dockerfile's build stage runs this, so both
#       builds give the same files)
#   images/image.sh layout BINARY NAME OUT [VERSION] [REVISION]
#       writes the OCI image layout OUT, tagged vVERSION (default: the workspace version;
#       REVISION default: git HEAD). Deterministic: the same inputs give the same digests.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source_url=https://github.com/scale-agent/scale-agent
user_id=65532

die() { echo "image.sh: $*" >&2; exit 1; }

workspace_version() {
  sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$repo_root/Cargo.toml"
}

# rootfs BINARY NAME DIR
rootfs() {
  local binary=$1 name=$2 dir=$3
  [[ -x $binary ]] || die "no executable at $binary (build it first)"
  rm -rf "$dir"
  mkdir -p "$dir/usr/local/bin" "$dir/etc/ssl/certs" "$dir/tmp"
  chmod 1777 "$dir/tmp"
  cp "$binary" "$dir/usr/local/bin/$name"
  strip "$dir/usr/local/bin/$name"
  chmod 0755 "$dir/usr/local/bin/$name"

  # The C runtime: every library ldd resolves, at the path it resolves to, and the dynamic
  # loader at the path the binary names (its PT_INTERP). Copied dereferenced: the image
  # needs the file, not the host's symlink chain.
  local line lib
  while read -r line; do
    lib=
    if [[ $line =~ =\>\ (/[^ ]+) ]]; then
      lib=${BASH_REMATCH[1]}
    elif [[ $line =~ ^(/[^ ]+)\ \( ]]; then
      lib=${BASH_REMATCH[1]}
    fi
    [[ -n $lib ]] || continue
    mkdir -p "$dir$(dirname "$lib")"
    cp -L "$lib" "$dir$lib"
    chmod 0755 "$dir$lib"
  done < <(ldd "$binary" 2>/dev/null || true)

  [[ -f /etc/ssl/certs/ca-certificates.crt ]] || die "no /etc/ssl/certs/ca-certificates.crt (install ca-certificates)"
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
  chmod 0644 "$dir/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n' \
    "$user_id" "$user_id" >"$dir/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%d:\n' "$user_id" >"$dir/etc/group"
  printf 'hosts: files dns\n' >"$dir/etc/nsswitch.conf"
  chmod 0644 "$dir/etc/passwd" "$dir/etc/group" "$dir/etc/nsswitch.conf"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# Moves FILE into OUT/blobs/sha256/<digest> and prints the digest.
add_blob() {
  local file=$1 out=$2 digest
  digest=$(sha256_of "$file")
  mv "$file" "$out/blobs/sha256/$digest"
  echo "$digest"
}

# layout BINARY NAME OUT [VERSION] [REVISION]
layout() {
  local binary=$1 name=$2 out=$3
  local version=${4:-$(workspace_version)}
  local revision=${5:-$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)}
  [[ -n $version ]] || die "no version in $repo_root/Cargo.toml [workspace.package]"
  local work
  work=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  rootfs "$binary" "$name" "$work/rootfs"

  rm -rf "$out"
  mkdir -p "$out/blobs/sha256"
  # A reproducible tar: sorted names, one mtime, numeric root ownership, no atime/ctime.
  tar -C "$work/rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$work/layer.tar" .
  local diff_id layer_digest layer_size
  diff_id=$(sha256_of "$work/layer.tar")
  gzip -n -"${SCALE_AGENT_IMAGE_GZIP_LEVEL:-9}" "$work/layer.tar"
  layer_size=$(size_of "$work/layer.tar.gz")
  layer_digest=$(add_blob "$work/layer.tar.gz" "$out")

  local labels
  labels=$(printf '"org.opencontainers.image.title":"%s","org.opencontainers.image.version":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.source":"%s","org.opencontainers.image.licenses":"Apache-2.0"' \
    "$name" "$version" "$revision" "$source_url")
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"User":"%d:%d","Entrypoint":["/usr/local/bin/%s"],"Env":["PATH=/usr/local/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"WorkingDir":"/","Labels":{%s}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"images/image.sh layout %s"}]}' \
    "$user_id" "$user_id" "$name" "$labels" "$diff_id" "$name" >"$work/config.json"
  local config_size config_digest
  config_size=$(size_of "$work/config.json")
  config_digest=$(add_blob "$work/config.json" "$out")

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%d}],"annotations":{%s}}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" "$labels" >"$work/manifest.json"
  local manifest_size manifest_digest
  manifest_size=$(size_of "$work/manifest.json")
  manifest_digest=$(add_blob "$work/manifest.json" "$out")

  printf '{"imageLayoutVersion":"1.0.0"}' >"$out/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"org.opencontainers.image.ref.name":"v%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$version" >"$out/index.json"
  echo "$out:v$version sha256:$manifest_digest (layer $((layer_size / 1024)) KiB compressed)"
}

case ${1:-} in
  rootfs) [[ $# -eq 4 ]] || die "usage: image.sh rootfs BINARY NAME DIR"; rootfs "$2" "$3" "$4" ;;
  layout) [[ $# -ge 4 && $# -le 6 ]] || die "usage: image.sh layout BINARY NAME OUT [VERSION] [REVISION]"; layout "${@:2}" ;;
  *) die "usage: image.sh rootfs BINARY NAME DIR | layout BINARY NAME OUT [VERSION] [REVISION]" ;;
esac
