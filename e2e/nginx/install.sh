#!/usr/bin/env bash
# Installs nginx from Debian's packages for the tests of the hub behind a TLS-terminating
# gRPC proxy (hub/tests/grpc_proxy.rs), without a system-wide install: `apt-get download`
# fetches the nginx package, `dpkg -x` unpacks it under
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/nginx/<version>
# and `nginx -V` must show the modules the tests use (ssl, http_v2, grpc). Cached: a second
# run with the same candidate version does nothing. The package index is refreshed
# (`apt-get update`) only when it does not know nginx.
#
# Usage: e2e/nginx/install.sh [--print-bin]
set -euo pipefail

cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
current=$cache_root/nginx/current

if [[ ${1:-} == --print-bin ]]; then
  echo "$current/usr/sbin/nginx"
  exit 0
fi

step() { printf '[nginx] %s\n' "$*"; }

candidate() { apt-cache policy nginx 2>/dev/null | sed -n 's/^ *Candidate: *//p'; }

version=$(candidate)
if [[ -z $version || $version == "(none)" ]]; then
  # A stale or empty package index (a fresh machine): refresh it once.
  if [[ -x $current/usr/sbin/nginx ]]; then
    step "cached in $current (package index has no nginx; keeping the cached one)"
    exit 0
  fi
  step "the package index does not know nginx: apt-get update"
  apt-get update -qq
  version=$(candidate)
  [[ -n $version && $version != "(none)" ]] || { echo "install.sh: Debian's package index has no nginx" >&2; exit 1; }
fi

out=$cache_root/nginx/$version
if [[ -x $out/usr/sbin/nginx && -f $out/.verified ]]; then
  ln -sfn "$version" "$current"
  step "nginx $version: cached in $out"
  exit 0
fi

step "downloading nginx $version (apt-get download)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q -o APT::Sandbox::User=root "nginx=$version" >/dev/null)
deb=$(ls "$work"/nginx_*.deb)
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
step "unpacking $(basename "$deb") into $out"
dpkg -x "$deb" "$out.tmp"

# nginx -V prints its configure arguments on stderr. ssl terminates the agents' TLS,
# http_v2 speaks gRPC's HTTP/2 to them, grpc (built in unless --without-http_grpc_module)
# forwards to the hub.
built=$("$out.tmp/usr/sbin/nginx" -V 2>&1) || {
  echo "install.sh: the unpacked nginx does not run (missing shared libraries?):" >&2
  echo "$built" >&2
  exit 1
}
for module in --with-http_ssl_module --with-http_v2_module; do
  grep -q -- "$module" <<<"$built" || { echo "install.sh: nginx $version lacks $module:" >&2; echo "$built" >&2; exit 1; }
done
if grep -q -- --without-http_grpc_module <<<"$built"; then
  echo "install.sh: nginx $version was built without the grpc module" >&2
  exit 1
fi
touch "$out.tmp/.verified"
rm -rf "$out"
mv "$out.tmp" "$out"
ln -sfn "$version" "$current"
step "nginx $version ready: $out/usr/sbin/nginx ($(head -1 <<<"$built"))"
