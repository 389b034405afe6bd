#!/usr/bin/env bash
# Installs what building and testing wsync needs on a Debian or Ubuntu machine, with apt-get.
# Idempotent and quiet: does nothing when every package is there, and runs `apt-get update` only
# when one is missing. Needs root (or sudo) only to install.
set -euo pipefail

packages=(cmake gcc make pkg-config libxxhash-dev libjansson-dev libucx-dev libfabric-dev)

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "setup.sh: not a Debian-like system (no dpkg-query); install these yourself:" \
         "${packages[*]}" >&2
    exit 1
fi

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "setup.sh: missing ${missing[*]}; run as root to install them" >&2
        exit 1
    fi
fi

echo "setup.sh: installing ${missing[*]}" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { "${sudo[@]}" apt-get update -q && \
       "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1
then
    cat "$log" >&2
    echo "setup.sh: apt-get failed installing ${missing[*]}" >&2
    exit 1
fi
