#!/usr/bin/env bash
# Installs the Lua 5.1 interpreter from Debian's packages for the test of the Argo CD health
# checks (manifests/argocd): Argo CD runs them with gopher-lua, a Lua 5.1, so the tests use
# the reference Lua 5.1 rather than a newer one. No system-wide install: `apt-get download`
# fetches lua5.1 and liblua5.1-0, `dpkg -x` unpacks both under
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/lua/<version>
# and `lua5.1 -v` must run with LD_LIBRARY_PATH pointing at the unpacked library. Cached: a
# second run with the same candidate version does nothing. The package index is refreshed
# (`apt-get update`) only when it does not know lua5.1.
#
# Usage: e2e/lua/install.sh
set -euo pipefail

cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
current=$cache_root/lua/current

step() { printf '[lua] %s\n' "$*"; }

candidate() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p'; }

version=$(candidate lua5.1)
if [[ -z $version || $version == "(none)" ]]; then
  if [[ -x $current/usr/bin/lua5.1 ]]; then
    step "cached in $current (package index has no lua5.1; keeping the cached one)"
    exit 0
  fi
  step "the package index does not know lua5.1: apt-get update"
  apt-get update -qq
  version=$(candidate lua5.1)
  [[ -n $version && $version != "(none)" ]] || { echo "install.sh: Debian's package index has no lua5.1" >&2; exit 1; }
fi
library_version=$(candidate liblua5.1-0)

out=$cache_root/lua/$version
if [[ -x $out/usr/bin/lua5.1 && -f $out/.verified ]]; then
  ln -sfn "$version" "$current"
  step "lua5.1 $version: cached in $out"
  exit 0
fi

step "downloading lua5.1 $version and liblua5.1-0 $library_version (apt-get download)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q -o APT::Sandbox::User=root "lua5.1=$version" "liblua5.1-0=$library_version" >/dev/null)
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
for deb in "$work"/*.deb; do
  step "unpacking $(basename "$deb") into $out"
  dpkg -x "$deb" "$out.tmp"
done
library_dir=$(dirname "$(find "$out.tmp" -name 'liblua5.1.so.0*' | head -1)")
built=$(LD_LIBRARY_PATH=$library_dir "$out.tmp/usr/bin/lua5.1" -v 2>&1) || {
  echo "install.sh: the unpacked lua5.1 does not run (missing shared libraries?):" >&2
  echo "$built" >&2
  exit 1
}
grep -q "Lua 5.1" <<<"$built" || { echo "install.sh: lua5.1 -v says: $built" >&2; exit 1; }
# The library directory, relative to the version directory, for the tests' LD_LIBRARY_PATH.
echo "${library_dir#"$out.tmp"/}" > "$out.tmp/.library-dir"
touch "$out.tmp/.verified"
rm -rf "$out"
mv "$out.tmp" "$out"
ln -sfn "$version" "$current"
step "lua5.1 $version ready: $out/usr/bin/lua5.1 ($built)"
