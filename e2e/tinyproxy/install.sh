#!/usr/bin/env bash
# Installs tinyproxy from Debian's packages for the tests of agents behind an egress proxy
# (e2e/tests/egress_proxy.rs), without a system-wide install: `apt-get download` fetches the
# tinyproxy-bin package, `dpkg -x` unpacks it under
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/tinyproxy/<version>
# and `tinyproxy -v` must run. Cached: a second run with the same candidate version does
# nothing. The package index is refreshed (`apt-get update`) only when it does not know
# tinyproxy.
#
# Usage: e2e/tinyproxy/install.sh [--print-bin]
set -euo pipefail

cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
current=$cache_root/tinyproxy/current
# Debian ships the daemon in tinyproxy-bin (tinyproxy itself holds the init scripts and the
# default configuration, which the tests do not use).
package=tinyproxy-bin

if [[ ${1:-} == --print-bin ]]; then
  echo "$current/usr/bin/tinyproxy"
  exit 0
fi

step() { printf '[tinyproxy] %s\n' "$*"; }

candidate() { apt-cache policy "$package" 2>/dev/null | sed -n 's/^ *Candidate: *//p'; }

version=$(candidate)
if [[ -z $version || $version == "(none)" ]]; then
  # A stale or empty package index (a fresh machine): refresh it once.
  if [[ -x $current/usr/bin/tinyproxy ]]; then
    step "cached in $current (package index has no $package; keeping the cached one)"
    exit 0
  fi
  step "the package index does not know $package: apt-get update"
  apt-get update -qq
  version=$(candidate)
  [[ -n $version && $version != "(none)" ]] || { echo "install.sh: Debian's package index has no $package" >&2; exit 1; }
fi

out=$cache_root/tinyproxy/$version
if [[ -x $out/usr/bin/tinyproxy && -f $out/.verified ]]; then
  ln -sfn "$version" "$current"
  step "tinyproxy $version: cached in $out"
  exit 0
fi

step "downloading $package $version (apt-get download)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q -o APT::Sandbox::User=root "$package=$version" >/dev/null)
deb=$(ls "$work"/${package}_*.deb)
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
step "unpacking $(basename "$deb") into $out"
dpkg -x "$deb" "$out.tmp"

built=$("$out.tmp/usr/bin/tinyproxy" -v 2>&1) || {
  echo "install.sh: the unpacked tinyproxy does not run (missing shared libraries?):" >&2
  echo "$built" >&2
  exit 1
}
touch "$out.tmp/.verified"
rm -rf "$out"
mv "$out.tmp" "$out"
ln -sfn "$version" "$current"
step "tinyproxy $version ready: $out/usr/bin/tinyproxy ($built)"
