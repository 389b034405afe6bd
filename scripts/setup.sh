#!/usr/bin/env bash
# Installs what building and testing wsync needs on a Debian or Ubuntu machine, with apt-get.
# Idempotent and quiet: does nothing when every package is there, and runs `apt-get update` only
# when one is missing. Needs root (or sudo) only to install.
#
# clang and its runtime libraries (libclang-rt-<version>-dev: libFuzzer and the sanitizers'
# runtimes, packaged apart from clang on Debian 12) are for the fuzzing stage of scripts/test.sh.
set -euo pipefail

packages=(cmake gcc make pkg-config libxxhash-dev libjansson-dev libucx-dev libfabric-dev clang)

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "setup.sh: not a Debian-like system (no dpkg-query); install these yourself:" \
         "${packages[*]} libclang-rt-<clang's major version>-dev" >&2
    exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
fi
updated=0

# Install the packages named that are not installed yet.
install_missing() {
    local missing=() p log
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] && [ ${#sudo[@]} -eq 0 ]; then
        echo "setup.sh: missing ${missing[*]}; run as root to install them" >&2
        exit 1
    fi
    echo "setup.sh: installing ${missing[*]}" >&2
    log=$(mktemp)
    export DEBIAN_FRONTEND=noninteractive
    if ! { { [ $updated -eq 1 ] || "${sudo[@]}" apt-get update -q; } && \
           "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1
    then
        cat "$log" >&2
        rm -f "$log"
        echo "setup.sh: apt-get failed installing ${missing[*]}" >&2
        exit 1
    fi
    rm -f "$log"
    updated=1
}

install_missing "${packages[@]}"

# libFuzzer and the sanitizer runtimes of the clang just installed: the package carries clang's
# major version in its name (libclang-rt-14-dev for Debian 12's clang 14). Older releases ship
# them inside libclang-common-<version>-dev, which clang already depends on: nothing to add there.
clang_major=$(clang -dumpversion 2>/dev/null | cut -d. -f1)
rt="libclang-rt-${clang_major}-dev"
if [ -n "$clang_major" ] && \
   ! dpkg-query -W -f='${Status}' "$rt" 2>/dev/null | grep -q 'install ok installed'; then
    if [ $updated -eq 0 ] && [ "$(id -u)" -eq 0 -o ${#sudo[@]} -gt 0 ]; then
        "${sudo[@]}" apt-get update -q >/dev/null 2>&1 && updated=1
    fi
    if apt-cache show "$rt" >/dev/null 2>&1; then
        install_missing "$rt"
    fi
fi
