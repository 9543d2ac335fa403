#!/usr/bin/env bash
# Installs the Lua 5.1 interpreter from Debian's packages for the test of the Argo CD health
# checks (manifests/argocd): Argo CD runs them with gopher-lua, a Lua 5.1, so the tests use
# the reference Lua 5.1 rather than a newer one. No system-wide install: lua5.1 and
# liblua5.1-0 are unpacked into
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/lua/<version>
# (e2e/debian-package.sh does the download, unpacking and caching), and `lua5.1 -v` must run
# with LD_LIBRARY_PATH pointing at the unpacked library.
#
# Usage: e2e/lua/install.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../debian-package.sh"

check_lua() {
  local tree=$1 library_dir built
  library_dir=$(dirname "$(find "$tree" -name 'liblua5.1.so.0*' | head -1)")
  built=$(LD_LIBRARY_PATH=$library_dir "$tree/usr/bin/lua5.1" -v 2>&1) || {
    echo "install.sh: the unpacked lua5.1 does not run (missing shared libraries?):" >&2
    echo "$built" >&2
    return 1
  }
  grep -q "Lua 5.1" <<<"$built" || { echo "install.sh: lua5.1 -v says: $built" >&2; return 1; }
  # The library directory, relative to the version directory, for the tests' LD_LIBRARY_PATH.
  echo "${library_dir#"$tree"/}" > "$tree/.library-dir"
  echo "$built"
}

debian_install lua usr/bin/lua5.1 check_lua lua5.1 liblua5.1-0
