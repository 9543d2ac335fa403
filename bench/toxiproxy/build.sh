#!/usr/bin/env bash
# Builds Toxiproxy's server (github.com/Shopify/toxiproxy/v2/cmd/server), the latency proxy the
# benchmark puts on loopback in front of the API server and the hub's gRPC port to add round-
# trip time (this machine's kernel has no netem qdisc). Built from Go modules through the
# module proxy, like e2e/control-plane/build.sh (no Docker, no release downloads), at the
# version pinned in ./toxiproxy-version, into
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/toxiproxy/<version>/bin
# outside the repository; rebuilt only when the version or this script changes.
# Cold, on 2 cores: about 10 to 40 s (a dozen small modules). The benchmark drives the server
# through its HTTP API, so the CLI is not built.
#
# Usage: bench/toxiproxy/build.sh [--print-bin-dir] [--force]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(tr -d '[:space:]' <"$here/toxiproxy-version")
if [[ ! $version =~ ^v2\.[0-9]+\.[0-9]+$ ]]; then
  echo "build.sh: $here/toxiproxy-version must hold a v2 release like v2.5.0, not '$version'" >&2
  exit 2
fi
cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
out=$cache_root/toxiproxy/$version
bin=$out/bin

if [[ ${1:-} == --print-bin-dir ]]; then
  echo "$bin"
  exit 0
fi

# The stamp covers the version and this script, so an interrupted build (no stamp) is never
# mistaken for a finished one.
stamp=$(cat "$here/toxiproxy-version" "$here/build.sh" | sha256sum | cut -c1-16)
if [[ ${1:-} != --force && -f $bin/.stamp && $(cat "$bin/.stamp") == "$stamp" ]]; then
  echo "toxiproxy $version: cached in $bin"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "build.sh: Go (>= 1.17) is needed to build Toxiproxy for the benchmark's latency rows." >&2
  exit 1
fi

started=$SECONDS
step() { printf '[toxiproxy %s] %4ds  %s\n' "$version" $((SECONDS - started)) "$*"; }

mkdir -p "$bin"
module=github.com/Shopify/toxiproxy/v2
step "fetching $module@$version from the module proxy"
# Outside any module, so no go.mod or go.sum is touched; `go install pkg@version` resolves
# the module's own go.mod.
(cd "$out" && GOFLAGS= go mod download "$module@$version")
step "compiling $module/cmd/server (10 to 40 s cold)"
tmp=$out/gobin.tmp
rm -rf "$tmp"
(cd "$out" && GOFLAGS= CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$tmp" go install -trimpath \
  -ldflags "-s -w -X $module.Version=$version" "$module/cmd/server@$version")
mv "$tmp/server" "$bin/toxiproxy-server"
rm -rf "$tmp"

echo "$stamp" >"$bin/.stamp"
step "done: $("$bin/toxiproxy-server" -version 2>&1 | head -1) in $bin"
