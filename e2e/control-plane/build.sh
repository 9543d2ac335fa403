#!/usr/bin/env bash
# Builds the local Kubernetes control plane that Scale Agent's tests and demo run on, from Go
# modules through the module proxy (no Docker, no release downloads):
#   - etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, and the node
#     components kubelet and kube-proxy (the real-node tests), at the version pinned in
#     ./kubernetes-version (the only place it is written), linked into one multi-call binary
#     (testbins/main.go) with one symlink per component; metrics-server at ./metrics-server-version
#     is a command of the same binary (the metrics.k8s.io API on the real node), compiled
#     against the pinned release's libraries;
#   - KWOK at ./kwok-version (fake nodes that run pods: Running, Ready, logs), plus its default
#     node and pod stages and its Logs CRD copied from the same module into bin/kwok-config/;
#   - the older kubectl clients listed in ./kubectl-client-versions (Spinnaker's Clouddriver
#     ships kubectl 1.22 to 1.29), installed as kubectl-1.<minor> (kubectl-clients/*/main.go);
#   - Helm at ./helm-version (to render the chart in tests);
#   - an older kube-apiserver, kube-controller-manager and kube-scheduler (for KWOK) at
#     ./older-kubernetes-version
#     (older-apiserver/main.go; a target cluster still in a major cloud's support window), in
#     control-plane/<that version>/bin with a stamp of its own, so the main build and this
#     one are rebuilt independently.
#
# Everything lands in
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/control-plane/<version>/bin
# outside the repository, and is rebuilt only when a pinned version or one of this build's
# inputs changes (Go's build cache makes a rebuild of unchanged parts quick: 15 to 30 s).
#
# Cold, on 2 cores: about 6 min for the multi-call binary (kubelet and kube-proxy add about
# 1 min with the rest of it in Go's build cache), 1 to 1.5 min for kwok, 1 to
# 2.5 min per old kubectl (depending on what else runs), 2 min for Helm; the older API server
# (2,253 packages) took 13.5 min of CPU (user and system) from an empty Go build cache, 40 min
# on the clock while eight other builds shared the two cores.
#
# Usage: e2e/control-plane/build.sh [--print-bin-dir | --print-older-bin-dir] [--force]
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
kwok_version=$(tr -d '[:space:]' <"$here/kwok-version")
helm_version=$(tr -d '[:space:]' <"$here/helm-version")
metrics_server_version=$(tr -d '[:space:]' <"$here/metrics-server-version")
older_version=$(tr -d '[:space:]' <"$here/older-kubernetes-version")
if [[ ! $older_version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "build.sh: $here/older-kubernetes-version must hold a release like v1.32.13, not '$older_version'" >&2
  exit 2
fi
mapfile -t kubectl_clients < <(grep -o 'v1\.[0-9]*\.[0-9]*' "$here/kubectl-client-versions")

cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
out=$cache_root/control-plane/$version
bin=$out/bin
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy metrics-server)

older_bin=$cache_root/control-plane/$older_version/bin
if [[ ${1:-} == --print-bin-dir ]]; then
  echo "$bin"
  exit 0
fi
if [[ ${1:-} == --print-older-bin-dir ]]; then
  echo "$older_bin"
  exit 0
fi

require_go() {
  if ! command -v go >/dev/null; then
    echo "build.sh: Go is needed to build the control plane (any Go >= 1.21 fetches the exact toolchain Kubernetes $version names)." >&2
    exit 1
  fi
}

started=$SECONDS
step() { printf '[control-plane %s] %4ds  %s\n' "$version" $((SECONDS - started)) "$*"; }

# A field of `go mod download -json <module@version>`: "Dir" (the module's directory in the
# module cache) or "GoMod" (its go.mod file). Run outside any module, so no go.mod or go.sum
# is touched.
module_field() {
  (cd "$out" && GOFLAGS= go mod download -json "$1") | sed -n 's/^[[:space:]]*"'"$2"'": "\(.*\)",*$/\1/p'
}

# Resolves the module graph (`go mod tidy`) and downloads every module the build needs,
# printing a line per 50 modules downloaded instead of one per module.
fetch_modules() {
  { go mod tidy && go list -deps . >/dev/null; } 2>&1 | awk -v version="$version" '
    /^go: downloading/ { n++; if (n % 50 == 0) { printf "[control-plane %s]        downloaded %d modules\n", version, n; fflush() } next }
    { print }
  '
}

# `go build -v` names each package as it is compiled (cached ones are not named), which
# drives a coarse progress line instead of thousands of package names.
# Usage: build_with_progress <output> <ldflags> [<how long it takes>], in the module's
# directory.
build_with_progress() {
  local output=$1 ldflags=$2 total
  total=$(go list -deps . | wc -l)
  step "compiling $total packages${3:+ ($3)}"
  if ! go build -v -trimpath -ldflags "$ldflags" -o "$output.tmp" . 2>&1 |
    awk -v total="$total" -v version="$version" '
      # Compiler diagnostics: a "# package" header and "file.go:line:col: message" lines.
      /^# / || /\.go:[0-9]+/ { print; next }
      { n++; if (n % 250 == 0) { printf "[control-plane %s]        compiled %d of at most %d packages\n", version, n, total; fflush() } }
    '; then
    echo "build.sh: go build failed (output above)" >&2
    exit 1
  fi
  mv "$output.tmp" "$output"
}

# Version variables kubectl and the components print, for a build outside Kubernetes' tree.
# Usage: version_ldflags v1.X.Y
version_ldflags() {
  local v=$1 m=${1#v1.}
  m=${m%%.*}
  local flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$m"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local
# directories, which do not exist in the published module; a consumer has to replace each
# with its published v0.<minor>.<patch>. The list is read from the tree itself, so staging
# modules added in later releases need no edit here.
# Usage: staging_replaces <k8s.io/kubernetes go.mod> v0.<minor>.<patch>
staging_replaces() {
  echo "replace ("
  sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*$|	\1 => \1 '"$2"'|p' "$1"
  echo ")"
}

# The older API server (older-apiserver/main.go) at ./older-kubernetes-version, in a module
# of its own (its dependency graph is that release's) and a subshell of its own (it sets the
# Go toolchain that release names). Its stamp covers its inputs and this function's text.
build_older() {
  local version=$older_version out=$cache_root/control-plane/$older_version bin=$older_bin
  step "building kube-apiserver, kube-controller-manager and kube-scheduler $version into $bin"
  export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
  mkdir -p "$bin" "$out/src/kube-older"
  local kube_dir kube_gomod
  kube_dir=$(module_field "k8s.io/kubernetes@$version" Dir)
  kube_gomod=$(module_field "k8s.io/kubernetes@$version" GoMod)
  [[ -d $kube_dir && -f $kube_gomod ]] || { echo "build.sh: could not download k8s.io/kubernetes@$version" >&2; exit 1; }
  export GOTOOLCHAIN="go$(tr -d '[:space:]' <"$kube_dir/.go-version")"
  step "using $(go version)"
  cp "$here/older-apiserver/main.go" "$out/src/kube-older/main.go"
  {
    echo "module scale-agent.invalid/kube-older"
    echo
    sed -n 's/^go \(.*\)$/go \1/p' "$kube_gomod"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    staging_replaces "$kube_gomod" "v0.${version#v1.}"
  } >"$out/src/kube-older/go.mod"
  cd "$out/src/kube-older"
  # A module proxy may lack a staging module at this exact patch release (proxy.golang.org
  # answered 403 for k8s.io/endpointslice@v0.32.13, which kube-controller-manager imports):
  # take the newest patch of the same minor it has. The patch releases of one minor change
  # no API between staging modules.
  local module wanted=v0.${version#v1.} newest
  for module in $(sed -n 's|^	\(k8s.io/[a-z0-9-]*\) => .*|\1|p' go.mod); do
    if ! (cd "$out" && GOFLAGS= go mod download "$module@$wanted" 2>/dev/null); then
      # None at all (k8s.io/sample-cli-plugin): left as it is; nothing imports it, and if
      # something did, go mod tidy below would name it.
      newest=$( (go list -m -versions "$module" 2>/dev/null || true) | tr ' ' '\n' | grep "^${wanted%.*}\." | sort -t. -k3 -n | tail -1 || true)
      [[ -n $newest ]] || continue
      step "$module@$wanted is not on the module proxy: using $newest"
      sed -i "s|^	$module => $module $wanted\$|	$module => $module $newest|" go.mod
    fi
  done
  step "resolving the module graph and downloading modules (go mod tidy)"
  fetch_modules
  build_with_progress "$bin/kube-older" "$(version_ldflags "$version")" \
    "about 13.5 min of CPU from an empty Go build cache"
  local c
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    ln -sfn kube-older "$bin/$c"
  done
  step "done: $("$bin/kube-apiserver" --version 2>&1) in $bin"
}

older_stamp=$( (cat "$here/older-kubernetes-version" "$here/older-apiserver/main.go"; declare -f build_older staging_replaces build_with_progress fetch_modules) | sha256sum | cut -c1-16)
if [[ ${1:-} != --force && -f $older_bin/.stamp && $(cat "$older_bin/.stamp") == "$older_stamp" ]]; then
  echo "control plane $older_version (older API server): cached in $older_bin"
else
  require_go
  (build_older)
  echo "$older_stamp" >"$older_bin/.stamp"
fi

# The stamp covers everything the binaries are made from, so editing a main.go, a pinned
# version or this script rebuilds, and an interrupted build (no stamp) is never mistaken for
# a finished one.
stamp=$(cat "$here/kubernetes-version" "$here/helm-version" "$here/kwok-version" \
  "$here/kubectl-client-versions" "$here/metrics-server-version" "$here/testbins/main.go" "$here"/kubectl-clients/*/main.go \
  "$here/build.sh" | sha256sum | cut -c1-16)
if [[ ${1:-} != --force && -f $bin/.stamp && $(cat "$bin/.stamp") == "$stamp" ]]; then
  echo "control plane $version: cached in $bin"
  exit 0
fi
require_go

step "building ${components[*]}, kwok $kwok_version, kubectl ${kubectl_clients[*]} and helm $helm_version into $bin"
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local

mkdir -p "$bin"
step "fetching k8s.io/kubernetes@$version from the module proxy"
kube_dir=$(module_field "k8s.io/kubernetes@$version" Dir)
kube_gomod=$(module_field "k8s.io/kubernetes@$version" GoMod)
[[ -d $kube_dir && -f $kube_gomod ]] || { echo "build.sh: could not download k8s.io/kubernetes@$version" >&2; exit 1; }

# Build with exactly the Go release the Kubernetes tree names: a newer Go changes
# encoding/json defaults and breaks the apiserver's OpenAPI endpoint. When the local Go
# differs, the go command fetches that toolchain as a module through the same proxy.
go_version=$(tr -d '[:space:]' <"$kube_dir/.go-version")
export GOTOOLCHAIN="go$go_version"
step "using Go $go_version ($(go version))"

src=$out/src
rm -rf "$src"
mkdir -p "$src/testbins"
cp "$here/testbins/main.go" "$src/testbins/main.go"

# k8s.io/kubernetes names its staging modules at v0.0.0 (staging_replaces above).
{
  echo "module scale-agent.invalid/kube-testbins"
  echo
  sed -n 's/^go \(.*\)$/go \1/p' "$kube_gomod"
  echo
  echo "require ("
  echo "	k8s.io/kubernetes $version"
  # Pinned: go mod tidy would otherwise take the newest release.
  echo "	sigs.k8s.io/metrics-server $metrics_server_version"
  echo ")"
  echo
  staging_replaces "$kube_gomod" "$staging_version"
} >"$src/testbins/go.mod"

cd "$src/testbins"
step "resolving the module graph and downloading modules (go mod tidy)"
fetch_modules
build_with_progress "$bin/kube-testbins" "$(version_ldflags "$version")" \
  "about 6 min on 2 cores from an empty Go build cache; peak memory about 2 GB"
for c in "${components[@]}"; do
  ln -sfn kube-testbins "$bin/$c"
done

# KWOK's module has no replace directives, so plain `go install` builds it. It brings its own
# (older) Kubernetes client libraries, so it is a separate binary rather than a component of
# kube-testbins: putting it in that module graph would move the apiserver's dependencies.
step "building kwok $kwok_version (go install sigs.k8s.io/kwok/cmd/kwok; 1 to 1.5 min cold)"
(cd "$out" && GOFLAGS= GOBIN="$bin" go install -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version" \
  "sigs.k8s.io/kwok/cmd/kwok@$kwok_version")
# The kwok binary has no built-in stages (kwokctl normally writes them into its config): take
# the default ones, and the Logs CRD for per-pod logs, from the same module version.
kwok_dir=$(module_field "sigs.k8s.io/kwok@$kwok_version" Dir)
mkdir -p "$bin/kwok-config"
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
  pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  echo "---"
  cat "$kwok_dir/kustomize/stage/$stage.yaml"
done >"$bin/kwok-config/stages.yaml"
# install, not cp: files in the module cache are read-only, and a copy would keep that mode.
install -m 0644 "$kwok_dir/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml" "$bin/kwok-config/logs-crd.yaml"

# Older kubectl clients: each a tiny main in a module of its own that requires
# k8s.io/kubectl at the matching v0.<minor>.<patch>; the published staging modules name
# their dependencies at consistent versions, so no replace directives are needed.
for client in "${kubectl_clients[@]}"; do
  client_minor=${client#v1.}
  client_minor=${client_minor%%.*}
  name=kubectl-1.$client_minor
  step "building kubectl $client ($name; 1 to 2.5 min cold)"
  mkdir -p "$src/$name"
  cp "$here/kubectl-clients/1.$client_minor/main.go" "$src/$name/main.go"
  kubectl_gomod=$(module_field "k8s.io/kubectl@v0.${client#v1.}" GoMod)
  {
    echo "module scale-agent.invalid/$name"
    echo
    sed -n 's/^go \(.*\)$/go \1/p' "$kubectl_gomod"
    echo
    echo "require k8s.io/kubectl v0.${client#v1.}"
  } >"$src/$name/go.mod"
  cd "$src/$name"
  fetch_modules
  build_with_progress "$bin/$name" "$(version_ldflags "$client")"
done

# Helm's module has no replace directives, so plain `go install` builds it (about 2 min cold).
step "building helm $helm_version (go install helm.sh/helm/v3/cmd/helm)"
(cd "$out" && GOFLAGS= GOBIN="$bin" go install "helm.sh/helm/v3/cmd/helm@$helm_version")

echo "$stamp" >"$bin/.stamp"
step "done: $("$bin/kube-apiserver" --version 2>&1), $("$bin/kwok" --version 2>&1), binaries in $bin"
