#!/usr/bin/env bash
# Installs what is missing, builds wsync into build/, and shows it working on this machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
cmake -B build -S .
cmake --build build -j "$(nproc)"

if [ -x build/bin/wsync-demo ]; then
    exec build/bin/wsync-demo
fi
# Until the end-to-end demo exists: one sender, two receiver processes, 1 GiB of bf16 weights.
exec build/bin/wsync-bench --scheme ipc --mem host --receivers 2 --bytes 1G
