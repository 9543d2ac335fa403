# Sourced by e2e/{nginx,lua,tinyproxy}/install.sh: installs a tool from Debian's packages for
# the tests, without a system-wide install. `apt-get download` fetches the packages, `dpkg -x`
# unpacks them under
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/<name>/<version>
# (the version is the first package's candidate), the tool's own check must pass, and
# <name>/current points at it. Cached: a second run with the same candidate version does
# nothing. The package index is refreshed (`apt-get update`) only when it does not know the
# first package, and a cached tool is kept when the index cannot be read.

debian_cache_root() { echo "${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}"; }

debian_candidate() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p'; }

# debian_install NAME BINARY CHECK PACKAGE...
#   NAME     the cache folder and the prefix of the progress lines
#   BINARY   the program inside the unpacked tree, e.g. usr/sbin/nginx
#   CHECK    a function called as `CHECK <unpacked tree>` before the tree is put in place: it
#            fails (saying why on stderr) to refuse the packages, and prints one line for
#            the log on stdout
#   PACKAGE  the Debian packages; the first one's version names the cache folder
debian_install() {
  local name=$1 binary=$2 check=$3
  shift 3
  local main=$1 cache_root current version out work deb description
  cache_root=$(debian_cache_root)
  current=$cache_root/$name/current
  step() { printf '[%s] %s\n' "$name" "$*"; }

  version=$(debian_candidate "$main")
  if [[ -z $version || $version == "(none)" ]]; then
    # A stale or empty package index (a fresh machine): refresh it once.
    if [[ -x $current/$binary ]]; then
      step "cached in $current (package index has no $main; keeping the cached one)"
      return 0
    fi
    step "the package index does not know $main: apt-get update"
    apt-get update -qq
    version=$(debian_candidate "$main")
    [[ -n $version && $version != "(none)" ]] || { echo "install.sh: Debian's package index has no $main" >&2; return 1; }
  fi

  out=$cache_root/$name/$version
  if [[ -x $out/$binary && -f $out/.verified ]]; then
    ln -sfn "$version" "$current"
    step "$main $version: cached in $out"
    return 0
  fi

  local pinned=() package
  for package in "$@"; do
    pinned+=("$package=$(debian_candidate "$package")")
  done
  step "downloading ${pinned[*]} (apt-get download)"
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$work'" EXIT
  (cd "$work" && apt-get download -q -o APT::Sandbox::User=root "${pinned[@]}" >/dev/null)
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  for deb in "$work"/*.deb; do
    step "unpacking $(basename "$deb") into $out"
    dpkg -x "$deb" "$out.tmp"
  done
  description=$("$check" "$out.tmp")
  touch "$out.tmp/.verified"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  ln -sfn "$version" "$current"
  step "$main $version ready: $out/$binary ($description)"
}
