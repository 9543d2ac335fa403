#!/usr/bin/env bash
# Builds the local Kubernetes control plane that Scale Agent's tests and demo run on:
# etcd, kube-apiserver, kube-controller-manager and kubectl, from Go modules through the
# module proxy, at the version pinned in ./kubernetes-version (the only place it is written),
# and Helm at the version in ./helm-version (to render the chart in tests).
#
# The result is a multi-call binary plus one symlink per component, and helm, cached outside
# the repository in
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/control-plane/<version>/bin
# and rebuilt only when the version or this build's inputs change.
#
# Usage: e2e/control-plane/build.sh [--print-bin-dir] [--force]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(tr -d '[:space:]' <"$here/kubernetes-version")
if [[ ! $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "build.sh: $here/kubernetes-version must hold a release like v1.37.1, not '$version'" >&2
  exit 2
fi
minor=${BASH_REMATCH[1]}
patch=${BASH_REMATCH[2]}
staging_version="v0.$minor.$patch"

cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
out=$cache_root/control-plane/$version
bin=$out/bin
components=(etcd kube-apiserver kube-controller-manager kubectl)

if [[ ${1:-} == --print-bin-dir ]]; then
  echo "$bin"
  exit 0
fi

# The stamp covers everything the binary is made from, so editing main.go or this script
# rebuilds, and an interrupted build (no stamp) is never mistaken for a finished one.
stamp=$(cat "$here/kubernetes-version" "$here/helm-version" "$here/testbins/main.go" "$here/build.sh" | sha256sum | cut -c1-16)
if [[ ${1:-} != --force && -f $bin/.stamp && $(cat "$bin/.stamp") == "$stamp" ]]; then
  echo "control plane $version: cached in $bin"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "build.sh: Go is needed to build the control plane (any Go >= 1.21 fetches the exact toolchain Kubernetes $version names)." >&2
  exit 1
fi

started=$SECONDS
step() { printf '[control-plane %s] %4ds  %s\n' "$version" $((SECONDS - started)) "$*"; }

step "building etcd, kube-apiserver, kube-controller-manager and kubectl into $bin"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local

step "fetching k8s.io/kubernetes@$version from the module proxy"
kube_dir=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
kube_gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -d $kube_dir && -f $kube_gomod ]] || { echo "build.sh: could not download k8s.io/kubernetes@$version" >&2; exit 1; }

# Build with exactly the Go release the Kubernetes tree names: a newer Go changes
# encoding/json defaults and breaks the apiserver's OpenAPI endpoint. When the local Go
# differs, the go command fetches that toolchain as a module through the same proxy.
go_version=$(tr -d '[:space:]' <"$kube_dir/.go-version")
export GOTOOLCHAIN="go$go_version"
step "using Go $go_version ($(go version))"

src=$out/src
rm -rf "$src"
mkdir -p "$src" "$bin"
cp "$here/testbins/main.go" "$src/main.go"

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local
# directories, which do not exist in the published module; a consumer has to replace each
# with its published v0.<minor>.<patch>. The list is read from the tree itself, so staging
# modules added in later releases need no edit here.
{
  echo "module scale-agent.invalid/kube-testbins"
  echo
  sed -n 's/^go \(.*\)$/go \1/p' "$kube_gomod"
  echo
  echo "require ("
  echo "	k8s.io/kubernetes $version"
  echo ")"
  echo
  echo "replace ("
  sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*$|	\1 => \1 '"$staging_version"'|p' "$kube_gomod"
  echo ")"
} >"$src/go.mod"

cd "$src"
step "resolving the module graph and downloading modules (go mod tidy)"
go mod tidy 2>&1 | awk -v version="$version" '
  /^go: downloading/ { n++; if (n % 50 == 0) { printf "[control-plane %s]        downloaded %d modules\n", version, n; fflush() } next }
  { print }
'
total=$(go list -deps . | wc -l)
step "compiling $total packages (about 5 min on 2 cores from an empty Go build cache; peak memory about 2 GB)"

ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# `go build -v` names each package as it is compiled (cached ones are not named), which
# drives a coarse progress line instead of thousands of package names.
if ! go build -v -trimpath -ldflags "$ldflags" -o "$bin/kube-testbins.tmp" . 2>&1 |
  awk -v total="$total" -v version="$version" '
    # Compiler diagnostics: a "# package" header and "file.go:line:col: message" lines.
    /^# / || /\.go:[0-9]+/ { print; next }
    { n++; if (n % 250 == 0) { printf "[control-plane %s]        compiled %d of at most %d packages\n", version, n, total; fflush() } }
  '; then
  echo "build.sh: go build failed (output above)" >&2
  exit 1
fi
mv "$bin/kube-testbins.tmp" "$bin/kube-testbins"
for c in "${components[@]}"; do
  ln -sfn kube-testbins "$bin/$c"
done

# Helm's module has no replace directives, so plain `go install` builds it (about 2 min cold).
helm_version=$(tr -d '[:space:]' <"$here/helm-version")
step "building helm $helm_version (go install helm.sh/helm/v3/cmd/helm)"
(cd "$out" && GOFLAGS= GOBIN="$bin" go install "helm.sh/helm/v3/cmd/helm@$helm_version")

echo "$stamp" >"$bin/.stamp"
step "done: $("$bin/kube-apiserver" --version 2>&1), binaries in $bin"
