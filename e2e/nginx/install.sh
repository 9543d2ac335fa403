#!/usr/bin/env bash
# Installs nginx from Debian's packages for the tests of the hub behind a TLS-terminating
# gRPC proxy (e2e/tests/grpc_proxy.rs), without a system-wide install, into
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/nginx/<version>
# (e2e/debian-package.sh does the download, unpacking and caching). `nginx -V` must show the
# modules the tests use (ssl, http_v2, grpc).
#
# Usage: e2e/nginx/install.sh [--print-bin]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../debian-package.sh"

if [[ ${1:-} == --print-bin ]]; then
  echo "$(debian_cache_root)/nginx/current/usr/sbin/nginx"
  exit 0
fi

# nginx -V prints its configure arguments on stderr. ssl terminates the agents' TLS,
# http_v2 speaks gRPC's HTTP/2 to them, grpc (built in unless --without-http_grpc_module)
# forwards to the hub.
check_nginx() {
  local built module
  built=$("$1/usr/sbin/nginx" -V 2>&1) || {
    echo "install.sh: the unpacked nginx does not run (missing shared libraries?):" >&2
    echo "$built" >&2
    return 1
  }
  for module in --with-http_ssl_module --with-http_v2_module; do
    grep -q -- "$module" <<<"$built" || { echo "install.sh: nginx lacks $module:" >&2; echo "$built" >&2; return 1; }
  done
  if grep -q -- --without-http_grpc_module <<<"$built"; then
    echo "install.sh: nginx was built without the grpc module" >&2
    return 1
  fi
  head -1 <<<"$built"
}

debian_install nginx usr/sbin/nginx check_nginx nginx
