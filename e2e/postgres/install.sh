#!/usr/bin/env bash
# Installs the PostgreSQL 15 server from Debian's packages for the tests of the hub's
# PostgreSQL store and of several hub replicas (e2e/src/postgres.rs), without a system-wide
# install, into
#   ${SCALE_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scale-agent}/postgres/<version>
# (e2e/debian-package.sh does the download, unpacking and caching). `initdb --version` and
# `postgres --version` must run with LD_LIBRARY_PATH pointing at the unpacked libraries.
#
# The tests run bin/initdb and bin/postgres directly: none of postgresql-common's wrappers
# (pg_ctlcluster, perl), no locales (the clusters use the C locale), no tzdata (the server
# runs in GMT, which PostgreSQL knows without zoneinfo files), no ssl-cert. Beside the server
# come the libraries its two binaries link (ldd) that a minimal Debian 12 lacks: libpq5
# (initdb), ICU, libxml2, OpenSSL, Kerberos/GSSAPI and OpenLDAP with their own. The rest
# (zstd, lz4, liblzma, PAM, systemd, gnutls, ...) is in every Debian 12 base system, as apt,
# dpkg and login need it. JIT (libllvm14) is not unpacked: the tests run with jit=off.
#
# Usage: e2e/postgres/install.sh [--print-bin]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../debian-package.sh"

major=15

if [[ ${1:-} == --print-bin ]]; then
  echo "$(debian_cache_root)/postgres/current/usr/lib/postgresql/$major/bin/postgres"
  exit 0
fi

check_postgres() {
  local tree=$1 dirs=() dir library_path built program
  # Debian 12 ships some libraries in /lib/<triple>, most in /usr/lib/<triple>.
  for dir in "$tree"/lib/*-linux-gnu* "$tree"/usr/lib/*-linux-gnu*; do
    [[ -d $dir ]] && dirs+=("$dir")
  done
  library_path=$(IFS=:; echo "${dirs[*]}")
  for program in initdb postgres; do
    built=$(LD_LIBRARY_PATH=$library_path "$tree/usr/lib/postgresql/$major/bin/$program" --version 2>&1) || {
      echo "install.sh: the unpacked $program does not run (missing shared libraries?):" >&2
      echo "$built" >&2
      return 1
    }
  done
  grep -q "(PostgreSQL) $major\." <<<"$built" || { echo "install.sh: postgres --version says: $built" >&2; return 1; }
  # The library directories, relative to the version directory, one a line, for the
  # tests' LD_LIBRARY_PATH.
  printf '%s\n' "${dirs[@]#"$tree"/}" > "$tree/.library-dirs"
  echo "$built"
}

debian_install postgres "usr/lib/postgresql/$major/bin/postgres" check_postgres \
  "postgresql-$major" libpq5 libicu72 libxml2 libssl3 \
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 \
  libldap-2.5-0 libsasl2-2
