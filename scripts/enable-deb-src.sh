#!/usr/bin/env bash
# Makes `apt-get source` work on Debian 12: adds a copy of the Debian sources
# entry with Types: deb-src (from the deb822 file, Debian 12's default, or from
# the `deb` lines of an old-style sources.list) and updates the indexes.
# Does nothing when a deb-src entry already exists. Needs root.
set -euo pipefail
readonly list="/etc/apt/sources.list.d/efa-e2e-deb-src.sources"
say() { echo "enable-deb-src: $*" >&2; }

if grep -qs '^Types:.*deb-src' /etc/apt/sources.list.d/*.sources \
   || grep -qs '^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list; then
  exit 0
fi
main=/etc/apt/sources.list.d/debian.sources
if [ -f "$main" ]; then
  say "enabling source packages in $list"
  sed -e 's/^Types:.*/Types: deb-src/' "$main" > "$list"
elif grep -qs '^deb ' /etc/apt/sources.list; then
  say "enabling source packages in ${list%.sources}.list"
  sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > "${list%.sources}.list"
else
  say "ERROR: neither $main nor deb lines in /etc/apt/sources.list: cannot derive a deb-src entry"
  exit 1
fi
"$(dirname "$0")/apt-get.sh" update -qq || { say "ERROR: apt-get update failed after enabling source packages"; exit 1; }
