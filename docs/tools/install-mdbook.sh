#!/usr/bin/env bash
# Installs mdBook (the `mdbook` crate from crates.io, at the version pinned in ./mdbook-version)
# to build the user guide in docs/ (`make book`, and the book test `make test` runs), with
# cargo's ordinary client and the crate's own Cargo.lock (`--locked`), into
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/tools/mdbook/<version>/bin
# outside the repository; rebuilt only when the version or this script changes.
# Only `mdbook build` is needed, so the `serve` and `watch` features (tokio, axum, notify) are
# left out; `search` stays so the offline book has its search box.
# Cold, on 2 cores: 4 min 46 s wall and 2 min 21 s of CPU on 2026-12-07, beside other
# engineers' builds; 12 MB installed.
#
# Usage: docs/tools/install-mdbook.sh [--print-bin] [--force]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(tr -d '[:space:]' <"$here/mdbook-version")
if [[ ! $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "install-mdbook.sh: $here/mdbook-version must hold a release like 0.5.4, not '$version'" >&2
  exit 2
fi
cache_root=${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}
out=$cache_root/tools/mdbook/$version
bin=$out/bin

if [[ ${1:-} == --print-bin ]]; then
  echo "$bin/mdbook"
  exit 0
fi

# The stamp covers the version and this script, so an interrupted build (no stamp) is never
# mistaken for a finished one.
stamp=$(cat "$here/mdbook-version" "$here/install-mdbook.sh" | sha256sum | cut -c1-16)
if [[ ${1:-} != --force && -f $bin/.stamp && $(cat "$bin/.stamp") == "$stamp" ]]; then
  echo "mdbook $version: cached in $bin"
  exit 0
fi

if ! command -v cargo >/dev/null; then
  echo "install-mdbook.sh: cargo is needed to build mdBook $version from crates.io." >&2
  exit 1
fi

started=$SECONDS
step() { printf '[mdbook %s] %4ds  %s\n' "$version" $((SECONDS - started)) "$*"; }

mkdir -p "$out"
# Its own build directory inside the cache (removed afterwards), so neither the workspace's
# target dir nor a CARGO_TARGET_DIR in the environment receives mdBook's build.
build=$out/build.tmp
rm -rf "$build"
step "compiling mdbook $version from crates.io (cargo install --locked; about 115 crates)"
# cargo prints one line per crate; a line per 25 crates compiled keeps the log short (a bash
# loop, not awk: mawk reads a pipe in blocks, so its progress would come all at the end).
compiled=0
status=1
while IFS= read -r line; do
  case $line in
    "cargo-exit "*) status=${line#cargo-exit } ;;
    *Compiling\ *)
      compiled=$((compiled + 1))
      if ((compiled % 25 == 0)); then step "compiled $compiled crates"; fi ;;
    *Downloaded\ * | *Downloading\ * | *Updating\ * | *Locking\ * | *Adding\ * | *Installing\ * | \
      *Installed\ * | *Replacing\ * | *Replaced\ * | *Finished\ * | *Fresh\ * | *"to your PATH"*) ;;
    *) printf '%s\n' "$line" ;;
  esac
done < <(CARGO_INCREMENTAL=0 cargo install mdbook --version "=$version" --locked \
  --no-default-features --features search \
  --root "$out" --target-dir "$build" 2>&1; echo "cargo-exit $?")
rm -rf "$build"
if [[ $status != 0 ]]; then
  echo "install-mdbook.sh: cargo install mdbook $version failed (exit $status); see its output above" >&2
  exit 1
fi

echo "$stamp" >"$bin/.stamp"
step "done: $("$bin/mdbook" --version) in $bin"
