#!/usr/bin/env bash
# Installs what is missing, builds wsync with warnings as errors into build/, and runs every
# CPU test. The exit status is ctest's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
cmake -B build -S . -DWSYNC_WERROR=ON
cmake --build build -j "$(nproc)"
cd build
ctest --output-on-failure
