#!/usr/bin/env bash
# Installs tinyproxy from Debian's packages for the tests of agents behind an egress proxy
# (e2e/tests/egress_proxy.rs), without a system-wide install, into
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/tinyproxy/<version>
# (e2e/debian-package.sh does the download, unpacking and caching). `tinyproxy -v` must run.
# Debian ships the daemon in tinyproxy-bin (tinyproxy itself holds the init scripts and the
# default configuration, which the tests do not use).
#
# Usage: e2e/tinyproxy/install.sh [--print-bin]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../debian-package.sh"

if [[ ${1:-} == --print-bin ]]; then
  echo "$(debian_cache_root)/tinyproxy/current/usr/bin/tinyproxy"
  exit 0
fi

check_tinyproxy() {
  local built
  built=$("$1/usr/bin/tinyproxy" -v 2>&1) || {
    echo "install.sh: the unpacked tinyproxy does not run (missing shared libraries?):" >&2
    echo "$built" >&2
    return 1
  }
  echo "$built"
}

debian_install tinyproxy usr/bin/tinyproxy check_tinyproxy tinyproxy-bin
