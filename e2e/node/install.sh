#!/usr/bin/env bash
# The parts of a real Kubernetes node besides kubelet and kube-proxy (which
# e2e/control-plane/build.sh links into the control plane's multi-call binary), for the
# real-node tests (e2e/src/real_node.rs, e2e/tests/real_node.rs):
#   - containerd, runc, the CNI plugins, iptables, conntrack and nft (to remove the tables the
#     node added) from Debian's packages,
#     installed with apt-get (they need root, as the real-node tests do; containerd is not
#     started as a service: the harness starts its own, with its own root and socket);
#   - the sandbox ("pause") image: e2e/node/pause/main.go built static with the Go toolchain
#     and packed with images/image.sh into an OCI layout, since none can be pulled, cached in
#       ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/node/pause
#     and rebuilt only when its source or this script changes.
# Without root it prints why it does nothing and succeeds: the real-node tests then skip.
#
# Usage: e2e/node/install.sh [--print-dir]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$here/../.." && pwd)
cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
out=$cache_root/node

if [[ ${1:-} == --print-dir ]]; then
  echo "$out"
  exit 0
fi

step() { printf '[node] %s\n' "$*"; }

if [[ $(id -u) != 0 ]]; then
  step "not root: skipping containerd, runc and the CNI plugins (the real-node tests need root and skip without it)"
  exit 0
fi

# The programs each package brings; all present means nothing to install.
packages=(containerd runc containernetworking-plugins iptables conntrack nftables)
programs=(/usr/bin/containerd /usr/bin/ctr /usr/sbin/runc /usr/lib/cni/bridge /usr/lib/cni/host-local
  /usr/lib/cni/loopback /usr/lib/cni/portmap /usr/sbin/iptables /usr/sbin/conntrack /usr/sbin/nft)
missing=()
for program in "${programs[@]}"; do
  [[ -x $program ]] || missing+=("$program")
done
if ((${#missing[@]} == 0)); then
  step "containerd $(/usr/bin/containerd --version | awk '{print $3}'), runc, CNI plugins, iptables: installed"
else
  step "missing ${missing[*]}: apt-get install ${packages[*]}"
  if ! apt-cache policy containerd 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    step "the package index does not know containerd: apt-get update"
    apt-get update -qq
  fi
  # No service is started: policy-rc.d refuses (the harness runs its own containerd).
  policy=/usr/sbin/policy-rc.d
  created_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    created_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}" |
    grep -E '^(Setting up|Unpacking) ' | sed 's/^/[node]   /' || true
  [[ -n $created_policy ]] && rm -f "$policy"
  for program in "${programs[@]}"; do
    [[ -x $program ]] || { echo "install.sh: $program is still missing after apt-get install ${packages[*]}" >&2; exit 1; }
  done
  step "installed: $(/usr/bin/containerd --version), $(/usr/sbin/runc --version | head -1)"
fi

stamp=$(cat "$here/pause/main.go" "$here/install.sh" "$repo_root/images/image.sh" | sha256sum | cut -c1-16)
if [[ -f $out/pause/.stamp && $(cat "$out/pause/.stamp") == "$stamp" ]]; then
  step "pause image: cached in $out/pause"
  exit 0
fi
step "building the pause image (go build of e2e/node/pause, images/image.sh layout)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/pause/main.go" "$work/main.go"
printf 'module scale-agent.invalid/pause\n\ngo 1.21\n' >"$work/go.mod"
(cd "$work" && CGO_ENABLED=0 GOFLAGS= go build -trimpath -ldflags '-s -w' -o "$work/pause" .)
rm -rf "$out/pause"
mkdir -p "$out"
"$repo_root/images/image.sh" layout "$work/pause" pause "$out/pause" 3.10 e2e >/dev/null
echo "$stamp" >"$out/pause/.stamp"
step "pause image ready: $out/pause (tag v3.10)"
